#!/bin/sh
# Wrong or late verdicts (issue 14, list 7), each with its expected exit status:
# * layout sizes in 64 bits: tp = pp = 65536 is exit 2 (1 and 2 ranks), not SIGFPE;
# * mode 'distill' without &teacher init is exit 2 naming the key, before anything runs;
# * input errors found while loading (a token outside the vocabulary) leave no out_dir;
# * bit flips in a checkpoint: every one is exit 2 or an exact resume, never 3 or a crash;
# * a data file truncated under the run is exit 3 naming the file (no SIGBUS);
# * SIGTERM while loading stops every rank within 10 s with 143 (not 5: nothing to resume),
#   nothing written.
# The namelist-level items (out_dir = '', a missing metrics directory, a NUL in the file,
# reals that are 0 or inf as a float) are cases of test_bad_input.sh.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
export KDTRAIN_MOD_PATH="$KD_SRCDIR/mod" OMP_NUM_THREADS=1 KDTRAIN_TEST_GEMM_PEAK=1e11
corpus=$KD_SRCDIR/input/corpus/kjv-train.txt
cat > base.nml << EOF2
&run mode = 'train', steps = 2, out_dir = 'out' /
&student card = 'test-student' /
&data format = 'bytes', train = '$corpus', seq_len = 16 /
&parallel micro_batch = 1, global_batch = 2 /
&checkpoint every = 2 /
EOF2
# expect STATUS WORDS NP [overrides]: kdtrain on NP ranks exits STATUS and prints WORDS
expect() {
  want=$1 words=$2 np=$3; shift 3
  rc=0
  timeout 120 $MPIEXEC -n "$np" "$KDTRAIN" base.nml "$@" > log.txt 2>&1 || rc=$?
  [ "$rc" -eq "$want" ] || { cat log.txt; fail "$*: exit $rc, expected $want"; }
  grep -qF -- "$words" log.txt || { cat log.txt; fail "$*: no '$words' in the output"; }
}

echo "== tp * pp in 64 bits"
for np in 1 2; do
  expect 2 "tp * pp = 4294967296 must divide the number of ranks ($np)" $np \
    parallel%tp=65536 parallel%pp=65536 run%out_dir="'ovf'"
  [ ! -e ovf ] || fail "tp=pp=65536 created out_dir"
done

echo "== an empty out_dir"
expect 2 "&run out_dir: empty; expected a directory path" 1 run%out_dir="''"
[ ! -e checkpoints ] || fail "out_dir = '' wrote checkpoints"

echo "== distill without a teacher's weights"
expect 2 "&teacher init: missing: mode 'distill' with a live teacher" 2 run%mode="'distill'" \
  teacher%card="'test-teacher'" run%out_dir="'noinit'"
[ ! -e noinit ] || fail "a distill run without teacher%init created out_dir"

echo "== an input error found while loading leaves no out_dir"
printf 'A\000\042\001' > tok.bin # u16: 65, then 290 (outside test-student's 256)
i=0; while [ $i -lt 40 ]; do printf 'A\000' >> tok.bin; i=$((i + 1)); done
expect 2 "tok.bin: token 290 at token offset 1" 2 data%train="'tok.bin'" data%format="'u16'" \
  run%out_dir="'badtok'"
[ ! -e badtok ] || fail "a bad token file left an out_dir"

