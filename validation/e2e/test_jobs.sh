#!/bin/sh
# The batch scripts jobs/slurm.sh and jobs/pbs.sh against stand-in sbatch, srun,
# scontrol, qsub, qstat and mpiexec commands on PATH that record what they were asked,
# and a stand-in kdtrain that exits with a chosen status or waits for the warning
# signal and then stops at a "checkpoint" with exit 5 (as kdtrain does):
#  - ranks come from the scheduler (srun gets the allocation; mpiexec -n = lines of
#    $PBS_NODEFILE, with -f), kdtrain from $KDTRAIN or PATH, override words pass through;
#  - output is live: kdtrain's first line is in the job log while it still runs;
#  - the warning signal (SIGUSR1 from Slurm; the PBS script's own timer from the qstat
#    walltime) reaches kdtrain, which exits 5, and the script resubmits itself with the
#    same input and words; any other status is the script's status, with no resubmission;
#  - kdtrain's stop record (checkpoint%dir/STOPPED, found through --print-config) makes a
#    launcher's 0 a 5; a record left by an earlier job is removed before kdtrain starts;
#  - the real kdtrain under the real mpiexec (MPICH's Hydra returns 0 after forwarding a
#    signal to 1 rank, and to 2 after SIGUSR1), -n 1 and -n 2: SIGTERM to pbs.sh and the
#    warning SIGUSR1 to slurm.sh (its srun standing in as mpiexec) end in a checkpoint,
#    the stop record, exit 5 and a resubmission.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
command -v bash > /dev/null || kd_skip "no bash"

mkdir bin rec
R=$PWD/rec
for c in sbatch qsub; do
  printf '#!/bin/sh\necho "$*" > %s/%s.args\n' "$R" "$c" > bin/$c
done
cat > bin/srun <<EOF
#!/bin/sh
echo "\$*" > $R/srun.args
while [ \$# -gt 0 ]; do case \$1 in --*) shift ;; *) break ;; esac; done
exec "\$@"
EOF
cat > bin/mpiexec <<EOF
#!/bin/sh
echo "\$*" > $R/mpiexec.args
while [ \$# -gt 0 ]; do case \$1 in -n|-f) shift 2 ;; *) break ;; esac; done
exec "\$@"
EOF
# scontrol show job -o: the fields slurm.sh resubmits with (as Slurm 22.05 prints them)
printf '#!/bin/sh\necho "JobId=42 JobName=kdtrain Partition=gpu Account=(null) QOS=normal TimeLimit=01:00:00 NumNodes=2 NumCPUs=32 NumTasks=8 CPUs/Task=4 TresPerTask=gres:gpu:1 MinMemoryNode=0 Command=%s/copy-of-slurm.sh StdOut=%s/kdtrain-42.log"\n' "$R" "$PWD" > bin/scontrol
printf '#!/bin/sh\necho "    Resource_List.walltime = 00:00:14"\n' > bin/qstat
cat > bin/kdtrain <<'EOF'
#!/bin/sh
# stand-in kdtrain: FAKE=exit:N exits N; FAKE=wait waits for SIGUSR1/SIGTERM, exits 5
# (the trap is set before the first line: the test signals as soon as it sees that line)
stop() {
  [ -n "${FAKE_NOCKPT:-}" ] || echo "kdtrain: checkpoint out/checkpoints/step_00000003.h5 written in 0.1 s (stopping on a signal)"
  echo "kdtrain: stopped by signal 10 after step 3: exit status 5, resume with the same command"; exit 5
}
case $1 in --print-config) printf "&checkpoint\n  dir = '%s/ck'\n/\n" "$PWD"; exit 0 ;; esac
trap stop USR1 TERM
echo "kdtrain: fake start $*"
echo "kdtrain: fake threads OMP_NUM_THREADS=${OMP_NUM_THREADS:-} OMP_PROC_BIND=${OMP_PROC_BIND:-} OMP_PLACES=${OMP_PLACES:-}"
case $FAKE in
  exit:*) exit "${FAKE#exit:}" ;;
  record) mkdir -p ck && echo "signal 10" > ck/STOPPED && exit 0 ;; # a launcher that says 0
