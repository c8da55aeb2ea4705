#!/bin/bash
# kdtrain under PBS Pro / OpenPBS. Submit:  qsub -v INPUT=input.nml jobs/pbs.sh
# PBS sends SIGTERM before killing a job at its walltime; kdtrain finishes its step,
# writes a checkpoint and exits 5, and the job is resubmitted; the next job resumes
# from the latest checkpoint (checkpoint%resume='auto').
#PBS -N kdtrain
#PBS -l select=2:ncpus=32:mpiprocs=4:ngpus=4
#PBS -l walltime=04:00:00
#PBS -j oe
set -u
cd "${PBS_O_WORKDIR:-.}"
INPUT=${INPUT:-input.nml}
NP=$(wc -l < "${PBS_NODEFILE:-/dev/null}" 2>/dev/null || echo 1)
[ "$NP" -gt 0 ] || NP=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

LOG=kdtrain-${PBS_JOBID:-$$}.out
mpiexec -n "$NP" ./src/kdtrain "$INPUT" > "$LOG" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null' TERM USR1
wait $pid; status=$?
while kill -0 $pid 2>/dev/null; do wait $pid; status=$?; done
cat "$LOG"

# Exit 5 means "stopped at a checkpoint". Some launchers (MPICH's mpiexec) return 0
# after forwarding a signal, so the line kdtrain prints when it stops counts too.
if [ "$status" -eq 5 ] || { [ "$status" -eq 0 ] && grep -q '^kdtrain: stopped by signal' "$LOG"; }; then
  echo "kdtrain stopped at a checkpoint (exit 5): resubmitting"
  qsub -v INPUT="$INPUT" jobs/pbs.sh
fi
exit "$status"
