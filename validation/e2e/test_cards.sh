#!/bin/sh
# Every model card in mod/ (doc/models.md):
#  - parses: kdtrain --dry-run of a run with the card as its student exits 0 and prints
#    the card's parameter count;
#  - that count is the count of transformers' own model class (Qwen2ForCausalLM,
#    LlamaForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM, Qwen3MoeForCausalLM,
#    MixtralForCausalLM, Olmo2ForCausalLM, Phi3ForCausalLM) built, on the meta device, from
#    the card's values;
#  - for the cards of published models, the count and the count without the embedding
#    rows (and without the output head when it is untied) agree to the last digit with
#    the figures the model makers publish (doc/models.md cites each): Qwen3-0.6B "0.6B"
#    and "0.44B", ... (they round or cut off: 0.596B is "0.6B", Qwen2.5-7B's 7.616B is
#    "7.61B", Llama-3.2-1B's 1.236B "1.23B"), so a count is taken as agreeing when it
#    lies less than one unit of the last published digit away;
#  - every worked example input/*-to-*/distill.nml plans, with the cards of mod/ for the
#    files kdconvert would write, on its 8 ranks within an 80 GB device.
set -eu
export OMP_NUM_THREADS=1
export KDTRAIN_MOD_PATH="$KD_SRCDIR/mod" # the cards of this tree, by name
. "${KD_SRCDIR:?}/validation/lib.sh"
kd_python_or_skip torch transformers

cat > base.nml <<EOF2
&run mode = 'train', steps = 1, out_dir = 'o' /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 1 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 16 /
&optim lr = 1e-3 /
EOF2

echo "== kdtrain --dry-run on every card of mod/"
: > counts.txt
n=0
for f in "$KD_SRCDIR"/mod/*.nml; do
  name=$(basename "$f" .nml)
  "$KDTRAIN" --dry-run --bytes base.nml student%card="'$name'" > plan.txt 2>&1 \
    || { cat plan.txt; fail "card $name: --dry-run exit status $?"; }
  count=$(sed -n "s/^  student $name: \([0-9]*\) parameters.*/\1/p" plan.txt)
  [ -n "$count" ] || { cat plan.txt; fail "card $name: no parameter count in the plan"; }
  echo "$name $f $count" >> counts.txt
  n=$((n + 1))
done
echo "ok $n cards parse"
[ "$n" -ge 25 ] || fail "only $n cards in mod/"

echo "== the counts against transformers and the published figures"
"$KD_PYTHON" - counts.txt <<'EOF2' || fail "parameter counts differ (above)"
import re, sys, warnings
warnings.simplefilter("ignore")
import torch
import transformers as tf