echo "== bit flips in a checkpoint: exit 2 or an exact resume"
expect 0 "step 2/2" 1
ck=out/checkpoints/step_00000002.h5
expect 0 "step 3/3" 1 run%out_dir="'ref'" checkpoint%resume="'$ck'" run%steps=3 checkpoint%every=0
ref=$(grep '^step 3/3' log.txt | cut -d'|' -f2-4)
size=$(wc -c < "$ck")
n2=0 n0=0 k=0
# 24 single-bit flips spread over the first 6 KiB (superblock, object headers, attributes,
# /config, /state) and 16 over the rest (tensor data), fixed positions
for pos in $(awk -v s="$size" 'BEGIN { srand(7); for (i = 0; i < 24; i++) print int(rand() * 6144);
                                      for (i = 0; i < 16; i++) print 6144 + int(rand() * (s - 6144)) }'); do
  k=$((k + 1))
  v=$(od -An -v -tu1 -N1 -j "$pos" "$ck" | tr -d ' ')
  # shellcheck disable=SC2059
  printf "\\$(printf %o $((v ^ 8)))" > byte.bin
  cp "$ck" flip.h5
  dd if=byte.bin of=flip.h5 bs=1 seek="$pos" conv=notrunc status=none
  rc=0
  timeout 120 $MPIEXEC -n 1 "$KDTRAIN" base.nml run%out_dir="'f$k'" checkpoint%resume="'flip.h5'" \
    run%steps=3 checkpoint%every=0 > log.txt 2>&1 || rc=$?
  case $rc in
    2) n2=$((n2 + 1)) ;;
    0) [ "$(grep '^step 3/3' log.txt | cut -d'|' -f2-4)" = "$ref" ] ||
         { cat log.txt; fail "flip at byte $pos: exit 0 but a different step 3 (silent wrong load)"; }
       n0=$((n0 + 1)) ;;
    *) cat log.txt; fail "flip at byte $pos: exit $rc, expected 2 or an exact resume" ;;
  esac
  rm -rf "f$k"
done
echo "ok $k bit flips: $n2 refused with exit 2, $n0 harmless (the same step 3 as the intact file)"

echo "== a data file truncated under the run: exit 3 naming it"
cp "$corpus" shrink.txt
rc=0
KDTRAIN_TEST_STEP_DELAY_MS=300 timeout 120 $MPIEXEC -n 2 "$KDTRAIN" base.nml data%train="'shrink.txt'" \
  run%steps=200 checkpoint%every=0 run%out_dir="'shr'" > log.txt 2>&1 &
bg=$!
i=0; until grep -q "^step 2/" log.txt 2> /dev/null; do
  i=$((i + 1)); [ $i -lt 1200 ] || { kill -9 $bg; cat log.txt; fail "no step 2"; }; sleep 0.1; done
: > shrink.txt
wait $bg || rc=$?
[ $rc -eq 3 ] || { cat log.txt; fail "truncated data file: exit $rc, expected 3"; }
grep -q "shrink.txt: the data file changed under the run" log.txt || { cat log.txt; fail "message"; }
echo "ok truncated data file: exit 3, the file named"

echo "== SIGTERM while loading: every rank stops within 10 s, exit 143, nothing written"
"$KDTRAIN" --help > /dev/null
expect 0 "step 2/2" 1 run%out_dir="'tw'" checkpoint%every=0
rc=0
KDTRAIN_TEST_LOAD_DELAY_MS=120000 $MPIEXEC -n 2 "$KDTRAIN" base.nml run%mode="'distill'" \
  teacher%card="'test-student'" teacher%init="'tw/final.h5'" run%out_dir="'sig'" > log.txt 2>&1 &
bg=$!
i=0; until grep -q "loading teacher" log.txt 2> /dev/null; do
  i=$((i + 1)); [ $i -lt 1200 ] || { kill -9 $bg; cat log.txt; fail "no teacher load"; }; sleep 0.1; done
ranks=$(for p in $(pgrep -P $bg); do pgrep -P "$p"; done)
[ -n "$ranks" ] || { kill -9 $bg; fail "no kdtrain ranks under mpiexec"; }
t0=$(date +%s)
kill -TERM $ranks 2> /dev/null || true # as a batch system signals every task
wait $bg || rc=$?
dt=$(($(date +%s) - t0))
[ $dt -le 10 ] || fail "SIGTERM while loading: stopped after $dt s (more than 10)"
[ $rc -eq 143 ] || { cat log.txt; fail "SIGTERM while loading: exit $rc, expected 143"; }
grep -q "SIGTERM before training started (while loading): stopped, nothing written" log.txt ||
  { cat log.txt; fail "SIGTERM while loading: message"; }
[ ! -e sig ] || fail "SIGTERM while loading: out_dir created"
echo "ok SIGTERM while loading: exit 143 in $dt s"
echo "all verdict checks passed"
