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
# continuation beyond max_position_embeddings exit 2 naming the file. Text prompts with the
# file's own tokenizer take the C tokenizer's path (kdgen-ids --text: the cases above check
# it against transformers, as a JSONL of "prompt" objects); on multilingual prompts (CJK, emoji, accents, NFD, RTL, JSON
# escapes, a BOM, \r\n and \r line ends) its text and JSONL are byte for byte those of the
# Python path (KDGEN_PYTHON_TOKENIZER=1), on 1 rank, PP 2 and DP 2; tokenizers the C
# tokenizer refuses (a Lowercase normalizer) or that transformers reads otherwise
# (tokenizer_class Qwen2Tokenizer, a pad_token tokenizer.json lacks) fall back silently to
# the Python path with kdgen and exit 2 naming the component with kdgen-ids --text, as do
# a weights file without /tokenizer, a missing, blank or non-UTF-8 prompt file.
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

echo "== the C tokenizer's path against the Python path (KDGEN_PYTHON_TOKENIZER=1), byte for byte"
"$KD_PYTHON" - ml.txt <<'EOF2' || fail "multilingual prompts"
import sys
lines = ["\ufeffIn the beginning 神创造天地", "Ἐν ἀρχῇ ἦν ὁ λόγος", "café naïve — e\u0301te\u0301 (NFD)",
         "日本語のテキスト、漢字とかな。", "emoji: 👋🏽 🇫🇷 👨‍👩‍👧 🙂!", "\u3000\u2003 ",
         "  tab\tquote\" back\\slash \x01\x7f end  ", "Привет, мир! שלום עולם مرحبا",
         "line sep\u2028para\u2029 नमस्ते दुनिया", "{not JSON: the first line decides"]
data = "\r\n".join(lines[:4]) + "\r" + "\n".join(lines[4:]) + "\n\n"
open(sys.argv[1], "wb").write(data.encode("utf-8"))
EOF2
cat prompts.txt ml.txt > all.txt
one="héllo 👋 «naïve» \"quoted\""
KDGEN_PYTHON_TOKENIZER=1 kdgen m.h5 --prompt "$one" --prompts all.txt --max-new-tokens $NEW \
  > py.txt 2> py.err || { cat py.err; fail "kdgen, Python path"; }
KDGEN_PYTHON_TOKENIZER=1 kdgen m.h5 --prompts all.txt --max-new-tokens $NEW --jsonl py.jsonl \
  2> py.err || { cat py.err; fail "kdgen --jsonl, Python path"; }
! grep -q "C tokenizer" py.err || { cat py.err; fail "KDGEN_PYTHON_TOKENIZER=1 took the C path"; }
# c_path NAME: kdgen's run NAME took the C tokenizer's path
c_path() { grep -q "the C tokenizer encoded" "$1.err" || { cat "$1.err"; fail "$1: not the C path"; }; }
kdgen m.h5 --prompt "$one" --prompts all.txt --max-new-tokens $NEW > c1.txt 2> c1.err ||
  { cat c1.err; fail "kdgen, C path"; }
c_path c1
cmp c1.txt py.txt || fail "text of the C path differs from the Python path's"
kdgen m.h5 --prompts all.txt --max-new-tokens $NEW --jsonl c1.jsonl 2> c1j.err ||
  { cat c1j.err; fail "kdgen --jsonl, C path"; }
c_path c1j
cmp c1.jsonl py.jsonl || fail "JSONL of the C path differs from the Python path's"
$MPIEXEC -n 2 "$KD_PYTHON" "$KD_BUILDDIR/src/tools/kdgen" m.h5 --prompt "$one" --prompts all.txt \
  --max-new-tokens $NEW --pp 2 > c2.txt 2> c2.err || { cat c2.err; fail "kdgen pp 2, C path"; }
c_path c2
cmp c2.txt py.txt || fail "text of the C path on pp 2 differs"
$MPIEXEC -n 2 "$KD_PYTHON" "$KD_BUILDDIR/src/tools/kdgen" m.h5 --prompts all.txt \
  --max-new-tokens $NEW --dp 2 --jsonl c3.jsonl 2> c3.err || { cat c3.err; fail "kdgen dp 2, C path"; }
