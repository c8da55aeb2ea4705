#!/bin/bash
# kdtrain under Slurm. Submit from the top of the tree:  sbatch jobs/slurm.sh input.nml
# Slurm sends SIGUSR1 (--signal) some minutes before the walltime; kdtrain then
# finishes its step, writes a checkpoint and exits 5, and this script resubmits
# itself; the next job resumes from the latest checkpoint (checkpoint%resume='auto').
#SBATCH --job-name=kdtrain
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-task=1
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --output=kdtrain-%j.log
set -u
cd "${SLURM_SUBMIT_DIR:-.}"
INPUT=${1:-input.nml}
shift || true
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}

# forward the batch system's warning to the job step, wait for it to finish
LOG=kdtrain-${SLURM_JOB_ID:-$$}.out
srun --kill-on-bad-exit=1 ./src/kdtrain "$INPUT" "$@" > "$LOG" 2>&1 &
pid=$!
trap 'kill -USR1 $pid 2>/dev/null' USR1 TERM
wait $pid; status=$?
while kill -0 $pid 2>/dev/null; do wait $pid; status=$?; done
cat "$LOG"

# Exit 5 means "stopped at a checkpoint". Some launchers (MPICH's mpiexec) return 0
# after forwarding a signal, so the line kdtrain prints when it stops counts too.
if [ "$status" -eq 5 ] || { [ "$status" -eq 0 ] && grep -q '^kdtrain: stopped by signal' "$LOG"; }; then
  echo "kdtrain stopped at a checkpoint (exit 5): resubmitting"
  sbatch jobs/slurm.sh "$INPUT" "$@"
fi
exit "$status"
