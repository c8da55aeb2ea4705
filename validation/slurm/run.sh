#!/bin/bash
# jobs/slurm.sh under a real Slurm (issue 18's acceptance): starts a single-node Slurm
# (slurm-up.sh, as root), runs the scenarios below with the real sbatch, srun, scancel and
# scontrol, prints each outcome, stops the daemons it started (slurm-down.sh) and exits 0
# only when every scenario held. Run from the build tree (it needs src/kdtrain):
#
#   sudo validation/slurm/run.sh            # about 4 minutes on 2 cores
#
# Scenarios (doc/user-guide.md, "Batch jobs", has the outcomes):
#  1. sbatch jobs/slurm.sh input/quickstart/teacher.nml run%steps=40 checkpoint%every=10,
#     no other option: COMPLETED, exit 0, kdtrain's output in the job log while it runs;
#  2. --nodes=1 --ntasks=2: one 2-rank job, one final.h5;
#  3. the same srun without the MPI plugin (SLURM_MPI_TYPE=none): kdtrain refuses the two
#     1-rank copies, ExitCode 2;
#  4. scancel --signal=USR1 --batch: checkpoint, exit 5, resubmitted with the same options
#     and words, resumed, finished;
#  5. plain scancel and scancel -s KILL: the chain ends, no new job within 60 s;
#  6. a stop file: the warning ends the chain instead of resubmitting;
#  7. submitted from another directory: without KDTRAIN a message saying how to point at
#     kdtrain and exit 3 (not 2, bad input); with KDTRAIN it completes.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
TREE=$(cd "$HERE/../.." && pwd)
[ -x "$TREE/src/kdtrain" ] || { echo "run.sh: build kdtrain first (src/kdtrain)" >&2; exit 2; }
sh "$HERE/slurm-up.sh" || exit 3
W=$(mktemp -d /tmp/kd-slurm-run.XXXXXX)
trap 'sh "$HERE/slurm-down.sh"' EXIT
cd "$TREE" || exit 3
export KDTRAIN_MOD_PATH=$TREE/mod OMP_NUM_THREADS=1
nbad=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; nbad=$((nbad + 1)); }
jobid() { sed -n 's/^Submitted batch job \([0-9]*\)$/\1/p'; }
state() { scontrol show job -o "$1" 2> /dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }
# wait_end JOB [SECONDS]: until the job has left the queue's active states
wait_end() {
  i=0
  while :; do
    s=$(state "$1" JobState)
    case $s in PENDING | RUNNING | CONFIGURING | COMPLETING | SUSPENDED | "") ;; *) return 0 ;; esac
    i=$((i + 1)); [ $i -lt "${2:-600}" ] || { echo "job $1 still $s"; return 1; }
    sleep 1
  done
}
# wait_log FILE PATTERN [SECONDS]
wait_log() {
  i=0
  until grep -q "$2" "$1" 2> /dev/null; do
    i=$((i + 1)); [ $i -lt "${3:-300}" ] || return 1; sleep 1
  done
}
newer_jobs() { squeue -h -o %i | awk -v j="$1" '$1 > j' | wc -l; }
sub() { sbatch "$@" | jobid; }
T=input/quickstart/teacher.nml

echo "== 1. no sbatch options: COMPLETED, exit 0, output live"
j=$(sub jobs/slurm.sh $T run%steps=40 checkpoint%every=10 run%out_dir="'$W/s1'")
live=no
wait_log "kdtrain-$j.log" '^step 1/40' 300 && [ "$(state "$j" JobState)" = RUNNING ] && live=yes
wait_end "$j"
st=$(state "$j" JobState) ec=$(state "$j" ExitCode)
if [ "$st" = COMPLETED ] && [ "$ec" = 0:0 ] && [ $live = yes ] && [ -s "$W/s1/final.h5" ]; then
  ok "1: job $j $st ExitCode=$ec, step 1 in the log while RUNNING, final.h5 written"
else bad "1: job $j $st ExitCode=$ec live=$live"; tail -5 "kdtrain-$j.log"; fi

echo "== 2. --nodes=1 --ntasks=2: one 2-rank job"
j=$(sub --nodes=1 --ntasks=2 jobs/slurm.sh $T run%steps=20 run%out_dir="'$W/s2'")
wait_end "$j"
st=$(state "$j" JobState) ec=$(state "$j" ExitCode)
if [ "$st" = COMPLETED ] && grep -q '| 2 rank(s): tp=1 pp=1 dp=2' "kdtrain-$j.log" &&
   [ "$(grep -c '^kdtrain: mode train' "kdtrain-$j.log")" = 1 ] && [ -s "$W/s2/final.h5" ]; then
  ok "2: job $j $st, one start line saying 2 rank(s) (dp=2), one final.h5"
else bad "2: job $j $st ExitCode=$ec"; tail -5 "kdtrain-$j.log"; fi

echo "== 3. srun without the MPI plugin: refused, exit 2"
j=$(SLURM_MPI_TYPE=none sub --nodes=1 --ntasks=2 jobs/slurm.sh $T run%steps=20 run%out_dir="'$W/s3'")
wait_end "$j"
ec=$(state "$j" ExitCode)
if [ "$ec" = 2:0 ] && grep -q 'MPI made each of them a 1-rank job' "kdtrain-$j.log" && [ ! -e "$W/s3" ]; then
  ok "3: job $j ExitCode=$ec: 'the launcher started 2 tasks, but MPI made each of them a 1-rank job', nothing written"
else bad "3: job $j ExitCode=$ec"; tail -5 "kdtrain-$j.log"; fi