c_path c3
cmp c3.jsonl py.jsonl || fail "JSONL of the C path on dp 2 differs"
grep '"prompt"' chat.jsonl > ponly.jsonl # JSONL of "prompt" objects alone: the C path too
head -n 1 want_chat.jsonl > want_ponly.jsonl
kdgen m.h5 --prompts ponly.jsonl --max-new-tokens $NEW --jsonl c4.jsonl 2> c4.err ||
  { cat c4.err; fail "kdgen, JSONL prompts, C path"; }
c_path c4
same_jsonl c4.jsonl want_ponly.jsonl
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

echo "== the C path's refusals: kdgen falls back to the Python path, kdgen-ids --text exits 2"
ids2() { # ids2 PATTERN ARGS...: kdgen-ids exits 2 and says PATTERN
  pat=$1
  shift
  rc=0
  "$KD_BUILDDIR/src/tools/kdgen-ids" "$@" > out.txt 2>&1 || rc=$?
  [ "$rc" -eq 2 ] && grep -q -- "$pat" out.txt || { cat out.txt; fail "kdgen-ids $*: rc $rc, want 2 and '$pat'"; }
}
# variant DIR FILE PYTHON: hf with FILE's JSON d changed by PYTHON, converted to DIR.h5
variant() {
  "$KD_PYTHON" - "$@" <<'EOF2' || fail "tokenizer variant $1"
import json, shutil, sys
dst, name, edit = sys.argv[1:4]
shutil.copytree("hf", dst)
d = json.load(open(f"{dst}/{name}", encoding="utf-8"))
exec(edit)
json.dump(d, open(f"{dst}/{name}", "w", encoding="utf-8"), ensure_ascii=False)
EOF2
  "$conv" from-hf "$1" "$1.h5" > conv.txt 2>&1 || { cat conv.txt; fail "kdconvert from-hf $1"; }
}
variant lower tokenizer.json 'd["normalizer"] = {"type": "Lowercase"}'
variant qwen tokenizer_config.json 'd["tokenizer_class"] = "Qwen2Tokenizer"'
variant pad tokenizer_config.json 'd["pad_token"] = "<pad>"'
ids2 "lower.h5: /tokenizer/tokenizer.json: normalizer 'Lowercase' is not implemented" lower.h5 --text all.txt
ids2 "qwen.h5: /tokenizer/tokenizer_config.json: tokenizer_class Qwen2Tokenizer" qwen.h5 --text all.txt
ids2 "pad.h5: /tokenizer/tokenizer_config.json: pad_token '<pad>' is not an added token" pad.h5 \
  --text all.txt
kdgen lower.h5 --prompts all.txt --max-new-tokens $NEW --jsonl l1.jsonl 2> l1.err ||
  { cat l1.err; fail "kdgen lower.h5: no fallback"; }
KDGEN_PYTHON_TOKENIZER=1 kdgen lower.h5 --prompts all.txt --max-new-tokens $NEW --jsonl l2.jsonl \
  2> l2.err || { cat l2.err; fail "kdgen lower.h5, Python path"; }
! grep -q "C tokenizer" l1.err && cmp l1.jsonl l2.jsonl || { cat l1.err; fail "lower.h5: not the Python path's"; }
kdgen qwen.h5 --prompt "$one" --max-new-tokens $NEW > q1.txt 2> q1.err && ! grep -q "C tokenizer" q1.err ||
  { cat q1.err; fail "kdgen qwen.h5: no fallback"; }
ids2 "notok.h5: no /tokenizer group" notok.h5 --text all.txt
ids2 "nothere.txt: cannot read the prompt file" m.h5 --text nothere.txt
printf 'fine\nnot \377 UTF-8\n' > badutf.txt
ids2 "badutf.txt: cannot read the prompt file (line 2: byte 0xff" m.h5 --text badutf.txt
expect2 "badutf.txt: cannot read the prompt file" m.h5 --prompts badutf.txt
printf ' \n\t\n' > blank.txt
ids2 "blank.txt holds no prompt" m.h5 --text blank.txt
expect2 "--prompt: prompt 1 has no tokens" m.h5 --prompt ""
ids2 "usage" m.h5 --text all.txt --ids all.txt
[ -z "$(ls tmp | grep kdgen_)" ] || { ls tmp; fail "temporary files left behind"; }
echo "all kdgen checks passed"
