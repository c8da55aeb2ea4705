#!/bin/sh
# House rules of src/ that a compiler does not check (src/README.md):
#  1. no string comparison on a configuration word outside config.c, namelist.c and words.c
#     (config_load turns every word into its enum, words.h);
#  2. no HDF5 attribute call (H5A...) outside the attribute module h5attr.c;
#  3. train.c includes nothing under backend/ but backend/backend.h;
#  4. every communicator made in grid.c (no MPI_Comm_split/_split_type/_create/_dup elsewhere;
#     mpi_yield.c only wraps them);
#  5. no circle between the modules of src/, includes and calls together (a module:
#     NAME.c/.h/.cu/.cuh, with its private header NAME_impl.h or NAME_common.cuh, shared by
#     the files that implement it). The includes are read from the sources; the calls from
#     the built objects' symbol tables (nm: each object's undefined symbols, resolved to the
#     module whose object defines them), so an object under $KD_BUILDDIR/src is needed for
#     every src/*.c: make check builds them before this test; this test builds nothing and
#     fails when one is missing or older than its source. Run by hand without KD_BUILDDIR,
#     it reads the objects under $KD_SRCDIR/src when all are there, else checks includes
#     only and says so. Each circle is printed with the includes and symbols of its edges;
#     the circles of KNOWN_CIRCLES (below) are tolerated until removed (issue 37), and an
#     entry that is no longer a circle fails, so that list only shrinks;
#  6. no model family named outside the arch table and the converter (words.[ch], arch.[ch],
#     tools/hfconfig.c, tools/convert_hf.c, and selftest.c's fixtures): no KD_ARCH_<NAME> of
#     KD_ARCH_LIST, no call of a family test (a function or macro of a header whose body
#     names a KD_ARCH_<NAME>, such as card_gemma), no switch on an arch, no family word in a
#     string comparison. The files of KNOWN_FAMILY_CHECKS (below) are tolerated until
#     cleaned (issue 37); an entry without hits fails, so that list only shrinks.
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

# 5: circles between modules, includes and calls
#
# KNOWN_CIRCLES: the circles of today, tolerated and printed as "known, to be removed
# (issue 37)"; one per line, the set of its modules (paths under src/ without extension;
# "cuda:MODULE": a member only in a --with-cuda build, one that compiled backend/cuda.cu).
# A circle is tolerated when it equals an entry; an entry that equals no circle fails the
# test: remove it from the list, or shrink it to what remains. Empty today: the backends'
# circles are gone (issue 37: backend_check in backend.c, the CPU op files on cpu_base.c,
# cuda_scratch through the table, the device count asked by select.c).
KNOWN_CIRCLES=''
# The objects: those of make check's build directory; by hand, an in-tree build's if any.
if [ -n "${KD_BUILDDIR:-}" ]; then
  objdir=$KD_BUILDDIR/src need_objects=1
else
  objdir=$src need_objects=0
fi
nmout=$(mktemp)
trap 'rm -f "$nmout"' EXIT
# nm over every object under the build's src/ (automake's per-program objects included:
# the mapping back to their sources is below); "-A -P": "file: symbol type value size"
find "$objdir" -name '*.o' | sort | xargs -r nm -A -P > "$nmout" ||
  say "nm failed on the objects under $objdir"
KNOWN_CIRCLES=$KNOWN_CIRCLES python3 - "$src" "$objdir" "$need_objects" "$nmout" <<'PY' || bad=1
import collections, os, re, sys
root, objdir, need_objects, nmfile = sys.argv[1], sys.argv[2], sys.argv[3] == '1', sys.argv[4]
fail = []
def say(msg):
    fail.append(msg)
    print('FAIL: ' + msg, file=sys.stderr)

files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
               if f.endswith(('.c', '.h', '.cu', '.cuh')))
def private_owner(p):
    m = os.path.splitext(os.path.relpath(p, root))[0]
    for private in ('_impl', '_common'):
        if m.endswith(private) and p.endswith(('.h', '.cuh')):
            return m[:-len(private)]
    return None
# a source file that includes a module's private header implements that module
# (weights_card.c with weights_impl.h is part of weights)
owner = {}
for f in files:
    if not f.endswith(('.c', '.cu')):
        continue
    for line in open(f, errors='replace'):
        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        o = m and private_owner(os.path.normpath(os.path.join(os.path.dirname(f), m.group(1))))
        if o:
            owner[f] = o
def mod(p):
    return private_owner(p) or owner.get(p) or os.path.splitext(os.path.relpath(p, root))[0]
mods = {mod(f) for f in files}
# compiled: each source's stem (path under src/ without extension) -> the file
compiled = {os.path.splitext(os.path.relpath(f, root))[0]: f for f in files
            if f.endswith(('.c', '.cu'))}
# edges[(a, b)]: why module a depends on module b ("includes x.h", "calls f")
edges = collections.defaultdict(lambda: {'inc': set(), 'sym': set()})
for f in files:
    for line in open(f, errors='replace'):
        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        if m:
            t = mod(os.path.normpath(os.path.join(os.path.dirname(f), m.group(1))))
            if t in mods and t != mod(f):
                edges[(mod(f), t)]['inc'].add('%s includes %s' % (
                    os.path.relpath(f, root), m.group(1)))

