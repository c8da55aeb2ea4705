#!/bin/bash
# kdtrain under Slurm (doc/user-guide.md, "Batch jobs"). Submit from the run directory:
#
#   sbatch --nodes=2 --ntasks-per-node=4 --gpus-per-task=1 --cpus-per-task=8 \
#          --time=04:00:00 jobs/slurm.sh input.nml [group%key=value ...]
#
# Nodes, ranks, GPUs and CPUs come from the sbatch command line (or #SBATCH lines you
# add below); srun starts one kdtrain per task of the allocation. kdtrain is $KDTRAIN,
# else the one on PATH (make install), else src/kdtrain of the build tree under the
# submit directory. Output goes live to the job log (--output).
#
# Slurm sends SIGUSR1 to this script 900 s before the time limit (--signal=B:USR1@900;
# change both the line and KD_SIGNAL_LEAD when a step plus a checkpoint needs longer).
# The script passes it to kdtrain, which ends its step, writes a checkpoint and exits 5;
# then the script resubmits itself with the same arguments and the next job resumes
# (checkpoint%resume = 'auto'). Any other exit status is passed on and ends the chain,
# so afterok dependencies see it.
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
  else echo "jobs/slurm.sh: no kdtrain: set KDTRAIN, install it on PATH or submit from the build tree" >&2; exit 2
  fi
fi
# this script, for the resubmission (Slurm runs a copy of it from its spool directory)
SCRIPT=${KD_JOB_SCRIPT:-}
if [ -z "$SCRIPT" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
  SCRIPT=$(scontrol show job "$SLURM_JOB_ID" 2> /dev/null | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')
fi
[ -n "$SCRIPT" ] && [ -f "$SCRIPT" ] || SCRIPT=jobs/slurm.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
export OMP_PROC_BIND=${OMP_PROC_BIND:-close} OMP_PLACES=${OMP_PLACES:-cores}
export SLURM_MPI_TYPE=${SLURM_MPI_TYPE:-pmi2} # one MPICH job, not N one-rank copies

echo "jobs/slurm.sh: job ${SLURM_JOB_ID:-?}: ${SLURM_JOB_NUM_NODES:-?} node(s), ${SLURM_NTASKS:-?} rank(s), $OMP_NUM_THREADS thread(s) each: $KDTRAIN $*"
LOG=kdtrain-${SLURM_JOB_ID:-$$}.out # kdtrain's output, also kept here for the stop check
: > "$LOG"
pid=
trap 'echo "jobs/slurm.sh: warning signal: asking kdtrain to checkpoint and stop"; [ -z "$pid" ] || kill -USR1 $pid 2> /dev/null' USR1 TERM
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

# Exit 5: stopped at a checkpoint. A launcher that forwards a signal may report 0, so the
# line kdtrain prints when it stops counts too.
if [ "$status" -eq 0 ] && grep -q '^kdtrain: stopped by signal' "$LOG"; then status=5; fi
if [ "$status" -eq 5 ]; then
  echo "jobs/slurm.sh: kdtrain stopped at a checkpoint (exit 5): resubmitting $SCRIPT"
  sbatch "$SCRIPT" "$@" || exit 3
fi
exit "$status"
