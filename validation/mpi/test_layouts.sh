#!/bin/sh
# Layout invariance: every (tp, pp, dp) layout, with and without ZeRO-1, gives the
# single-rank loss and gradient norm at each of 5 steps (fp32, same seed, same
# global batch), for a teacher and a student of different depths and widths (the
# student's 3 layers do not divide by pp = 2, its single kv head is replicated under
# tp = 2, its tied embedding lives on the first and the last stage). Then: memory
# does not grow with the global batch (micro_batch 1, pp 2: 8 vs 512 sequences).
set -eu
export OMP_NUM_THREADS=1 # tiny models; up to 4 ranks share the cores
. "${KD_SRCDIR:?}/validation/lib.sh"

kd_layout_nml "$KD_SRCDIR/input/corpus/kjv-train.txt" # validation/lib.sh; kd's console in log.txt

# same RUN1 RUN2 WHAT: kd_same_metrics (validation/lib.sh) over the 5 steps
same() { kd_same_metrics "$1" "$2" "$3" 5; }

kd_test_teacher
kd 1
for layout in "2 1 1" "1 2 1" "1 1 2" "2 2 1" "2 1 2" "1 2 2" "1 1 4"; do
  for zero in 0 1; do
    set -- $layout
    np=$(($1 * $2 * $3))
    out="l_$1$2$3_z$zero"
    kd "$np" parallel%tp=$1 parallel%pp=$2 parallel%dp=$3 parallel%zero=$zero run%out_dir="'$out'"
    same ref "$out" "tp=$1 pp=$2 dp=$3 zero=$zero" || fail "layout tp=$1 pp=$2 dp=$3 zero=$zero"
    echo "ok tp=$1 pp=$2 dp=$3 zero=$zero"
  done
done

echo "== mode='train' on a mixed layout"
kd 1 run%mode=train run%out_dir="'train1'"
kd 4 run%mode=train parallel%tp=2 parallel%pp=2 parallel%zero=1 run%out_dir="'train4'"
same train1 train4 "train tp=2 pp=2" || fail "mode='train' layout"

echo "== RoPE scaling (teacher llama3, student yarn; 64 positions of an original 16) on tp=2, pp=2"
rope_card() { # NAME FROM RULE...: card FROM of mod/ with the RoPE scaling keys RULE
  name=$1 from=$2
  shift 2
  sed '/^\//d' "$KD_SRCDIR/mod/$from.nml" > "$name.nml"
  printf '  %s\n' "$@" / >> "$name.nml"
}
rope_card rt-teacher test-teacher "rope_type = 'llama3'" "factor = 8.0" "low_freq_factor = 1.0" \
  "high_freq_factor = 4.0" "original_max_position_embeddings = 16"
rope_card rt-student test-student "rope_type = 'yarn'" "factor = 4.0" \
  "original_max_position_embeddings = 16"
rt="teacher%card='rt-teacher.nml' student%card='rt-student.nml' data%seq_len=64"
kd 1 run%mode=train student%card="'rt-teacher.nml'" data%seq_len=64 run%steps=2 \
  run%out_dir="'rt_teacher'"
rt="$rt teacher%init='rt_teacher/final.h5'"
kd 1 $rt run%out_dir="'rt1'"
for layout in "2 1" "1 2"; do
  set -- $layout
  kd 2 $rt parallel%tp=$1 parallel%pp=$2 run%out_dir="'rt_$1$2'"
  same rt1 "rt_$1$2" "RoPE scaling tp=$1 pp=$2" || fail "RoPE scaling layout tp=$1 pp=$2"
  echo "ok RoPE scaling tp=$1 pp=$2"
done

echo "== activation memory independent of the global batch (micro_batch 1, pp 2)"
peaks() { awk '/memory peaks per rank/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print $1, $6 }' log.txt; }
kd 2 parallel%pp=2 parallel%global_batch=8 run%steps=1 run%out_dir="'gb8'"
peaks > gb8.txt
kd 2 parallel%pp=2 parallel%global_batch=512 run%steps=1 run%out_dir="'gb512'"
peaks > gb512.txt
echo "rank  acts(gb=8)  acts(gb=512)"
paste -d' ' gb8.txt gb512.txt | awk '{ print $1, $2, $4 }'
[ "$(wc -l < gb8.txt)" -eq 2 ] || fail "no per-rank memory table"
paste -d' ' gb8.txt gb512.txt | awk '{ r = $4 / $2; if (r > 1.02 || r < 1 / 1.02) bad = 1 } END { exit bad }' \
  || fail "activation peak grows with the global batch"
echo "all layout checks passed"
