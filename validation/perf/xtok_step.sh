#!/bin/sh
# The cost of the cross-tokenizer loss (loss%kind = 'uld') per step: alignment, the gathered
# rows' logits, the softmax and the sorts of both vocabularies on the host. Random models with
# the real families' vocabulary widths (a Qwen3-shaped teacher of 151,936 ids, a Llama-shaped
# student of 128,256; hidden 64 and 48, so the loss dominates) and two tokenizers trained by
# `tokenizers` (validation/ref/xtok_ref.py make WORK bench), 64 chat exchanges of up to 60
# words prepared by kdprep --teacher-tokenizer, packed in windows of 512 tokens, 4 windows per
# step. Prints, per precision and thread count, the means over steps 2..5 of the step's
# seconds, the loss's seconds and share, the aligned groups and microseconds per group, and
# the same step with plain ULD against the hybrid.
#   sh validation/perf/xtok_step.sh [WORKDIR]     (from the build tree root, after make)
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
py=${KD_PYTHON:-$src/.venv/bin/python}
work=${1:-out/perf/xtok}
mkdir -p "$work"
work=$(cd "$work" && pwd)
cd "$work"
if [ ! -f bench_offsets.idx ]; then
  "$py" "$src/validation/ref/xtok_ref.py" make "$work" bench
  for r in teacher student; do "$src/src/tools/kdconvert" from-hf "hf_$r" "$r.h5" > /dev/null; done
  "$py" "$src/src/tools/kdprep.py" --no-progress --input bench.jsonl --chat --tokenizer hf_student \
    --teacher-tokenizer hf_teacher --output-prefix bench
fi
cat > bench.nml <<EOF2
&run mode = 'distill', steps = 5, seed = 7, out_dir = 'run' /
&teacher card = 'teacher.nml', init = 'teacher.h5' /
&student card = 'student.nml', init = 'student.h5' /
&parallel micro_batch = 1, global_batch = 4 /
&data train = 'bench', seq_len = 512, samples = 'documents' /
&loss kind = 'uld' /
&optim lr = 1e-3, warmup = 1 /
&precision compute = 'fp32' /
EOF2
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
printf '%-8s %-7s %-7s %10s %10s %7s %8s %10s\n' precision threads loss "step s" "uld s" share groups "us/group"
for prec in fp32 bf16; do
  for th in 1 2; do
    for kind in uld hybrid; do
      extra=""
      [ "$kind" = hybrid ] && extra="loss%matched_weight=0.5 loss%unmatched_weight=0.5"
      # shellcheck disable=SC2086
      OMP_NUM_THREADS=$th mpiexec -n 1 "$src/src/kdtrain" bench.nml \
        precision%compute="'$prec'" $extra > "log_${prec}_${th}_$kind.txt" 2>&1
      grep '^step' "log_${prec}_${th}_$kind.txt" | sed 1d | awk -v p="$prec" -v t="$th" -v k="$kind" '
        { for (i = 1; i <= NF; i++) {
            if ($i == "uld") { u += $(i + 1) + 0; s = $(i + 2); gsub(/[(%]/, "", s); st += ($(i + 1) + 0) * 100 / s }
            if ($i == "groups)") g += $(i - 1) } n++ }
        END { printf "%-8s %-7s %-7s %10.3f %10.3f %6.0f%% %8.0f %10.0f\n", p, t, k, st / n, u / n,
              100 * u / st, g / n, u / g * 1e6 }'
    done
  done
done
