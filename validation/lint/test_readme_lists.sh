#!/bin/sh
# validation/README.md lists every test: each test of Makefile.am's TESTS (LINT_TESTS,
# UNIT_TESTS, UNIT_SH_TESTS, MPI_TESTS, E2E_TESTS, FAULT_TESTS, read from Makefile.am with
# every conditional's assignments) has its row in "What each test proves", no row names a
# test TESTS lacks, every validation/*/test_*.sh and validation/*/test_*.c (a test script,
# or a Check program a script runs) is named there, and the count the README states
# ("make check runs N tests (... N lint, N unit Check programs, N unit script, N mpi, N e2e
# and N fault tests)") is the real one. FAIL lists what is missing or wrong.
set -eu
: "${KD_SRCDIR:?}"
python3 - "$KD_SRCDIR" <<'PY'
import os, re, sys
root = sys.argv[1]
fail = []
def say(msg):
    fail.append(msg)
    print('FAIL: ' + msg, file=sys.stderr)

# Makefile.am's assignments, continuation lines joined, every branch of a conditional taken
am = re.sub(r'\\\n', ' ', open(os.path.join(root, 'Makefile.am')).read())
vars = {}
for line in am.splitlines():
    m = re.match(r'([A-Za-z_][A-Za-z0-9_]*)\s*(\+?=)\s*(.*)$', line)
    if m and not line.startswith('#'):
        words = m.group(3).split('#')[0].split()
        vars[m.group(1)] = (vars.get(m.group(1), []) if m.group(2) == '+=' else []) + words
def expand(name, seen=()):
    out = []
    for w in vars.get(name, []):
        m = re.fullmatch(r'\$\((\w+)\)', w)
        if m and m.group(1) not in seen:
            out += expand(m.group(1), seen + (name,))
        elif not m:
            out.append(w)
    return out
tests = expand('TESTS')
if not tests:
    say('no TESTS in Makefile.am')
    sys.exit(1)
dups = sorted({t for t in tests if tests.count(t) > 1})
if dups:
    say('Makefile.am lists these tests twice in TESTS: ' + ' '.join(dups))
tests = sorted(set(tests))

readme = open(os.path.join(root, 'validation', 'README.md')).read()
m = re.search(r'^## What each test proves$(.*?)(?=^## |\Z)', readme, re.M | re.S)
if not m:
    say('validation/README.md has no section "## What each test proves"')
    sys.exit(1)
section = m.group(1)
rows = re.findall(r'^\| `([^`]+)` \|', section, re.M)
rowset = set(rows)
named = set(re.findall(r'`([^`\s]+)`', readme))

rel = lambda t: t[len('validation/'):] if t.startswith('validation/') else t
missing = [t for t in tests if rel(t) not in rowset]
if missing:
    say('validation/README.md has no row in "What each test proves" for:\n' +
        '\n'.join('  ' + rel(t) + '  (its first comment says what it proves)' for t in missing))
extra = sorted(r for r in rowset if 'validation/' + r not in tests)
if extra:
    say('validation/README.md has rows for tests not in Makefile.am\'s TESTS: ' + ' '.join(extra))
twice = sorted({r for r in rows if rows.count(r) > 1})
if twice:
    say('validation/README.md has two rows for: ' + ' '.join(twice))

# every test script and test program of validation/, named somewhere in the README
files = sorted(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, 'validation'))
               for f in fs if re.fullmatch(r'test_\w+\.(sh|c)', f))
unnamed = []
for f in files:
    r = os.path.relpath(f, os.path.join(root, 'validation'))
    base = os.path.basename(r)
    if not {r, os.path.splitext(r)[0], base, os.path.splitext(base)[0]} & named:
        unnamed.append(r)
if unnamed:
    say('validation/README.md does not name these tests of validation/:\n' +
        '\n'.join('  ' + u for u in unnamed))

# the stated count, and its split by kind
m = re.search(r'runs (\d+) tests\s*\(([^)]*)\)', readme)
if not m:
    say('validation/README.md does not say how many tests make check runs '
        '("make check runs N tests (...)"): it runs %d' % len(tests))
else:
    if int(m.group(1)) != len(tests):
        say('validation/README.md says make check runs %s tests; TESTS has %d'
            % (m.group(1), len(tests)))
    kinds = [('lint', 'LINT_TESTS'), ('unit Check programs?', 'UNIT_TESTS'),
             ('unit scripts?', 'UNIT_SH_TESTS'), ('mpi', 'MPI_TESTS'), ('e2e', 'E2E_TESTS'),
             ('fault', 'FAULT_TESTS')]
    split = re.sub(r'\s+', ' ', m.group(2))
    for words, var in kinds:
        n = len(set(expand(var)))
        k = re.search(r'(\d+) (%s)\b' % words, split)
        if not k:
            say('validation/README.md does not count the %s tests (%s: %d) in "runs %s tests (...)"'
                % (words.split('?')[0].rstrip('s'), var, n, m.group(1)))
        elif int(k.group(1)) != n:
            say('validation/README.md counts %s %s; %s has %d' % (k.group(1), k.group(2), var, n))
if fail:
    sys.exit(1)
print('validation/README.md lists the %d tests of TESTS, one row each, names the %d test '
      'files of validation/ and states their count' % (len(tests), len(files)))
PY
