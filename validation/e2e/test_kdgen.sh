#!/bin/sh
# kdgen, the text front end (src/tools/kdgen.py over the engine kdgen-ids), against
# transformers: a random Qwen2 model with a real byte-level BPE tokenizer and a chat
# template (ref/kdgen_ref.py), converted by kdconvert from-hf (the tokenizer travels in
# the weights file). Greedy continuations of text prompts, of a JSONL with "prompt" and a
# chat ("messages": the turns before the assistant's, rendered by the template) give
# transformers' generate() ids and the tokenizer's decoded text, as do the prompt parts
# of a kdprep chat dataset of that chat, written as JSONL
# (prompt, text, ids) or as text; the same under mpiexec on 2 pipeline stages and on 2
# data-parallel replicas; a weights file without a tokenizer gives the same JSONL with
# --tokenizer naming the Hugging Face directory or a weights file that carries it; bad
# prompt files, a weights file without a tokenizer and no --tokenizer (the option named),
# a --tokenizer that is missing, carries none or holds ids beyond the vocabulary, and a
# continuation beyond max_position_embeddings exit 2 naming the file.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
kd_python_or_skip torch transformers tokenizers h5py
export OMP_NUM_THREADS=1 KD_SRCDIR
mkdir -p tmp && export TMPDIR="$PWD/tmp" # kdgen's temporary ids files: none left
conv="$KD_BUILDDIR/src/tools/kdconvert"
kdgen() { "$KD_PYTHON" "$KD_BUILDDIR/src/tools/kdgen" "$@"; }
NEW=24
"$KD_PYTHON" "$KD_SRCDIR/validation/ref/kdgen_ref.py" "$PWD" $NEW > ref.txt || fail "reference"
cat ref.txt
grep -q " 0 ended by eos" ref.txt && fail "no prompt ends with eos: the end id is not tested"
"$conv" from-hf hf m.h5 > conv.txt 2>&1 || { cat conv.txt; fail "kdconvert from-hf"; }
# same_jsonl GOT WANT: the same objects line by line
same_jsonl() {
  "$KD_PYTHON" - "$1" "$2" <<'EOF2' || fail "$1 is not $2"
import json, sys
got, want = ([json.loads(l) for l in open(p, encoding="utf-8")] for p in sys.argv[1:])
for i, (g, w) in enumerate(zip(got, want)):
    if g != w:
        sys.exit(f"line {i + 1}: got {g}\n  want {w}")
if len(got) != len(want):
    sys.exit(f"{len(got)} lines, want {len(want)}")
EOF2
}

echo "== text prompts, one rank: JSONL"
kdgen m.h5 --prompts prompts.txt --max-new-tokens $NEW --jsonl p1.jsonl 2> p1.err ||
  { cat p1.err; fail "kdgen --prompts"; }
same_jsonl p1.jsonl want_prompts.jsonl
grep -q "tokens/s" p1.err || { cat p1.err; fail "no tokens/s line"; }
echo "== JSONL prompt and chat, mpiexec -n 2 (pp 2), then dp 2"
$MPIEXEC -n 2 "$KD_PYTHON" "$KD_BUILDDIR/src/tools/kdgen" m.h5 --prompts chat.jsonl \
  --max-new-tokens $NEW --pp 2 --jsonl c2.jsonl 2> c2.err || { cat c2.err; fail "kdgen pp 2"; }
same_jsonl c2.jsonl want_chat.jsonl
grep -q "pp 2" c2.err || { cat c2.err; fail "pp 2: no layout in the tokens/s line"; }
$MPIEXEC -n 2 "$KD_PYTHON" "$KD_BUILDDIR/src/tools/kdgen" m.h5 --prompts prompts.txt \
  --max-new-tokens $NEW --dp 2 --jsonl p2.jsonl 2> p2.err || { cat p2.err; fail "kdgen dp 2"; }
same_jsonl p2.jsonl want_prompts.jsonl
echo "== the prompts of a kdprep chat dataset (the tokens before the first counted one)"
grep messages chat.jsonl > chat_only.jsonl
tail -n 1 want_chat.jsonl > want_ds.jsonl
"$KD_PYTHON" "$KD_BUILDDIR/src/tools/kdprep" --input chat_only.jsonl --output-prefix ds \
  --weights m.h5 --chat --no-progress > prep.txt 2>&1 || { cat prep.txt; fail "kdprep --chat"; }
