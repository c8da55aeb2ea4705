#!/bin/sh
# House rules of src/ that a compiler does not check (src/README.md):
#  1. no string comparison on a configuration word outside config.c, namelist.c and words.c
#     (config_load turns every word into its enum, words.h);
#  2. no HDF5 attribute call (H5A...) outside the attribute module h5attr.c;
#  3. train.c includes nothing under backend/ but backend/backend.h;
#  4. every communicator made in grid.c (no MPI_Comm_split/_split_type/_create/_dup elsewhere;
#     mpi_yield.c only wraps them);
#  5. no include circle between the modules of src/ (a module: NAME.c/.h/.cu/.cuh, with its
#     private header NAME_impl.h or NAME_common.cuh, shared by the files that implement it).
set -eu
: "${KD_SRCDIR:?}"
src=$KD_SRCDIR/src
bad=0
say() { echo "FAIL: $*" >&2; bad=1; }

# 1: the words of every list in words.h, quoted, in a strcmp-family call
words=$(sed -n 's/^ *X([A-Z0-9_]*, *"\([a-z0-9_]*\)").*/\1/p' "$src/words.h" | sort -u)
[ -n "$words" ] || say "no word lists found in src/words.h"
pat=$(printf '%s\n' $words | paste -sd'|')
hits=$(find "$src" -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | sort |
  grep -v -e '/config\.c$' -e '/namelist\.c$' -e '/words\.[ch]$' |
  xargs grep -nE "str(n)?(case)?cmp *\(.*\"($pat)\"" || true)
[ -z "$hits" ] || say "configuration words compared as strings (use the enum of words.h):
$hits"

# 2: attribute calls only in h5attr.c
hits=$(find "$src" -name '*.c' -o -name '*.h' | sort | grep -v '/h5attr\.[ch]$' |
  xargs grep -nE '\bH5A[a-z_]+ *\(' || true)
[ -z "$hits" ] || say "HDF5 attribute calls outside src/h5attr.c:
$hits"

# 3: train.c sees the backends through backend.h only
hits=$(grep -nE '#include *"backend/' "$src/train.c" | grep -v '"backend/backend.h"' || true)
[ -z "$hits" ] || say "train.c includes backend internals:
$hits"

# 4: communicators made in grid.c only
hits=$(find "$src" -name '*.c' | sort | grep -v -e '/grid\.c$' -e '/mpi_yield\.c$' |
  xargs grep -nE '\bMPI_Comm_(split|split_type|create|create_group|dup|idup) *\(' || true)
[ -z "$hits" ] || say "communicators made outside src/grid.c:
$hits"

# 5: include circles
python3 - "$src" <<'PY' || bad=1
import os, re, sys
root = sys.argv[1]
files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
         if f.endswith(('.c', '.h', '.cu', '.cuh'))]
def mod(p):
    m = os.path.splitext(os.path.relpath(p, root))[0]
    for private in ('_impl', '_common'):
        if m.endswith(private) and p.endswith(('.h', '.cuh')):
            return m[:-len(private)]
    return m
mods = {mod(f) for f in files}
g = {m: set() for m in mods}
for f in files:
    for line in open(f, errors='replace'):
        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        if m:
            t = mod(os.path.normpath(os.path.join(os.path.dirname(f), m.group(1))))
            if t in mods and t != mod(f):
                g[mod(f)].add(t)
index, low, stack, on, circles = {}, {}, [], set(), []
def visit(v):
    index[v] = low[v] = len(index); stack.append(v); on.add(v)
    for w in sorted(g[v]):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: circles.append(sorted(comp))
sys.setrecursionlimit(10000)
for v in sorted(g):
    if v not in index: visit(v)
for c in circles:
    print("FAIL: include circle between modules: " + " -> ".join(c), file=sys.stderr)
sys.exit(1 if circles else 0)
PY
[ "$bad" = 0 ] && echo "code rules hold: no word strcmp, no H5A outside h5attr.c, train.c via backend.h, communicators from grid.c, no include circle"
exit "$bad"
