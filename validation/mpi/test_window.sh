#!/bin/sh
# Sliding-window attention through the kdtrain binary: a Qwen2 teacher with
# use_sliding_window and max_window_layers 1 (layer 0 full attention, layers 1 and 2 a
# window of 5) distilled into a Qwen3 student whose layer_types window layer 0 (4 tokens)
# and not layers 1 and 2, on 16-token sequences (windows shorter than the sequence), both
# with 3 layers (uneven over pp = 2: a stage that took its local layer index for the global
# one would window the wrong layers, and the pp layouts would differ):
#  - the windows change the losses (the same run without them differs);
#  - tp 2, pp 2 and tp 2 x pp 2 with ZeRO-1 give the one-rank loss and gradient norm
#    within 1e-5 at each of 3 steps (each stage windows its own global layers);
#  - recompute full/selective and offload give bitwise the losses of recompute 'none',
#    in fp32 and in bf16;
#  - --dry-run equals the measured peaks to the byte on 1, 2 and 4 ranks;
#  - a weights file keeps its windows: the teacher's loads with a card that gives the same
#    windows in other keys (layer_types), the student's is refused, naming the layer, with
#    another window;
#  - kdconvert to-hf refuses a llama card whose window differs between layers (no
#    transformers model_type computes it) and writes nothing.
set -eu
export OMP_NUM_THREADS=1 # tiny models; up to 4 ranks share the cores
. "${KD_SRCDIR:?}/validation/lib.sh"

kd_family_nml test-sw-teacher test-sw-student

echo "== a windowed Qwen2 teacher (2 steps)"
kd 1 run%mode=train student%card=test-sw-teacher run%steps=2 run%out_dir="'teacher'"

echo "== the windows matter"
kd 1
grep -v '^  \(use_sliding_window\|sliding_window\|layer_types\)' \
  "$KD_SRCDIR/mod/test-sw-student.nml" > full.nml
kd 1 student%card="'full.nml'" run%out_dir="'full'"
kd_cols ref > a.txt
kd_cols full > b.txt
[ -s a.txt ] && ! cmp -s a.txt b.txt || { paste a.txt b.txt; fail "the student's windows change nothing"; }
echo "ok the student without its windows gives other losses"

echo "== layouts: the one-rank losses and gradient norms"
kd_family_layouts

echo "== memory policies: the same losses, the plan to the byte"
kd_family_memory

echo "== the weights file keeps the windows"
valid="data%valid='$KD_SRCDIR/input/corpus/kjv-valid.txt'"
# the teacher's windows given by layer_types instead of max_window_layers: the same model
sed "s/^  max_window_layers = 1$/  layer_types = 'full_attention', 2*'sliding_attention'/" \
  "$KD_SRCDIR/mod/test-sw-teacher.nml" > same.nml
grep -q "^  layer_types" same.nml || fail "same.nml: no layer_types"
kd 1 teacher%card="'same.nml'" run%steps=1 run%out_dir="'same'"
[ "$(kd_cols same)" = "$(kd_cols ref | head -n 1)" ] || { kd_cols same; kd_cols ref; fail "same windows, other losses"; }
sed 's/^  sliding_window = 4$/  sliding_window = 6/' "$KD_SRCDIR/mod/test-sw-student.nml" > other.nml
rc=0
$MPIEXEC -n 1 "$KDTRAIN" base.nml run%mode=eval student%card="'other.nml'" \
  student%init="'ref/final.h5'" "$valid" run%out_dir="'other'" > err.txt 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q 'the sliding window of layer 0 is 4 in its /config but 6' err.txt \
  || { cat err.txt; fail "a window of 6 loaded a file of window 4: exit $rc"; }
echo "ok the teacher's file loads with its windows in other keys (the same loss), the student's is refused with another window (layer 0: 4 vs 6)"

echo "== to-hf: a llama card with windows in some layers only"
cat > mixed.nml <<EOF2
&model
  arch = 'llama'
  vocab_size = 256
  hidden_size = 16
  intermediate_size = 32
  num_hidden_layers = 2
  num_attention_heads = 2
  num_key_value_heads = 1
  sliding_window = 3
  layer_types = 'full_attention', 'sliding_attention'
/
EOF2
kd 1 run%mode=train student%card="'mixed.nml'" run%steps=1 run%out_dir="'mixed'"
rc=0
"$(dirname "$KDTRAIN")/tools/kdconvert" to-hf mixed/final.h5 mixed_hf > err.txt 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q 'differs between layers' err.txt && [ ! -e mixed_hf ] \
  || { cat err.txt; fail "to-hf of a llama card with mixed windows: exit $rc"; }
echo "ok to-hf refuses it (exit 2, nothing written)"
echo "all sliding-window checks passed"
