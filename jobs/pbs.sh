#!/bin/bash
# kdtrain under PBS Pro / OpenPBS (doc/user-guide.md, "Batch jobs"). Submit from the run
# directory:
#
#   qsub -l select=2:ncpus=32:mpiprocs=4:ngpus=4 -l walltime=04:00:00 \
#        -v KD_INPUT=input.nml,KD_ARGS="optim%lr=1e-4 run%steps=2000" jobs/pbs.sh
#
# (KD_ARGS: the group%key=value override words, separated by spaces; qsub -v splits at
# commas, so a value with a comma goes into the input file instead.) Run directly,
# `bash jobs/pbs.sh input.nml words...` takes them as arguments.
#
# Ranks: one per line of $PBS_NODEFILE (mpiprocs per chunk), or KD_NP. kdtrain is
# $KDTRAIN, else the one on PATH (make install), else src/kdtrain of the build tree
# under the submit directory. Output goes live to the job's output file.
#
# PBS sends SIGTERM at the walltime and SIGKILL after the queue's kill_delay (10 s by
# default): too short for a checkpoint. So this script reads the walltime (qstat) and
# sends kdtrain SIGUSR1 KD_SIGNAL_LEAD seconds (default 900) before it; kdtrain ends its
# step, writes a checkpoint, records the stop in checkpoint%dir/STOPPED and exits 5 (the
# record counts when mpiexec does not pass the 5 on), and the script resubmits itself
# with the same input and words (checkpoint%resume = 'auto' continues). Any other exit status is passed
# on and ends the chain, so afterok dependencies see it.
#PBS -N kdtrain
#PBS -j oe
set -u
cd "${PBS_O_WORKDIR:-.}" || exit 3
INPUT=${KD_INPUT:-${1:-}}
if [ $# -ge 1 ]; then shift; ARGS=("$@"); else read -r -a ARGS <<< "${KD_ARGS:-}"; fi
[ -n "$INPUT" ] || { echo "usage: qsub -v KD_INPUT=input.nml[,KD_ARGS=\"words\"] jobs/pbs.sh" >&2; exit 2; }

if [ -z "${KDTRAIN:-}" ]; then
  if command -v kdtrain > /dev/null 2>&1; then KDTRAIN=$(command -v kdtrain)
  elif [ -x src/kdtrain ]; then KDTRAIN=$PWD/src/kdtrain
  else echo "jobs/pbs.sh: no kdtrain: set KDTRAIN, install it on PATH or submit from the build tree" >&2; exit 2
  fi
fi
SCRIPT=${KD_JOB_SCRIPT:-jobs/pbs.sh}
if [ -n "${KD_NP:-}" ]; then NP=$KD_NP
elif [ -r "${PBS_NODEFILE:-}" ]; then NP=$(grep -c . "$PBS_NODEFILE")
else NP=1
fi
HOSTS=()
[ -r "${PBS_NODEFILE:-}" ] && HOSTS=(-f "$PBS_NODEFILE")
# threads: the user's OMP_NUM_THREADS, else kdtrain's share of the node's CPUs over its
# ranks there (NCPUS is a chunk's, shared by its mpiprocs ranks); no OMP_PROC_BIND default:
# mpiexec does not bind, and every rank's first thread would go to the node's first core
MPIEXEC=${MPIEXEC:-mpiexec}

# kdtrain's stop record (doc/checkpoint.md, "Signals and job scripts"):
# checkpoint%dir/STOPPED, written once a checkpoint on a signal is published. The
# launcher's status may not be 5 (MPICH's mpiexec returned 0 after forwarding a signal:
# measured with -n 1, and with -n 2 after SIGUSR1); the record is there. Removed before
# kdtrain starts: it must be this job's.
stop_record() {
  "$KDTRAIN" --print-config "$@" 2> /dev/null | awk -v q="'" '/^&/ { g = tolower($1) }
    g == "&checkpoint" && $1 == "dir" { s = $0; sub("^[^=]*= *" q, "", s); sub(q "[ ,]*$", "", s)
      gsub(q q, q, s); print s "/STOPPED"; exit }'
}
STOPPED=$(stop_record "$INPUT" "${ARGS[@]}")
[ -z "$STOPPED" ] || rm -f "$STOPPED"

# seconds of walltime (HH:MM:SS, MM:SS or S from qstat) and the warning timer
walltime() {
  qstat -f "${PBS_JOBID:-}" 2> /dev/null | sed -n 's/^ *Resource_List.walltime = //p' \
    | awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; print s }'
}
LEAD=${KD_SIGNAL_LEAD:-900}
WALL=${KD_WALLTIME:-$(walltime)}

echo "jobs/pbs.sh: job ${PBS_JOBID:-?}: $NP rank(s), threads per rank ${OMP_NUM_THREADS:-as kdtrain chooses}, walltime ${WALL:-unknown} s: $KDTRAIN $INPUT ${ARGS[*]}"
LOG=kdtrain-${PBS_JOBID:-$$}.out # kdtrain's output, also kept here for the stop check
: > "$LOG"
pid=
warn() { echo "jobs/pbs.sh: $1: asking kdtrain to checkpoint and stop"; [ -z "$pid" ] || kill -USR1 $pid 2> /dev/null; }
trap 'warn "walltime warning"' USR1
trap 'warn SIGTERM' TERM
exec 3> >(tee -a "$LOG") # live in the job's output and kept in $LOG
teepid=$!
$MPIEXEC -n "$NP" "${HOSTS[@]}" "$KDTRAIN" "$INPUT" "${ARGS[@]}" >&3 2>&3 &
pid=$!
timer=
if [ -n "$WALL" ] && [ "$WALL" -gt 0 ] 2> /dev/null; then
  at=$((WALL - LEAD - SECONDS))
  [ "$at" -gt 0 ] || at=1
  (sleep "$at" && kill -USR1 $$) 3>&- & # not holding tee's pipe open
  timer=$!
fi
status=0
wait $pid || status=$?
while kill -0 $pid 2> /dev/null; do # wait returned early for a trapped signal
  status=0
  wait $pid || status=$?
done
[ -z "$timer" ] || kill "$timer" 2> /dev/null
exec 3>&- # tee sees the end of the output; wait until it has written all of it
wait "$teepid" 2> /dev/null || true

# Exit 5: stopped at a checkpoint, whatever the launcher returned when the stop record is
# there; mode 'cache' writes none (it continues its .tmp file), its stop line counts.
if [ "$status" -ne 5 ] && [ -n "$STOPPED" ] && [ -f "$STOPPED" ]; then
  echo "jobs/pbs.sh: the launcher returned $status, but kdtrain's stop record $STOPPED says it stopped at a checkpoint: exit 5"
  status=5
fi
if [ "$status" -eq 0 ] && grep -q '^kdtrain: stopped by signal' "$LOG"; then status=5; fi
if [ "$status" -eq 5 ]; then
  echo "jobs/pbs.sh: kdtrain stopped at a checkpoint (exit 5): resubmitting $SCRIPT"
  qsub -v "KD_INPUT=$INPUT,KD_ARGS=${ARGS[*]},KD_JOB_SCRIPT=$SCRIPT" "$SCRIPT" || exit 3
fi
exit "$status"
