#!/bin/sh
# code_health.sh [TREE]: the code-health numbers of src/ (not a test; the closing notes'
# before/after tables): files over 800 lines, the longest functions, configuration words
# compared as strings outside the parser, file-scope mutable statics in src/backend/, HDF5
# attribute calls outside h5attr.c, #ifdef KD_HAVE_CUDA outside src/backend/. Include
# circles and the other rules: validation/lint/test_code_rules.sh; verbatim twins: the
# duplicates tool. Run from the top of a tree (default .).
set -eu
cd "${1:-.}"
echo "files over 800 lines: $(find src -name '*.[ch]' -o -name '*.cu' | xargs wc -l |
  awk '$2 != "total" && $1 > 800 { printf "%s (%d) ", $2, $1 }')"
python3 - <<'PY'
import os, re
out = []
for d, _, fs in os.walk('src'):
    for f in fs:
        if not f.endswith(('.c', '.cu')):
            continue
        p = os.path.join(d, f)
        src = open(p, errors='replace').read()
        # comments and literals blanked (newlines kept), then top-level braces counted
        src = re.sub(r'/\*.*?\*/', lambda m: '\n' * m.group(0).count('\n'), src, flags=re.S)
        src = re.sub(r'//[^\n]*', '', src)
        src = re.sub(r'"(\\.|[^"\\])*"', '""', src)
        src = re.sub(r"'(\\.|[^'\\])*'", "''", src)
        depth, line, start, stmt = 0, 1, None, 0
        for i, ch in enumerate(src):
            if ch == '\n':
                line += 1
            if ch == '{':
                if depth == 0:
                    prev = src[stmt:i]
                    if re.search(r'\)\s*$', prev) and not re.search(r'=\s*$', prev):
                        names = re.findall(r'([A-Za-z_][A-Za-z_0-9]*)\s*\(', prev)
                        off = stmt + len(prev) - len(prev.lstrip())
                        start = (src.count('\n', 0, off) + 1, names[0] if names else '?')
                depth += 1
            elif ch == '}':
                depth -= 1
                if depth == 0:
                    if start:
                        out.append((line - start[0] + 1, p, start[1]))
                    start, stmt = None, i + 1
            elif ch == ';' and depth == 0:
                stmt = i + 1
out.sort(reverse=True)
print("longest functions: " + ", ".join(f"{n} {p}:{fn}" for n, p, fn in out[:3]) +
      f"; {sum(1 for o in out if o[0] > 100)} over 100 lines")
PY
words=$(sed -n 's/^ *X([A-Z0-9_]*, *"\([a-z0-9_]*\)").*/\1/p' src/words.h 2> /dev/null | sort -u)
[ -n "$words" ] || words="distill train eval cache auto cpu cuda devsim live topk sample bytes u16 u32 h5 megatron llmc fkl rkl jsd cosine linear constant bf16 fp32 none full selective error warn info debug qwen2 llama"
pat=$(printf '%s\n' $words | paste -sd'|')
echo "configuration words compared as strings outside config.c/namelist.c/words.c: $(find src -name '*.c' -o -name '*.h' -o -name '*.cu' |
  grep -v -e '/config\.c$' -e '/namelist\.c$' -e '/words\.[ch]$' |
  xargs grep -cE "str(n)?(case)?cmp *\(.*\"($pat)\"|strcmp\(cfg->" | awk -F: '{ s += $2 } END { print s }')"
echo "file-scope mutable statics in src/backend/: $(cat src/backend/*.c src/backend/*.h src/backend/*.cu src/backend/*.cuh 2> /dev/null |
  grep -E '^static ' | grep -v '(' | grep -cvE '^static (const|constexpr)|^static [a-z_ ]*const ')"
echo "H5A calls outside h5attr.c: $(find src -name '*.c' | grep -v h5attr.c | xargs grep -hE '\bH5A[a-z_]+ *\(' | wc -l) lines"
echo "#ifdef KD_HAVE_CUDA outside src/backend/: $(find src -name '*.c' | grep -v '^src/backend/' |
  xargs grep -lE '#if(def)? .*KD_HAVE_CUDA' | tr '\n' ' ')"
