#!/bin/bash
# kdtrain under Slurm (doc/user-guide.md, "Batch jobs"). Submit from the run directory:
#
#   sbatch --nodes=2 --ntasks-per-node=4 --gpus-per-task=1 --cpus-per-task=8 \
#          --time=04:00:00 jobs/slurm.sh input.nml [group%key=value ...]
#
# The job's shape comes from the sbatch command line only (no nodes, tasks, GPUs or CPUs
# are set here): with no options it is Slurm's default, one task on one node of the
# default partition, which any cluster accepts. srun starts one MPI job over the
# allocation (--mpi=pmi2 for MPICH, pmix for Open MPI, from the MPI library kdtrain uses;
# SLURM_MPI_TYPE overrides). kdtrain is $KDTRAIN, else the one on PATH (make install),
# else src/kdtrain of the build tree under the submit directory. Its output goes live to
# the job log (--output).
#
# Chaining. Slurm sends SIGUSR1 to this script 900 s before the time limit
# (--signal=B:USR1@900; change the line when a step plus a checkpoint needs longer). The
# script passes it on; kdtrain ends its step, writes a checkpoint, records the stop in
# checkpoint%dir/STOPPED and exits 5 (the record counts when the launcher does not pass
# the 5 on), and the script resubmits itself with the same sbatch options (nodes, tasks,
# CPUs and GPUs per task, memory, time, partition, account, QoS, job name, output file:
# read back with scontrol) and the same input and override words; the next job resumes
# (checkpoint%resume = 'auto'). Only that warning resubmits:
#  * scancel JOB, scancel -s TERM/KILL/USR1 JOB (with or without --full): kdtrain stops
#    (at a checkpoint where it can) and the chain ends;
#  * a file named kdtrain.stop in the submit directory (KD_STOP_FILE) ends the chain at the
#    next warning: touch it, and the running job is the last one;
#  * a job that wrote no checkpoint counts as no progress; after KD_MAX_STALLS (default 2)
#    such jobs in a row the chain ends;
#  * any exit status other than 5 is the job's status and ends the chain (afterok
#    dependencies see it).
#SBATCH --job-name=kdtrain
#SBATCH --signal=B:USR1@900
#SBATCH --output=kdtrain-%j.log
#SBATCH --open-mode=append
set -u
cd "${SLURM_SUBMIT_DIR:-.}" || exit 3
[ $# -ge 1 ] || { echo "usage: sbatch [options] jobs/slurm.sh INPUT.nml [group%key=value ...]" >&2; exit 2; }

if [ -z "${KDTRAIN:-}" ]; then
  if command -v kdtrain > /dev/null 2>&1; then KDTRAIN=$(command -v kdtrain)
  elif [ -x src/kdtrain ]; then KDTRAIN=$PWD/src/kdtrain
  else
    echo "jobs/slurm.sh: no kdtrain in $PWD: set KDTRAIN=/path/to/kdtrain (sbatch --export=ALL,KDTRAIN=...), install it on PATH (make install) or submit from the build tree" >&2
    exit 3 # not 2: the input is fine, the job could not find the program
  fi
fi
[ -x "$KDTRAIN" ] || { echo "jobs/slurm.sh: KDTRAIN=$KDTRAIN is not an executable program" >&2; exit 3; }

# this job as Slurm holds it: the script (Slurm runs a copy from its spool directory)
# and the options to resubmit with
JOBINFO=$(scontrol show job -o "${SLURM_JOB_ID:-none}" 2> /dev/null || true)
field() { printf '%s\n' "$JOBINFO" | tr ' ' '\n' | awk -v k="$1" 'index($0, k "=") == 1 { print substr($0, length(k) + 2); exit }'; }
SCRIPT=${KD_JOB_SCRIPT:-$(field Command)}
[ -n "$SCRIPT" ] && [ -f "$SCRIPT" ] || SCRIPT=jobs/slurm.sh
OPTS=()
opt() { [ -n "$2" ] && [ "$2" != "(null)" ] && [ "$2" != "0" ] && [ "$2" != "N/A" ] && OPTS+=("$1=$2"); }
if [ -n "$JOBINFO" ]; then
  opt --nodes "$(field NumNodes)"
  opt --ntasks "$(field NumTasks)"
  opt --cpus-per-task "$(field CPUs/Task)"
  t=$(field TimeLimit); [ "$t" = UNLIMITED ] || opt --time "$t"
  opt --partition "$(field Partition)"
  opt --account "$(field Account)"
  opt --qos "$(field QOS)"
  opt --job-name "$(field JobName)"
  g=$(field TresPerTask | sed -n 's/.*gpu[:=]\([0-9][0-9]*\).*/\1/p'); opt --gpus-per-task "$g"
  g=$(field TresPerNode | sed -n 's/.*gpu[:=]\(.*\)/\1/p' | cut -d, -f1); opt --gres "${g:+gpu:$g}"
  opt --mem "$(field MinMemoryNode)"
  opt --mem-per-cpu "$(field MinMemoryCPU)"
  out=$(field StdOut)
  [ "$out" = "$PWD/kdtrain-${SLURM_JOB_ID:-}.log" ] || opt --output "$out" # not the default
fi

# one MPI job over the allocation, not N one-rank copies (kdtrain refuses those)
if [ -z "${SLURM_MPI_TYPE:-}" ]; then
  if ldd "$KDTRAIN" 2> /dev/null | grep -q 'libmpi\.so\.40'; then SLURM_MPI_TYPE=pmix # Open MPI
  else SLURM_MPI_TYPE=pmi2; fi # MPICH (Debian's libmpich, Cray MPICH, Intel MPI)
fi
export SLURM_MPI_TYPE
# threads: the user's OMP_NUM_THREADS, else --cpus-per-task where given, else kdtrain's
# share of the node's CPUs (its start line); no OMP_PROC_BIND default: on ranks srun does
# not bind it would put every rank's first thread on the node's first core
[ -z "${SLURM_CPUS_PER_TASK:-}" ] || export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$SLURM_CPUS_PER_TASK}
STOP=${KD_STOP_FILE:-kdtrain.stop}
STALLS=${KD_STALLS:-0}

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
STOPPED=$(stop_record "$@")
[ -z "$STOPPED" ] || rm -f "$STOPPED"

