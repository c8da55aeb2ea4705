#!/bin/sh
# Sizing a job before any download: kdtrain --dry-run --without-files [--search]
# (doc/user-guide.md, "How many GPUs do I need?").
#  - with the weights, cache, data and checkpoint files absent, --without-files exits 0 and
#    prints every rank's bytes exactly as the same dry run with the files present, on 1, 4
#    and 8 ranks (tp, pp, zero, bf16), naming the files it did not look at;
#  - without the flag the same input is refused (exit 2) naming the missing file;
#  - a teacher given only by its weights file cannot be planned without the file: exit 2
#    asking for &teacher card;
#  - a cached teacher plans without its cache file;
#  - --search lists only layouts that fit, each with the largest rank the plain dry run of
#    that layout predicts, the first choice for speed said first, then fastest first; with no
#    memory to fit in it is exit 2;
#  - --without-files and --search without --dry-run are refused.
set -eu
export OMP_NUM_THREADS=1
. "${KD_SRCDIR:?}/validation/lib.sh"

cat > present.nml <<EOF2
&run mode = 'distill', steps = 1, seed = 3, out_dir = 'o' /
&teacher card = 'test-teacher', init = 't/final.h5' /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 8 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 16 /
&loss kind = 'fkl', alpha = 0.5 /
&optim lr = 1e-2, warmup = 1 /
&precision compute = 'fp32' /
EOF2
sed -e "s|init = 't/final.h5'|init = 'nowhere/teacher.h5'|" \
  -e "s|train = '[^']*'|train = 'nowhere/train', valid = 'nowhere/valid'|" present.nml > absent.nml

echo "== a teacher to distil from"
$MPIEXEC -n 1 "$KDTRAIN" present.nml run%mode=train student%card=test-teacher run%out_dir="'t'" \
  > log.txt 2>&1 || { cat log.txt; fail "teacher"; }

# rows FILE: the per-rank table of a dry run's output
rows() { awk '/^  rank/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print } /^  per pipeline/ { on = 0 }' "$1"; }

echo "== the same bytes per rank with and without the files"
for layout in "1" "4 parallel%tp=2 parallel%pp=2" "4 parallel%tp=2 parallel%zero=1 precision%compute='bf16'" \
  "8 parallel%pp=2 parallel%zero=1 memory%recompute='full' memory%offload=.true."; do
  set -- $layout
  N=$1; shift
  "$KDTRAIN" --dry-run --bytes --ranks "$N" present.nml "$@" > with.txt 2>&1 || { cat with.txt; fail "dry run with files: $layout"; }
  "$KDTRAIN" --dry-run --bytes --without-files --ranks "$N" absent.nml "$@" > without.txt 2>&1 \
    || { cat without.txt; fail "--without-files: $layout"; }
  rows with.txt > a.txt
  rows without.txt > b.txt
  [ "$(wc -l < a.txt)" -eq "$N" ] || { cat with.txt; fail "no per-rank table: $layout"; }
  cmp -s a.txt b.txt || { paste a.txt b.txt; fail "--without-files changed the plan: $layout"; }
  grep -q "not looked at (--without-files): teacher%init '[^']*nowhere/teacher.h5', data%train '[^']*nowhere/train', data%valid" without.txt \
    || { cat without.txt; fail "the unopened files are not named"; }
  echo "ok $N rank(s) $*"
done

echo "== without the flag: the missing file, exit 2"
rc=0
"$KDTRAIN" --dry-run --bytes --ranks 4 absent.nml > out.txt 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "absent.nml:5: &data train: data file '.*nowhere/train' not found" out.txt \
  || { cat out.txt; fail "missing data file: rc $rc"; }
rc=0
"$KDTRAIN" --dry-run --bytes absent.nml data%train="'$KD_SRCDIR/input/corpus/kjv-train.txt'" data%valid="''" > out.txt 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "&teacher init: weights file '.*nowhere/teacher.h5' not found" out.txt \
  || { cat out.txt; fail "missing weights file: rc $rc"; }
