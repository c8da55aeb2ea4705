#!/bin/sh
# tokenizer.sh [TEXT...]: the C tokenizer's encoding rate against Hugging Face tokenizers',
# one thread each, for the test tokenizers of validation/ref/tokenizer_ref.py, on each TEXT
# (default: the English input/corpus/kjv-train.txt, 1.5 MB, and tokenizer_ref.py's
# multilingual corpus 40 times, 117 kB) whole and line by line (tokenizers: encode, and
# encode_batch of the lines). Each side: the best of 5 runs after one that warms the word
# caches; the ids must agree (their hashes), or the script fails. Run from the build tree
# root after make (validation/perf/tok_rate); KD_PYTHON: a Python with tokenizers.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${KD_PYTHON:-$root/.venv/bin/python}
rate=${TOK_RATE:-./validation/perf/tok_rate}
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
"$py" - "$root/validation/ref/tokenizer_ref.py" "$w/multilingual.txt" <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("ref", sys.argv[1])
ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)
open(sys.argv[2], "w", encoding="utf-8").write(ref.CORPUS * 40)
PY
[ $# -gt 0 ] || set -- "$root/input/corpus/kjv-train.txt" "$w/multilingual.txt"
RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "$py" "$root/validation/ref/tokenizer_ref.py" \
  "$w" --perf "$@" > "$w/ref.log" 2>&1 || { cat "$w/ref.log"; exit 1; }
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //') (family $(grep -m1 'cpu family' \
  /proc/cpuinfo | sed 's/.*: //') model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | sed 's/.*: //'));" \
  "tokenizers $("$py" -c 'import tokenizers; print(tokenizers.__version__)'); one thread each"
printf '%-12s %-18s %-5s %9s %12s %12s %7s\n' kind text mode tokens "C tok/s" "HF tok/s" "C/HF"
bad=0
while read -r kind file mode tokens secs hash; do
  path=""
  for f in "$@"; do [ "$(basename "$f")" = "$file" ] && path=$f; done
  [ -s "$w/$kind.$file.c" ] || "$rate" "$w/$kind.json" "$path" > "$w/$kind.$file.c"
  set -- "$@"
  line=$(grep "^$mode " "$w/$kind.$file.c")
  ctok=$(echo "$line" | cut -d' ' -f2) csecs=$(echo "$line" | cut -d' ' -f3) chash=$(echo "$line" | cut -d' ' -f4)
  if [ "$ctok" != "$tokens" ] || [ "$chash" != "$hash" ]; then
    echo "FAIL: $kind $file $mode: the C tokenizer's ids differ from tokenizers' ($ctok vs $tokens tokens)"
    bad=1
  fi
  awk -v k="$kind" -v f="$file" -v m="$mode" -v n="$tokens" -v c="$csecs" -v h="$secs" 'BEGIN {
    printf "%-12s %-18s %-5s %9d %12.0f %12.0f %7.1f\n", k, f, m, n, n / c, n / h, h / c }'
done < "$w/perf_hf.txt"
exit $bad