echo "jobs/slurm.sh: job ${SLURM_JOB_ID:-?}: ${SLURM_JOB_NUM_NODES:-?} node(s), ${SLURM_NTASKS:-1} rank(s), threads per rank ${OMP_NUM_THREADS:-as kdtrain chooses}, srun --mpi=$SLURM_MPI_TYPE: $KDTRAIN $*"
LOG=kdtrain-${SLURM_JOB_ID:-$$}.out # kdtrain's output, also kept here for the checks below
: > "$LOG"
pid= warned= cancelled=
pass() { [ -z "$pid" ] || kill -"$1" "$pid" 2> /dev/null; }
trap 'warned=1; echo "jobs/slurm.sh: time-limit warning (SIGUSR1): asking kdtrain to checkpoint and stop"; pass USR1' USR1
trap 'cancelled=1; echo "jobs/slurm.sh: cancelled (SIGTERM): kdtrain checkpoints and stops; the chain ends"; pass TERM' TERM
trap 'cancelled=1; pass INT' INT
exec 3> >(tee -a "$LOG") # live in the job's output and kept in $LOG
teepid=$!
srun --kill-on-bad-exit=1 "$KDTRAIN" "$@" >&3 2>&3 &
pid=$!
status=0
wait $pid || status=$?
while kill -0 $pid 2> /dev/null; do # wait returned early for a trapped signal
  status=0
  wait $pid || status=$?
done
exec 3>&- # tee sees the end of the output; wait until it has written all of it
wait "$teepid" 2> /dev/null || true

# Exit 5: stopped at a checkpoint, whatever the launcher returned when the stop record is
# there; mode 'cache' writes none (it continues its .tmp file), its stop line counts.
if [ "$status" -ne 5 ] && [ -n "$STOPPED" ] && [ -f "$STOPPED" ]; then
  echo "jobs/slurm.sh: the launcher returned $status, but kdtrain's stop record $STOPPED says it stopped at a checkpoint: exit 5"
  status=5
fi
if [ "$status" -eq 0 ] && grep -q '^kdtrain: stopped by signal' "$LOG"; then status=5; fi
[ "$status" -eq 5 ] || exit "$status"
if [ -n "$cancelled" ] || [ -z "$warned" ]; then
  echo "jobs/slurm.sh: kdtrain stopped at a checkpoint (exit 5) on a signal that was not the time-limit warning (scancel): the chain ends"
  exit 5
fi
if [ -e "$STOP" ]; then
  echo "jobs/slurm.sh: $STOP exists: the chain ends here (exit 5; remove it and resubmit to go on)"
  exit 5
fi
if grep -q '^kdtrain: checkpoint .* written' "$LOG"; then STALLS=0; else STALLS=$((STALLS + 1)); fi
if [ "$STALLS" -ge "${KD_MAX_STALLS:-2}" ]; then
  echo "jobs/slurm.sh: $STALLS job(s) in a row wrote no checkpoint: the chain ends (KD_MAX_STALLS)"
  exit 5
fi
echo "jobs/slurm.sh: kdtrain stopped at a checkpoint (exit 5): resubmitting $SCRIPT ${OPTS[*]}"
KD_STALLS=$STALLS sbatch --export=ALL,KD_STALLS="$STALLS" "${OPTS[@]}" "$SCRIPT" "$@" || {
  echo "jobs/slurm.sh: the resubmission failed (above): the chain ends with exit 3; resubmit by hand with the options of this job" >&2
  exit 3
}
exit 5
