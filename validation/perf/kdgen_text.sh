#!/bin/sh
# kdgen_text.sh [N]: kdgen's text path both ways: the C tokenizer's (kdgen-ids --text) and the
# Python one (KDGEN_PYTHON_TOKENIZER=1: transformers tokenises, kdgen.py --finish decodes), on
# the first N (default 2000) non-blank lines of input/corpus/kjv-train.txt as prompts with
# --max-new-tokens 1, on the tiny random Qwen2 of validation/ref/kdgen_ref.py (its byte-level
# BPE tokenizer of 500 tokens trained on the same text). Prints the wall time of kdgen end to
# end (text out, then --jsonl; the best of 3 each; the two paths' outputs must be the same
# bytes or the script fails), the tokenizer's own time in each path (C: the engine's line;
# Python: transformers' import, the tokenizer's load, tokenizer(text) per prompt and
# decode(ids, skip_special_tokens=True) per continuation, as kdgen.py calls them), the engine
# kdgen-ids --text alone, the CPU and the load. One thread. Run from the build tree root after make; KD_PYTHON: a Python with
# torch, transformers and h5py (default .venv/bin/python of the source tree).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${KD_PYTHON:-$root/.venv/bin/python}
n=${1:-2000}
build=$(pwd)
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 KD_SRCDIR="$root"
KD_SRCDIR=$root "$py" "$root/validation/ref/kdgen_ref.py" "$w" 8 > "$w/ref.log" 2>&1 ||
  { cat "$w/ref.log"; exit 1; }
"$build/src/tools/kdconvert" from-hf "$w/hf" "$w/m.h5" > "$w/conv.log" 2>&1 ||
  { cat "$w/conv.log"; exit 1; }
grep -v '^[[:space:]]*$' "$root/input/corpus/kjv-train.txt" | head -n "$n" > "$w/p.txt"
# best WHAT ENV ARGS...: the best wall time (s) of 3 runs of kdgen ARGS with ENV (x=1: none);
# WHAT=engine: kdgen-ids --text alone
best() {
  what=$1 env=$2
  shift 2
  b=""
  for _ in 1 2 3; do
    t0=$(date +%s.%N)
    if [ "$what" = engine ]; then
      "$build/src/tools/kdgen-ids" "$w/m.h5" --text "$w/p.txt" --max-new-tokens 1 \
        > "$w/$what.out" 2> "$w/$what.err" || { cat "$w/$what.err"; exit 1; }
    else
      env "$env" "$py" "$build/src/tools/kdgen" "$w/m.h5" --prompts "$w/p.txt" \
        --max-new-tokens 1 "$@" > "$w/$what.out" 2> "$w/$what.err" || { cat "$w/$what.err"; exit 1; }
    fi
    b=$(awk -v t0="$t0" -v t1="$(date +%s.%N)" -v b="$b" \
      'BEGIN { t = t1 - t0; printf "%.2f\n", (b == "" || t < b) ? t : b }')
  done
  echo "$b"
}
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(getconf _NPROCESSORS_ONLN) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "prompts: $n lines of kjv-train.txt ($(wc -c < "$w/p.txt") bytes), --max-new-tokens 1"
for mode in text jsonl; do
  extra=""
  [ $mode = jsonl ] && extra="--jsonl $w/out.jsonl"
  tc=$(best c$mode x=1 $extra)
  [ $mode = jsonl ] && cp "$w/out.jsonl" "$w/c.jsonl"
  tp=$(best p$mode KDGEN_PYTHON_TOKENIZER=1 $extra)
  [ $mode = jsonl ] && cp "$w/out.jsonl" "$w/p.jsonl"
  cmp -s "$w/c$mode.out" "$w/p$mode.out" || { echo "FAIL: the $mode outputs differ"; exit 1; }
  echo "kdgen end to end, $mode out: C path ${tc} s, Python path ${tp} s"
done
cmp -s "$w/c.jsonl" "$w/p.jsonl" || { echo "FAIL: the JSONL outputs differ"; exit 1; }
echo "kdgen-ids --text alone (no Python front end), text out: $(best engine x=1) s"
echo "C tokenizer (the engine's line): $(grep 'the C tokenizer' "$w/cjsonl.err" | sed 's/^kdgen: //')"
"$py" - "$w" <<'PY'
import json, os, sys, tempfile, time
w = sys.argv[1]
t0 = time.perf_counter()
import h5py
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
from transformers import AutoTokenizer
t1 = time.perf_counter()
d = tempfile.mkdtemp()
with h5py.File(f"{w}/m.h5", "r") as f:
    for name, ds in f["tokenizer"].items():
        open(os.path.join(d, name), "wb").write(bytes(ds[()].tobytes()))
tok = AutoTokenizer.from_pretrained(d)
t2 = time.perf_counter()
prompts = [l for l in open(f"{w}/p.txt", encoding="utf-8").read().split("\n") if l.strip()]
ids = [tok(p, add_special_tokens=True)["input_ids"] for p in prompts]
t3 = time.perf_counter()
made = [json.loads(l)["ids"] for l in open(f"{w}/p.jsonl", encoding="utf-8")]
text = [tok.decode(x, skip_special_tokens=True) for x in made]
t4 = time.perf_counter()
n = sum(map(len, ids))
print(f"Python tokenizer: import {t1 - t0:.2f} s, load {t2 - t1:.3f} s (twice per run: start "
      f"and --finish); encoded {n} prompt tokens in {t3 - t2:.3f} s ({n / (t3 - t2) / 1e6:.2f} M "
      f"tok/s); decoded {sum(map(len, made))} ids in {t4 - t3:.3f} s")
PY