# name: (total, without embeddings) as the model makers publish them, in billions;
# None where they publish no figure. Sources: doc/models.md.
PUBLISHED = {
    "qwen2.5-0.5b": ("0.49", "0.36"), "qwen2.5-1.5b": ("1.54", "1.31"),
    "qwen2.5-7b": ("7.61", "6.53"), "qwen3-0.6b": ("0.6", "0.44"),
    "qwen3-1.7b": ("1.7", "1.4"), "qwen3-8b": ("8.2", "6.95"), "qwen3-32b": ("32.8", "31.2"),
    "llama3.2-1b": ("1.23", None), "llama3.1-8b": ("8.03", None),
    "llama3.1-70b": ("70.6", None), "qwen3-30b-a3b": ("30.5", "29.9"),
    "phi3-mini-4k": ("3.8", None),
}
CLASSES = {"qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
           "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
           "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
           "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM),
           "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM),
           "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM),
           "olmo2": (tf.Olmo2Config, tf.Olmo2ForCausalLM),
           "smollm3": (tf.SmolLM3Config, tf.SmolLM3ForCausalLM),
           "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM)}


def card(path):
    """The key = value pairs of a card's &model group (comments dropped)."""
    text = re.sub(r"!.*", "", open(path).read())
    body = re.search(r"&model(.*?)/", text, re.S).group(1)
    out = {}
    for k, v in re.findall(r"(\w+)\s*=\s*('[^']*'|[^\s,]+)", body):
        v = v.strip("'")
        out[k] = {".true.": True, ".false.": False}.get(v.lower(), v)
    return out


def hf_count(c):
    """Parameters of transformers' model class for the card's values (meta device)."""
    cfg_class, model_class = CLASSES[c.get("arch", "qwen2")]
    ints = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads")
    kw = {k: int(c[k]) for k in ints}
    hd = int(c.get("head_dim", 0)) or kw["hidden_size"] // kw["num_attention_heads"]
    kw.update(head_dim=hd, tie_word_embeddings=bool(c.get("tie_word_embeddings", False)))
    if c.get("arch") == "llama":
        kw["attention_bias"] = bool(c.get("attention_bias", False))
    if c.get("arch") == "mixtral":  # the expert count as MixtralConfig spells it
        kw.update(num_local_experts=int(c.get("num_experts", 0)),
                  num_experts_per_tok=int(c.get("num_experts_per_tok", 2)))
    if c.get("arch") == "qwen3_moe":  # mlp_only_layers: one value in the cards of mod/
        only = c.get("mlp_only_layers")
        kw.update(num_experts=int(c.get("num_experts", 0)),
                  num_experts_per_tok=int(c.get("num_experts_per_tok", 2)),
                  moe_intermediate_size=int(c.get("moe_intermediate_size", 0)),
                  decoder_sparse_step=int(c.get("decoder_sparse_step", 1)),
                  mlp_only_layers=[int(only)] if only is not None else [])
    with torch.device("meta"):
        model = model_class(cfg_class(**kw))
    return sum(p.numel() for p in model.parameters())


def rounds_to(n, text):
    """n (parameters) is the published text (billions) rounded or cut off: less than one
    unit of its last digit away."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return abs(n / 1e9 - float(text)) < 10 ** -decimals


bad = 0
for line in open(sys.argv[1]):
    name, path, count = line.split()
    c, count = card(path), int(count)
    if c.get("arch", "qwen2") not in CLASSES:
        print(f"{name}: arch '{c['arch']}' has no transformers class in CLASSES of this test")
        bad += 1
        continue
    ref = hf_count(c)
    emb = int(c["vocab_size"]) * int(c["hidden_size"])
    non_emb = count - emb * (1 if c.get("tie_word_embeddings") else 2)
    note = ""
    if name in PUBLISHED:
        total, without = PUBLISHED[name]
        ok = rounds_to(count, total) and (without is None or rounds_to(non_emb, without))
        note = f"published {total}B" + (f", {without}B without embeddings" if without else "")
        note += "" if ok else "  <-- does not round to the published figure"
        bad += not ok
    if ref != count:
        note += f"  <-- transformers counts {ref}"
        bad += 1
    print(f"{name:22s} kdtrain {count:>12d}  transformers {ref:>12d}  "
          f"without embeddings {non_emb / 1e9:7.3f}B  {note}")
missing = sorted(set(PUBLISHED) - {l.split()[0] for l in open(sys.argv[1])})
if missing:
    print("cards missing from mod/:", missing)
    bad += 1
sys.exit(1 if bad else 0)
EOF2
echo "ok the counts of every card"

echo "== the worked examples plan with the cards of mod/"
for nml in "$KD_SRCDIR"/input/*-to-*/distill.nml; do
  set -- $(sed -n "s/^ *card = '\([^']*\)\.nml'.*/\1/p" "$nml")
  [ $# -eq 2 ] || fail "$nml: expected a teacher and a student card"
  "$KDTRAIN" --dry-run --bytes --ranks 8 --device-mem 80GiB "$nml" teacher%card="'$1'" teacher%init="''" \
    student%card="'$2'" student%init="'random'" data%train="'$KD_SRCDIR/input/corpus/kjv-train.txt'" \
    data%format="'bytes'" data%valid="''" > plan.txt 2>&1 || { cat plan.txt; fail "$nml: --dry-run"; }
  grep -q "^  fit: .*: fits$" plan.txt || { cat plan.txt; fail "$nml: does not fit 80 GiB"; }
  echo "ok $(basename "$(dirname "$nml")"): $(sed -n 's/^  largest rank: .*: \([0-9.]* GiB\) |.*/\1/p' plan.txt) per rank"
done