# the objects, each mapped back to its source: dir/NAME.o or automake's
# dir/PROGRAM-NAME.o for src/dir/NAME.c or .cu; other objects are not src/ code
def source_of(obj):
    rel = os.path.relpath(obj, objdir)
    d, base = os.path.split(rel[:-2])
    for stem in (base, base.split('-', 1)[-1]):
        m = os.path.normpath(os.path.join(d, stem))
        if m in compiled and not m.endswith(('_impl', '_common')):
            return m
    return None
nm = collections.defaultdict(list)
for line in open(nmfile, errors='replace'):
    obj, sep, rest = line.partition(': ')
    f = rest.split()
    if sep and len(f) >= 2:
        nm[obj].append((f[0], f[1]))
objmod = {o: source_of(o) and mod(compiled[source_of(o)]) for o in nm}
built = {m for m in objmod.values() if m}
# objects that are missing or older than their source; an older object beside a newer one of
# the same source is a leftover of another build's layout, and is not read
stale = []
for m, f in sorted(compiled.items()):
    objs = [o for o in objmod if source_of(o) == m]
    old = [o for o in objs if os.path.getmtime(o) < os.path.getmtime(f)]
    if f.endswith('.c') and not objs:
        stale.append('no object for src/%s' % os.path.relpath(f, root))
    elif old and len(old) == len(objs):
        stale.append('%s is older than src/%s' % (old[0], os.path.relpath(f, root)))
    else:
        for o in old:
            objmod[o] = None
calls = not stale
if stale and need_objects:
    say('the call graph needs the built objects of src/ (make builds them; this test builds '
        'nothing): ' + '; '.join(stale[:5]) + (' (and %d more)' % (len(stale) - 5)
                                               if len(stale) > 5 else ''))
elif stale:
    print('note: calls not checked (no KD_BUILDDIR, and %s): includes only' % stale[0])
if calls:
    strong, weak, undef = (collections.defaultdict(set) for _ in range(3))
    for o, syms in nm.items():
        m = objmod[o]
        if not m:
            continue
        for name, t in syms:
            if t in 'Uvw':  # v, w: a weak reference
                undef[m].add(name)
            elif t in 'TDBRCGS':
                strong[name].add(m)
            elif t in 'WVu':  # weak or unique: inline and template copies
                weak[name].add(m)
    for m, names in undef.items():
        for name in names:
            d = strong.get(name) or weak.get(name, set())
            if len(d) == 1:  # defined more than once: inline or template copies, not a call
                (t,) = d
                if t != m:
                    edges[(m, t)]['sym'].add(name)

g = collections.defaultdict(set)
for a, b in edges:
    g[a].add(b)
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
        if len(comp) > 1: circles.append(frozenset(comp))
sys.setrecursionlimit(10000)
for v in sorted(g):
    if v not in index: visit(v)

def show(c):
    out = []
    for (a, b), why in sorted(edges.items()):
        if a in c and b in c:
            what = sorted(why['inc'])
            if why['sym']:
                what.append('calls ' + ', '.join(sorted(why['sym'])))
            out.append('    %s -> %s: %s' % (a, b, '; '.join(what)))
    return '\n'.join(out)
# the entries, their cuda: members only in a build that compiled the CUDA backend
cuda = 'backend/cuda' in built
known = []
for line in os.environ.get('KNOWN_CIRCLES', '').splitlines():
    entry = frozenset(re.sub('^cuda:', '', m) for m in line.split()
                      if cuda or not m.startswith('cuda:'))
    if entry:
        known.append((line.strip(), entry))
what = 'includes and calls' if calls else 'includes'
for c in sorted(circles, key=sorted):
    names = ' '.join(sorted(c))
    if any(c == k for _, k in known):
        print('known, to be removed (issue 37): circle (%s) between %s\n%s' % (what, names, show(c)))
        continue
    near = [l for l, k in known if k & c]
    say('circle (%s) between modules %s%s:\n%s' % (
        what, names, ' (KNOWN_CIRCLES has "%s": not this set)' % near[0] if near else '',
        show(c)))
if calls:
    for line, k in known:
        if k not in circles:
            left = [' '.join(sorted(c)) for c in circles if c & k]
            say('KNOWN_CIRCLES entry "%s" is no longer a circle%s: remove it from the list%s'
                % (line, ' (now: %s)' % ' / '.join(left) if left else '',
                   ', or shrink it to what remains' if left else ''))
elif known:
    print('note: KNOWN_CIRCLES not compared (no call graph)')
sys.exit(1 if fail else 0)
PY