esac
i=0
while [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
exit 9
EOF
chmod +x bin/*
cp "$KD_SRCDIR/jobs/slurm.sh" rec/copy-of-slurm.sh
KDTRAIN_REAL=$KDTRAIN
export PATH="$PWD/bin:$PATH"
REAL_MPIEXEC=$(command -v "${MPIEXEC%% *}")${MPIEXEC#"${MPIEXEC%% *}"} # before bin/ on PATH
unset KDTRAIN MPIEXEC SLURM_MPI_TYPE OMP_NUM_THREADS OMP_PROC_BIND OMP_PLACES
touch in.nml

# slurm STATUS_WANTED: run jobs/slurm.sh as Slurm would
slurm() {
  rm -f rec/*.args
  rc=0
  SLURM_JOB_ID=41 SLURM_SUBMIT_DIR=$PWD SLURM_NTASKS=8 SLURM_JOB_NUM_NODES=2 \
    bash "$KD_SRCDIR/jobs/slurm.sh" in.nml optim%lr=1e-4 run%steps=7 > job.log 2>&1 || rc=$?
  [ "$rc" -eq "$1" ] || { cat job.log; fail "slurm.sh with FAKE=$FAKE: exit $rc, expected $1"; }
}
echo "== Slurm: statuses pass through, no resubmission"
for st in 0 2 3 4; do
  FAKE=exit:$st slurm "$st"
  [ ! -e rec/sbatch.args ] || fail "slurm.sh resubmitted after exit $st"
done
grep -q "^--kill-on-bad-exit=1 $PWD/bin/kdtrain in.nml optim%lr=1e-4 run%steps=7\$" rec/srun.args \
  || { cat rec/srun.args; fail "srun was not asked for kdtrain (from PATH) with the words"; }
grep -q '^kdtrain: fake start in.nml optim%lr=1e-4 run%steps=7$' job.log || fail "no kdtrain output in the log"
# no thread defaults: kdtrain takes its share (binding unbound ranks piles them on core 0)
grep -q '^kdtrain: fake threads OMP_NUM_THREADS= OMP_PROC_BIND= OMP_PLACES=$' job.log ||
  { cat job.log; fail "slurm.sh set thread variables without --cpus-per-task"; }
FAKE=exit:0 SLURM_CPUS_PER_TASK=4 slurm 0
grep -q '^kdtrain: fake threads OMP_NUM_THREADS=4 OMP_PROC_BIND= OMP_PLACES=$' job.log ||
  { cat job.log; fail "slurm.sh: OMP_NUM_THREADS not from --cpus-per-task"; }
FAKE=exit:0 SLURM_CPUS_PER_TASK=4 OMP_NUM_THREADS=3 OMP_PROC_BIND=close slurm 0
grep -q '^kdtrain: fake threads OMP_NUM_THREADS=3 OMP_PROC_BIND=close OMP_PLACES=$' job.log ||
  { cat job.log; fail "slurm.sh: the user's thread variables not passed on"; }
grep -q '^#SBATCH --signal=B:USR1@[0-9]' "$KD_SRCDIR/jobs/slurm.sh" || fail "no --signal=B:USR1@N"
grep -q '^#SBATCH --nodes\|^#SBATCH --ntasks' "$KD_SRCDIR/jobs/slurm.sh" && fail "slurm.sh hard-codes nodes or tasks"
echo "ok"

# signalled SIG [SCRIPT WORDS...]: start SCRIPT (default: slurm.sh in.nml and two words)
# with FAKE=wait, send SIG to it once kdtrain's first line is in the job log (live output),
# expect exit 5
signalled() {
  sig=$1; shift
  [ $# -gt 0 ] || set -- "$KD_SRCDIR/jobs/slurm.sh" in.nml optim%lr=1e-4 run%steps=7
  rm -f rec/*.args
  rm -f job.log # else the wait below can see the last job's line before this job starts
  FAKE=wait SLURM_JOB_ID=42 SLURM_SUBMIT_DIR=$PWD SLURM_NTASKS=8 KDTRAIN=$PWD/bin/kdtrain \
    KDTRAIN_SRC=$KD_SRCDIR bash "$@" > job.log 2>&1 &
  job=$!
  i=0
  until grep -q '^kdtrain: fake start' job.log 2> /dev/null; do
    i=$((i + 1)); [ $i -lt 100 ] || { kill $job; fail "kdtrain's output is not live in the job log"; }
    sleep 0.1
  done
  kill -0 $job || fail "the job ended before the signal"
  kill -"$sig" $job
  rc=0; wait $job || rc=$?
  [ "$rc" -eq 5 ] || { cat job.log; fail "$1 after SIG$sig: exit $rc, expected 5"; }
}
echo "== Slurm: SIGUSR1 -> kdtrain exits 5 -> resubmitted with the same options and words"
signalled USR1
grep -q "^--export=ALL,KD_STALLS=0 --nodes=2 --ntasks=8 --cpus-per-task=4 --time=01:00:00 --partition=gpu --qos=normal --job-name=kdtrain --gpus-per-task=1 $R/copy-of-slurm.sh in.nml optim%lr=1e-4 run%steps=7\$" rec/sbatch.args \
  || { cat job.log rec/sbatch.args; fail "not resubmitted as submitted"; }
echo "ok"
echo "== Slurm: scancel's SIGTERM -> kdtrain exits 5 at a checkpoint, the chain ends"
signalled TERM
[ ! -e rec/sbatch.args ] || { cat job.log; fail "resubmitted after a SIGTERM (scancel)"; }
grep -q "the chain ends" job.log || fail "no word that the chain ends"
echo "ok"
echo "== Slurm: a stop file ends the chain at the warning"
touch kdtrain.stop
signalled USR1
rm kdtrain.stop
[ ! -e rec/sbatch.args ] || { cat job.log; fail "resubmitted despite kdtrain.stop"; }
echo "ok"
echo "== Slurm: the second job in a row without a checkpoint ends the chain"
FAKE_NOCKPT=1 KD_STALLS=1 signalled USR1
[ ! -e rec/sbatch.args ] || { cat job.log; fail "resubmitted after 2 jobs without a checkpoint"; }
grep -q "2 job(s) in a row wrote no checkpoint" job.log || { cat job.log; fail "no stall message"; }
FAKE_NOCKPT=1 signalled USR1
grep -q "^--export=ALL,KD_STALLS=1 " rec/sbatch.args || { cat rec/sbatch.args; fail "the stall count is not passed on"; }
echo "ok"
echo "== the worked examples' job.slurm: jobs/slurm.sh with their input, resubmitting jobs/slurm.sh"
for ex in qwen3-8b-to-0.6b qwen2.5-7b-to-0.5b; do
  signalled USR1 "$KD_SRCDIR/input/$ex/job.slurm" run%steps=7
  grep -q "^kdtrain: fake start $KD_SRCDIR/input/$ex/distill.nml run%steps=7\$" job.log \
    || { cat job.log; fail "$ex/job.slurm: kdtrain not started on its input"; }
  grep -q " $KD_SRCDIR/jobs/slurm.sh $KD_SRCDIR/input/$ex/distill.nml run%steps=7\$" rec/sbatch.args \
    || { cat job.log rec/sbatch.args; fail "$ex/job.slurm: not resubmitted as jobs/slurm.sh with its input"; }
done
echo "ok"

echo "== Slurm: no kdtrain found -> exit 3 with how to point at it (not 2: bad input)"
mkdir -p empty
rc=0
(cd empty && PATH=/usr/bin:/bin SLURM_SUBMIT_DIR=$PWD bash "$KD_SRCDIR/jobs/slurm.sh" in.nml > ../job.log 2>&1) || rc=$?
[ "$rc" -eq 3 ] && grep -q "set KDTRAIN=/path/to/kdtrain" job.log || { cat job.log; fail "no kdtrain: exit $rc"; }
echo "ok"

# pbs STATUS_WANTED: run jobs/pbs.sh as PBS would
printf 'n1\nn1\nn1\nn2\nn2\nn2\n' > nodes
pbs() {
  rm -f rec/*.args
  rc=0
  PBS_JOBID=43.pbs PBS_O_WORKDIR=$PWD PBS_NODEFILE=$PWD/nodes KD_INPUT=in.nml \
    KD_ARGS="optim%lr=1e-4 run%steps=7" KD_SIGNAL_LEAD=10 \
    bash "$KD_SRCDIR/jobs/pbs.sh" > job.log 2>&1 || rc=$?
  [ "$rc" -eq "$1" ] || { cat job.log; fail "pbs.sh with FAKE=$FAKE: exit $rc, expected $1"; }
}
echo "== PBS: statuses pass through, ranks from PBS_NODEFILE, words through -v"
for st in 0 3 4; do
  FAKE=exit:$st pbs "$st"
  [ ! -e rec/qsub.args ] || fail "pbs.sh resubmitted after exit $st"
done
grep -q "^-n 6 -f $PWD/nodes $PWD/bin/kdtrain in.nml optim%lr=1e-4 run%steps=7\$" rec/mpiexec.args \
  || { cat rec/mpiexec.args; fail "mpiexec was not asked for 6 ranks of kdtrain with the words"; }
grep -q '^kdtrain: fake threads OMP_NUM_THREADS= OMP_PROC_BIND= OMP_PLACES=$' job.log ||
  { cat job.log; fail "pbs.sh set thread variables"; }
echo "ok"
echo "== PBS: the script's timer sends SIGUSR1 (walltime 14 s - lead 10 s) -> exit 5 -> qsub"
FAKE=wait pbs 5
grep -q 'walltime warning' job.log || { cat job.log; fail "no walltime warning"; }
grep -q '^-v KD_INPUT=in.nml,KD_ARGS=optim%lr=1e-4 run%steps=7,KD_JOB_SCRIPT=jobs/pbs.sh jobs/pbs.sh$' \
  rec/qsub.args || { cat rec/qsub.args; fail "not resubmitted with the same input and words"; }
echo "ok"
echo "== the stop record: a launcher's 0 is a 5; an earlier job's record does not count"
FAKE=record pbs 5
grep -q "stop record $PWD/ck/STOPPED says it stopped" job.log || { cat job.log; fail "no word of the record"; }
[ -e rec/qsub.args ] || fail "pbs.sh did not resubmit on the stop record"
FAKE=record slurm 5
grep -q "stop record $PWD/ck/STOPPED says it stopped" job.log || { cat job.log; fail "slurm.sh: no word of the record"; }
FAKE=exit:0 pbs 0
[ ! -e ck/STOPPED ] && [ ! -e rec/qsub.args ] || fail "pbs.sh: an earlier job's stop record counted"
mkdir -p ck && echo "signal 10" > ck/STOPPED
FAKE=exit:0 slurm 0
[ ! -e ck/STOPPED ] || fail "slurm.sh: an earlier job's stop record was not removed"
echo "ok"

echo "== the real kdtrain under the real mpiexec: SIGTERM (PBS), SIGUSR1 (Slurm) -> resubmitted"
mkdir real && cd real
cat > in.nml <<EOF2
&run mode = 'train', steps = 500, seed = 1, out_dir = 'o' /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 2 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 16 /
&precision compute = 'fp32' /
EOF2
mkdir bin
cat > bin/srun <<EOF2
#!/bin/sh
while [ \$# -gt 0 ]; do case \$1 in --*) shift ;; *) break ;; esac; done
exec $REAL_MPIEXEC -n "\${SLURM_NTASKS:-1}" "\$@"
EOF2
# PBS signals every process of the job: this mpiexec leaves its PID for the test
cat > bin/mpiexec-pid <<EOF2
#!/bin/sh
echo \$\$ > mpiexec.pid
exec $REAL_MPIEXEC "\$@"
EOF2
chmod +x bin/srun bin/mpiexec-pid
# real SCRIPT NP SIG: jobs/SCRIPT with NP ranks of kdtrain; SIG at the first step to the
# script (pbs: first to mpiexec, as PBS signals the whole job); expects exit 5, a
# resubmission, the checkpoint `latest` names and its stop record
real() {
  rm -rf o "$R"/*.args job.log mpiexec.pid
  export KDTRAIN_TEST_STEP_DELAY_MS=300 OMP_NUM_THREADS=1
  if [ "$1" = pbs ]; then
    PBS_JOBID=44.pbs PBS_O_WORKDIR=$PWD KD_WALLTIME=0 KD_NP=$2 KD_INPUT=in.nml KD_ARGS="run%seed=1" \
      MPIEXEC=$PWD/bin/mpiexec-pid KDTRAIN=$KDTRAIN_REAL bash "$KD_SRCDIR/jobs/pbs.sh" > job.log 2>&1 &
  else
    PATH=$PWD/bin:$PATH SLURM_JOB_ID=45 SLURM_SUBMIT_DIR=$PWD SLURM_NTASKS=$2 KDTRAIN=$KDTRAIN_REAL \
      bash "$KD_SRCDIR/jobs/slurm.sh" in.nml run%seed=1 > job.log 2>&1 &
  fi
  job=$!
  i=0
  until grep -q "^step " job.log 2> /dev/null || ! kill -0 $job 2> /dev/null; do
    i=$((i + 1)); [ $i -lt 600 ] || { kill $job 2> /dev/null || :; cat job.log; fail "$1 -n $2: no step in 60 s"; }
    sleep 0.1
  done
  [ "$1" != pbs ] || kill -"$3" "$(cat mpiexec.pid)" || fail "pbs -n $2: no mpiexec to signal"
  kill -"$3" $job || { cat job.log; fail "$1 -n $2: the job ended before the signal"; }
  rc=0; wait $job || rc=$?
  unset KDTRAIN_TEST_STEP_DELAY_MS
  [ "$rc" -eq 5 ] || { cat job.log; fail "$1.sh, $2 rank(s), SIG$3: exit $rc, expected 5"; }
  [ "$1" = pbs ] && sub=qsub || sub=sbatch
  [ -e "$R/$sub.args" ] || { cat job.log; fail "$1.sh, $2 rank(s), SIG$3: not resubmitted"; }
  [ -f o/checkpoints/STOPPED ] || { cat job.log; fail "$1 -n $2: no stop record"; }
  grep -qx "checkpoint $(cat o/checkpoints/latest)" o/checkpoints/STOPPED ||
    { cat o/checkpoints/STOPPED; fail "$1 -n $2: the record does not name latest's checkpoint"; }
  how=$(grep -o 'the launcher returned [0-9]*' job.log || echo "the launcher returned 5")
  echo "ok $1.sh -n $2 SIG$3: $how, exit 5, resubmitted; $(tr '\n' ' ' < o/checkpoints/STOPPED)"
}
for np in 1 2; do
  real pbs $np TERM
  real slurm $np USR1
done
echo "== a run that starts removes the record; one that ends normally leaves none"
last=$(sed -n 's/^step //p' o/checkpoints/STOPPED)
$REAL_MPIEXEC -n 1 "$KDTRAIN_REAL" in.nml run%steps=$((last + 2)) > run.log 2>&1 ||
  { cat run.log; fail "resume to the end"; }
grep -q "resumed from" run.log || { cat run.log; fail "did not resume"; }
[ ! -e o/checkpoints/STOPPED ] || fail "the stop record outlived the next run"
cd ..
echo "ok"
echo "all job-script checks passed"