echo "== 4. scancel --signal=USR1 --batch: checkpoint, exit 5, resubmitted as submitted, finished"
j=$(KDTRAIN_TEST_STEP_DELAY_MS=400 sub --ntasks=1 --cpus-per-task=1 --time=00:30:00 jobs/slurm.sh $T \
  run%steps=30 log%every=1 checkpoint%every=100 run%out_dir="'$W/s4'")
wait_log "kdtrain-$j.log" '^step 3/30' 300 || bad "4: no step 3"
scancel --signal=USR1 --batch "$j"
wait_end "$j"
ec=$(state "$j" ExitCode)
j2=$(sed -n 's/^Submitted batch job \([0-9]*\)$/\1/p' "kdtrain-$j.log" | head -n 1)
if [ "$ec" = 5:0 ] && [ -n "$j2" ]; then
  wait_end "$j2"
  cmd=$(scontrol show job "$j2" | sed -n 's/^ *Command=//p')
  tl=$(state "$j2" TimeLimit) nt=$(state "$j2" NumTasks)
  if [ "$(state "$j2" JobState)" = COMPLETED ] && grep -q "resumed from .*step_" "kdtrain-$j2.log" &&
     grep -q '^step 30/30' "kdtrain-$j2.log" && [ "$tl" = 00:30:00 ] && [ "$nt" = 1 ] &&
     grep -q "run%out_dir='$W/s4'" "kdtrain-$j2.log"; then
    ok "4: job $j ExitCode=$ec -> job $j2 (TimeLimit $tl, NumTasks $nt, the same words) resumed and COMPLETED step 30"
  else bad "4: job $j2: $(state "$j2" JobState) TimeLimit=$tl NumTasks=$nt"; tail -5 "kdtrain-$j2.log"; fi
else bad "4: job $j ExitCode=$ec, resubmitted as '$j2'"; tail -8 "kdtrain-$j.log"; fi

echo "== 5. plain scancel and scancel -s KILL end the chain"
ja=$(KDTRAIN_TEST_STEP_DELAY_MS=400 sub jobs/slurm.sh $T run%steps=400 log%every=1 checkpoint%every=2 run%out_dir="'$W/s5a'")
jb=$(KDTRAIN_TEST_STEP_DELAY_MS=400 sub jobs/slurm.sh $T run%steps=400 log%every=1 checkpoint%every=2 run%out_dir="'$W/s5b'")
wait_log "kdtrain-$ja.log" '^step 3/400' 300 && wait_log "kdtrain-$jb.log" '^step 3/400' 300 || bad "5: no step 3"
scancel "$ja"
scancel -s KILL "$jb"
wait_end "$ja" 120; wait_end "$jb" 120
sleep 60
n=$(newer_jobs "$jb")
if [ "$n" = 0 ] && ! grep -q '^Submitted batch job' "kdtrain-$ja.log" "kdtrain-$jb.log"; then
  ok "5: scancel: job $ja $(state "$ja" JobState); scancel -s KILL: job $jb $(state "$jb" JobState); no new job in 60 s"
else bad "5: $n new job(s)"; squeue; fi
scancel --user="$(id -un)" 2> /dev/null

echo "== 6. a stop file: the warning ends the chain"
touch kdtrain.stop
j=$(KDTRAIN_TEST_STEP_DELAY_MS=400 sub jobs/slurm.sh $T run%steps=400 log%every=1 checkpoint%every=100 run%out_dir="'$W/s6'")
wait_log "kdtrain-$j.log" '^step 3/400' 300 || bad "6: no step 3"
scancel --signal=USR1 --batch "$j"
wait_end "$j"
rm -f kdtrain.stop
if [ "$(state "$j" ExitCode)" = 5:0 ] && grep -q 'kdtrain.stop exists: the chain ends' "kdtrain-$j.log" &&
   ! grep -q '^Submitted batch job' "kdtrain-$j.log"; then
  ok "6: job $j exit 5 at a checkpoint, not resubmitted (kdtrain.stop)"
else bad "6: job $j ExitCode=$(state "$j" ExitCode)"; tail -5 "kdtrain-$j.log"; fi

echo "== 7. submitted from another directory"
mkdir -p "$W/elsewhere" && cd "$W/elsewhere" || exit 3
j=$(env -u KDTRAIN PATH=/usr/bin:/bin sbatch "$TREE/jobs/slurm.sh" "$TREE/$T" run%steps=5 | jobid)
wait_end "$j"
ec=$(state "$j" ExitCode)
if [ "$ec" = 3:0 ] && grep -q 'no kdtrain in .*set KDTRAIN=' "kdtrain-$j.log"; then
  ok "7a: without KDTRAIN: ExitCode=$ec, 'no kdtrain in $W/elsewhere: set KDTRAIN=/path/to/kdtrain ...'"
else bad "7a: job $j ExitCode=$ec"; cat "kdtrain-$j.log"; fi
j=$(KDTRAIN=$TREE/src/kdtrain sbatch "$TREE/jobs/slurm.sh" "$TREE/$T" run%steps=5 run%out_dir="'$W/s7'" \
  data%train="'$TREE/input/corpus/kjv-train.txt'" data%valid="'$TREE/input/corpus/kjv-valid.txt'" | jobid)
wait_end "$j"
if [ "$(state "$j" JobState)" = COMPLETED ] && [ -s "$W/s7/final.h5" ]; then
  ok "7b: with KDTRAIN: job $j COMPLETED"
else bad "7b: job $j $(state "$j" JobState) $(state "$j" ExitCode)"; tail -5 "kdtrain-$j.log"; fi
cd "$TREE" || exit 3

echo "validation/slurm/run.sh: $nbad scenario(s) failed; job logs kdtrain-*.log in $TREE"
rm -rf "$W"
[ $nbad -eq 0 ]