echo "ok refused, naming the file"

echo "== a teacher known only by its weights file needs a card"
rc=0
"$KDTRAIN" --dry-run --bytes --without-files absent.nml teacher%card="''" > out.txt 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "&teacher init: --without-files opens no weights file.*expected &teacher card" out.txt \
  || { cat out.txt; fail "teacher without card: rc $rc"; }
echo "ok exit 2, asks for the card"

echo "== a cached teacher without its cache file"
"$KDTRAIN" --dry-run --bytes --without-files absent.nml teacher%source="'cache'" teacher%cache="'nowhere/c.h5'" \
  > out.txt 2>&1 || { cat out.txt; fail "cached teacher"; }
grep -q "teacher%cache '[^']*nowhere/c.h5'" out.txt && grep -q "the data was not opened" out.txt \
  || { cat out.txt; fail "cache line"; }
echo "ok"

echo "== --search: the layouts that fit, as the dry run of each plans it"
"$KDTRAIN" --dry-run --bytes --without-files --search --ranks 8 --device-mem 3MiB absent.nml > s.txt 2>&1 \
  || { cat s.txt; fail "search"; }
awk '$1 ~ /^[0-9]+$/ && NF == 10' s.txt > fits.txt
[ -s fits.txt ] || { cat s.txt; fail "no layout listed"; }
n=0
while read -r tp pp dp micro rc mb need unit head hunit; do
  "$KDTRAIN" --dry-run --bytes --ranks 8 present.nml parallel%tp="$tp" parallel%pp="$pp" \
    parallel%micro_batch="$micro" memory%recompute="$rc" > one.txt 2>&1 || { cat one.txt; fail "layout $tp $pp $micro $rc"; }
  got=$(sed -n 's/.*largest rank: [0-9]* ([^)]*): \([0-9.]* [A-Za-z]*\) |.*/\1/p' one.txt)
  want="$need $unit"
  [ "$got" = "$want" ] || { cat one.txt; fail "search says $want for tp=$tp pp=$pp micro=$micro $rc, the dry run $got"; }
  n=$((n + 1))
done < fits.txt
# fastest first by the guess (model-parallel ranks, then recompute, then the larger
# micro-batch), equal guesses with the most headroom first; the first choice is the first row
awk '{ r = $5 == "none" ? 0 : $5 == "selective" ? 1 : 2; c = ($1 * $2 * 3 + r) * 1e9 - $4
       v = $7 * ($8 == "KiB" ? 1024 : $8 == "MiB" ? 1048576 : $8 == "GiB" ? 1073741824 : 1)
       if (NR > 1 && (c < lc || (c == lc && v < lv))) bad = 1; lc = c; lv = v } END { exit bad }' fits.txt \
  || { cat fits.txt; fail "not ordered fastest first"; }
read -r tp pp dp micro rc rest < fits.txt
grep -q "of [0-9]* layouts the run accepts fit" s.txt \
  && grep -q "first choice for speed .*: tp = $tp, pp = $pp, micro_batch = $micro, recompute = '$rc'" s.txt \
  || { cat s.txt; fail "summary"; }
[ "$(grep -n "first choice for speed" s.txt | cut -d: -f1)" -lt "$(grep -n "layouts the run accepts fit" s.txt | cut -d: -f1)" ] \
  || { cat s.txt; fail "the first choice is not said first"; }
echo "ok $n layouts, each as its own dry run plans it"
rc=0
"$KDTRAIN" --dry-run --bytes --search --ranks 8 present.nml > out.txt 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "no memory to fit in" out.txt || { cat out.txt; fail "search without memory: rc $rc"; }

echo "== the flags need --dry-run"
for f in --without-files --search --bytes; do
  rc=0
  "$KDTRAIN" "$f" present.nml > out.txt 2>&1 || rc=$?
  [ "$rc" -eq 2 ] && grep -q "add --dry-run" out.txt || { cat out.txt; fail "$f alone: rc $rc"; }
done
echo "ok"