kdgen m.h5 --prompts ds --max-new-tokens $NEW --jsonl d1.jsonl 2> d1.err ||
  { cat d1.err; fail "kdgen --prompts ds"; }
same_jsonl d1.jsonl want_ds.jsonl
echo "== --prompt: text on standard output"
kdgen m.h5 --prompt "$(head -n 1 prompts.txt)" --max-new-tokens $NEW > t.txt 2> t.err ||
  { cat t.err; fail "kdgen --prompt"; }
cmp -s t.txt want_stdout.txt || { cat t.txt want_stdout.txt; fail "text output"; }
[ -z "$(ls tmp | grep kdgen_)" ] || { ls tmp; fail "temporary files left behind"; }

echo "== a weights file without /tokenizer: --tokenizer DIR (Hugging Face) or FILE.h5"
mkdir -p notok && cp hf/config.json hf/*.safetensors notok/
"$conv" from-hf notok notok.h5 > conv.txt 2>&1 || { cat conv.txt; fail "kdconvert from-hf notok"; }
kdgen notok.h5 --tokenizer hf --prompts prompts.txt --max-new-tokens $NEW --jsonl n1.jsonl \
  2> n1.err || { cat n1.err; fail "kdgen --tokenizer hf"; }
same_jsonl n1.jsonl want_prompts.jsonl
kdgen notok.h5 --tokenizer m.h5 --prompts chat.jsonl --max-new-tokens $NEW --jsonl n2.jsonl \
  2> n2.err || { cat n2.err; fail "kdgen --tokenizer m.h5"; }
same_jsonl n2.jsonl want_chat.jsonl
kdgen notok.h5 --tokenizer m.h5 --prompt "$(head -n 1 prompts.txt)" --max-new-tokens $NEW \
  > n3.txt 2> n3.err || { cat n3.err; fail "kdgen --tokenizer m.h5 --prompt"; }
cmp -s n3.txt want_stdout.txt || { cat n3.txt want_stdout.txt; fail "text output with --tokenizer"; }

echo "== refusals (exit 2, the file named)"
expect2() { # expect2 PATTERN ARGS...: kdgen exits 2 and says PATTERN
  pat=$1
  shift
  rc=0
  kdgen "$@" > out.txt 2>&1 || rc=$?
  [ "$rc" -eq 2 ] && grep -q -- "$pat" out.txt || { cat out.txt; fail "kdgen $*: rc $rc, want 2 and '$pat'"; }
}
expect2 "nothere.txt: cannot read" m.h5 --prompts nothere.txt
printf '{"prompt": "a"}\n{"text": "b"}\n' > bad.jsonl
expect2 "bad.jsonl:2: expected an object" m.h5 --prompts bad.jsonl
printf '{"prompt": "a"}\n{"prompt": \n' > bad2.jsonl
expect2 "bad2.jsonl:2: not JSON" m.h5 --prompts bad2.jsonl
expect2 "notok.h5: no /tokenizer group; name a tokenizer with --tokenizer" notok.h5 --prompt hello
expect2 "--tokenizer nothere: no such directory or file" notok.h5 --prompt hello --tokenizer nothere
expect2 "notok.h5: no /tokenizer group; expected a weights file that carries" m.h5 --prompt hello \
  --tokenizer notok.h5
"$KD_PYTHON" -c "import sys; from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained(sys.argv[1]); t.add_tokens(['<extra>']); t.save_pretrained(sys.argv[2])" \
  hf bigtok 2> /dev/null || fail "a tokenizer with one token more"
expect2 "--tokenizer bigtok: .* tokens, more than the vocab_size" notok.h5 --prompt hello --tokenizer bigtok
expect2 "prompt" m.h5
expect2 "prompts.txt: prompt 1 of .* exceed max_position_embeddings = 128" m.h5 --prompts prompts.txt \
  --max-new-tokens 125
echo "all kdgen checks passed"