# 6: model families named only in the arch table and the converter
#
# FAMILY_FILES: where a family may be named: the word list (words.[ch]), the arch table
# (arch.[ch]: each family's traits), the converter's name mapping (tools/hfconfig.c,
# tools/convert_hf.c) and the self-test's fixtures (selftest.c). Paths under src/.
FAMILY_FILES='words.h words.c arch.h arch.c tools/hfconfig.c tools/convert_hf.c selftest.c'
# KNOWN_FAMILY_CHECKS: the files that still name families today, tolerated and printed as
# "known, to be removed (issue 37)"; a file here without hits fails: remove it from the list.
KNOWN_FAMILY_CHECKS=''
FAMILY_FILES=$FAMILY_FILES KNOWN_FAMILY_CHECKS=$KNOWN_FAMILY_CHECKS \
  python3 - "$src" <<'PY' || bad=1
import os, re, sys
root = sys.argv[1]
allowed = set(os.environ['FAMILY_FILES'].split())
known = os.environ['KNOWN_FAMILY_CHECKS'].split()
fail = []
def say(msg):
    fail.append(msg)
    print('FAIL: ' + msg, file=sys.stderr)

words_h = open(os.path.join(root, 'words.h')).read()
m = re.search(r'#define KD_ARCH_LIST\(X\)((?:[^\n]*\\\n)*[^\n]*)', words_h)
archs = re.findall(r'X\((KD_ARCH_\w+), *"(\w+)"\)', m.group(1)) if m else []
if not archs:
    say('no KD_ARCH_LIST in src/words.h')
    sys.exit(1)
ids = '|'.join(a for a, _ in archs)
names = '|'.join(w for _, w in archs)
family_id = re.compile(r'\b(%s)\b' % ids)

# each file without its comments (newlines kept: the line numbers hold); strings kept in
# text, blanked in code
tok = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
def strip(s, keep_strings):
    def rep(m):
        t = m.group(0)
        if t[0] == '/':
            return re.sub(r'[^\n]', ' ', t)
        return t if keep_strings else t[0] + ' ' * (len(t) - 2) + t[-1]
    return tok.sub(rep, s)
files = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root)
               for f in fs if f.endswith(('.c', '.h', '.cu', '.cuh')))
text = {f: open(os.path.join(root, f), errors='replace').read() for f in files}
code = {f: strip(text[f], False) for f in files}

# the family tests: functions and function-like macros of a header whose body names a family
tests, defs = set(), set()
for f in files:
    if not f.endswith(('.h', '.cuh')) or f == 'words.h':
        continue
    c = code[f]
    for m in re.finditer(r'^[A-Za-z_][\w \t*]*?\b(\w+)\s*\([^;{}()]*\)\s*\{', c, re.M):
        depth, i = 0, m.end() - 1
        while i < len(c):
            depth += {'{': 1, '}': -1}.get(c[i], 0)
            if depth == 0:
                break
            i += 1
        if family_id.search(c, m.end(), i):
            tests.add(m.group(1)); defs.add((f, m.start(1)))
    for m in re.finditer(r'^[ \t]*#[ \t]*define[ \t]+(\w+)\(((?:[^\n]*\\\n)*[^\n]*)', c, re.M):
        if family_id.search(m.group(2)):
            tests.add(m.group(1)); defs.add((f, m.start(1)))
rules = [(family_id, 'family %s named')]
if tests:
    rules.append((re.compile(r'\b(%s)\s*\(' % '|'.join(sorted(tests))), 'family test %s called'))
rules.append((re.compile(r'\bswitch\s*\(([^;{}]*?\barch)\s*\)'), 'switch on %s'))
strcmp = re.compile(r'\b(str(?:n)?(?:case)?cmp|memcmp)\s*\([^;{}]*?"(%s)"' % names)

hits = {}
for f in files:
    if f in allowed:
        continue
    found = []
    c = code[f]
    for rx, what in rules:
        for m in rx.finditer(c):
            if (f, m.start(1)) not in defs:
                found.append((c.count('\n', 0, m.start()) + 1, what % m.group(1)))
    cs = strip(text[f], True)
    for m in strcmp.finditer(cs):
        found.append((cs.count('\n', 0, m.start()) + 1, '"%s" compared' % m.group(2)))
    if found:
        hits[f] = sorted(set(found))
print('family tests (header functions naming a family): ' + (' '.join(sorted(tests)) or 'none'))
for f, found in sorted(hits.items()):
    where = ', '.join('%d' % n for n in sorted({n for n, _ in found}))
    if f in known:
        print('known, to be removed (issue 37): src/%s names families on lines %s' % (f, where))
    else:
        lines = text[f].split('\n')
        say('model family named outside the arch table and the converter (%s; use a trait '
            'of the arch table):\n%s' % (' '.join(sorted(allowed)), '\n'.join(
                'src/%s:%d: %s: %s' % (f, n, w, lines[n - 1].strip()) for n, w in found)))
for f in known:
    if f not in hits:
        say('KNOWN_FAMILY_CHECKS lists %s, which names no family any more: remove it from the '
            'list' % f)
sys.exit(1 if fail else 0)
PY
[ "$bad" = 0 ] && echo "code rules hold: no word strcmp, no H5A outside h5attr.c, train.c via backend.h, communicators from grid.c, no module circle (beyond the known ones), no family named outside the arch table and the converter (beyond the known files)"
exit "$bad"
