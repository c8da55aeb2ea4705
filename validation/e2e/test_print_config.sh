#!/bin/sh
# test_print_config.sh: --print-config output is a complete namelist that kdtrain reads
# back to the same text, and that gfortran's namelist read accepts (every group, every
# key); gfortran's own namelist output is read back by kdtrain to the same configuration.
# --print-config, --dry-run, --help and --version are one process without MPI_Init: their
# stdout is byte-identical when the MPI library prints at MPI_Init (a preloaded MPI_Init
# that prints, and a real MPI transport without /sys where a mount namespace is allowed)
# and when started by $MPIEXEC on 2 ranks.
set -u
. "${KD_SRCDIR:?}/validation/lib.sh"
KDTRAIN_MOD_PATH="$KD_SRCDIR/mod"; export KDTRAIN_MOD_PATH
run() { "$KDTRAIN" "$@"; }

head -c 3000 "$KD_SRCDIR/input/corpus/kjv-train.txt" > train.bin # windows for --dry-run's data summary
cp train.bin valid.bin
cp train.bin second.bin
cat > in.nml <<'NML'
! a sample input using most spellings the reader knows
&run mode = 'distill', steps = 50, seed = 42 /
&teacher card = 'test-teacher' /
&student card = "test-student", init = 'RANDOM' /
&parallel micro_batch = 2, global_batch = 8 /
&data format = 'bytes', train = 'train.bin', 'second.bin' valid = './valid.bin'
      weights = 0.7, 0.3, seq_len = 64, valid_every = 10 /
&loss kind = 'JSD' temperature = 2.D0 alpha = .5 beta = 0.25 t2_scale = F /
&optim lr = 1.5E-03, min_lr = 1*1e-5 warmup = 5 eps = 1.0d-8 /
&memory offload = .t. recompute = 'full' /
&log metrics = 'it''s "here".csv' level = 'debug'
&end
NML
run --print-config in.nml parallel%zero=1 > p1.nml || fail "print-config of in.nml"
run --print-config p1.nml > p2.nml || fail "print-config of its own output"
cmp p1.nml p2.nml || fail "print-config output read back differs"
for g in run teacher student parallel data loss optim precision memory checkpoint log; do
  grep -q "^&$g\$" p1.nml || fail "group &$g missing from print-config output"
done
grep -q "metrics = '.*/it''s \"here\".csv'" p1.nml || fail "quote doubling in strings"
grep -q "zero = 1" p1.nml || fail "command-line override not printed"
grep -q "^  train = '.*/train.bin', '.*/second.bin'\$" p1.nml || fail "list of train files"
grep -q "^  weights = 0.7, 0.3\$" p1.nml || fail "list of blend weights"
echo "ok: print-config is read back to the same text"

# --- stdout is the product: nothing an MPI library prints at MPI_Init reaches it ---
# shim.so: MPI_Init and MPI_Init_thread print a transport warning to stdout, as UCX does
# without /sys, then call the library's own
cat > shim.c <<'EOF2'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
static void warn(void) { printf("[shim] UCX  ERROR opendir(/sys/class/net) failed\n"); fflush(stdout); }
int MPI_Init(int *c, char ***v) {
  warn();
  return ((int (*)(int *, char ***))dlsym(RTLD_NEXT, "MPI_Init"))(c, v);
}
int MPI_Init_thread(int *c, char ***v, int req, int *prov) {
  warn();
  return ((int (*)(int *, char ***, int, int *))dlsym(RTLD_NEXT, "MPI_Init_thread"))(c, v, req, prov);
}
EOF2
${KD_CC:-cc} -shared -fPIC -o shim.so shim.c -ldl || fail "cannot build the MPI_Init shim"
# (sanitizer builds: the shim precedes the ASan runtime in the library list)
shim() { ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0 LD_PRELOAD=$PWD/shim.so "$@"; }
# the shim works: a training run calls MPI_Init (then stops at its missing input)
shim "$KDTRAIN" missing.nml > shim.out 2> /dev/null
grep -q '^\[shim\]' shim.out || fail "the MPI_Init shim printed nothing: this test cannot see MPI_Init"
# same WHAT FILE...: every file equals the first (byte for byte)
same() {
  what=$1 ref=$2; shift 2
  for f in "$@"; do cmp "$ref" "$f" || { diff "$ref" "$f" | head; fail "$what: $f differs from $ref"; }; done
}
shim "$KDTRAIN" --print-config in.nml parallel%zero=1 > s1.nml || fail "print-config with the shim"
shim $MPIEXEC -n 2 "$KDTRAIN" --print-config in.nml parallel%zero=1 > s2.nml \
  || fail "print-config with the shim on 2 ranks"
$MPIEXEC -n 2 "$KDTRAIN" --print-config in.nml parallel%zero=1 > m2.nml || fail "print-config on 2 ranks"
same "--print-config" p1.nml s1.nml s2.nml m2.nml
"$KDTRAIN" --dry-run in.nml > d1.txt || fail "dry-run"
shim "$KDTRAIN" --dry-run in.nml > d1s.txt || fail "dry-run with the shim"
same "--dry-run" d1.txt d1s.txt
$MPIEXEC -n 2 "$KDTRAIN" --dry-run in.nml > d2.txt || fail "dry-run on 2 ranks"
shim $MPIEXEC -n 2 "$KDTRAIN" --dry-run in.nml > d2s.txt || fail "dry-run on 2 ranks with the shim"
same "--dry-run on 2 ranks" d2.txt d2s.txt
grep -q '2 rank(s)' d2.txt || fail "--dry-run on 2 ranks does not plan for 2 ranks"
[ "$(grep -c '^ *[01] ' d2.txt)" -eq 2 ] || fail "--dry-run on 2 ranks: not one plan row per rank"
for opt in --help --version; do
  "$KDTRAIN" $opt > o1.txt || fail "$opt"
  shim $MPIEXEC -n 2 "$KDTRAIN" $opt > o2.txt || fail "$opt on 2 ranks with the shim"
  same "$opt" o1.txt o2.txt
done
echo "ok: --print-config, --dry-run, --help, --version: the same stdout with a printing MPI_Init"
# a real MPI transport without /sys (a private mount namespace hides it; root only)
if unshare -m sh -c 'mount -t tmpfs none /sys' 2> /dev/null; then
  unshare -m sh -c 'mount -t tmpfs none /sys && "$0" --print-config in.nml parallel%zero=1 > n1.nml &&
    '"$MPIEXEC"' -n 2 "$0" --print-config in.nml parallel%zero=1 > n2.nml' "$KDTRAIN" \
    || fail "print-config without /sys"
  same "--print-config without /sys" p1.nml n1.nml n2.nml
  echo "ok: --print-config without /sys is the same"
elif [ ! -d /sys/class ]; then
  "$KDTRAIN" --print-config in.nml parallel%zero=1 > n1.nml || fail "print-config without /sys"
  same "--print-config without /sys" p1.nml n1.nml
  echo "ok: --print-config without /sys (none here) is the same"
else
  echo "note: no mount namespace here: the run without /sys was left out"
fi

command -v gfortran > /dev/null 2>&1 || kd_skip "gfortran not found (./bootstrap --deps installs it)"
# One subroutine per group (keys repeat across groups): declared from the printed values; the
# namelist statement continued (&) every 6 keys, under the 132 columns of free-form source.
awk '
  /^&/ { g = substr($0, 2); n = 0; next }
  /^\// { printf "subroutine rd_%s(u, o)\n  integer :: u, o, ios\n", g
          for (i = 1; i <= n; i++) print "  " decl[i] " :: " key[i]
          printf "  namelist /%s/ ", g
          for (i = 1; i <= n; i++) printf "%s%s", key[i], (i < n ? (i % 6 ? ", " : ", &\n    ") : "\n")
          printf "  rewind(u)\n  read(u, nml=%s, iostat=ios)\n", g
          printf "  if (ios /= 0) then\n    print *, \"gfortran cannot read &%s\", ios\n    stop 1\n  end if\n", g
          printf "  write(o, nml=%s)\nend subroutine\n\n", g
          groups[++ng] = g; next }
  /=/ { k = $1; v = $0; sub(/^[^=]*= */, "", v); n++; key[n] = k
        if (v ~ /^'\''/) decl[n] = "character(len=512)"
        else if (v ~ /^\.(true|false)\.$/) decl[n] = "logical"
        else if (v ~ /[.eE]/) decl[n] = "real(8)"
        else decl[n] = "integer(8)"
        # a list (values outside quotes separated by ", "): an array of that many
        u = v; gsub(/'\''[^'\'']*'\''/, "s", u); nv = split(u, parts, ", ")
        if (nv > 1) decl[n] = decl[n] ", dimension(" nv ")" }
  END { print "program readback\n  open(10, file=\"p1.nml\", status=\"old\")"
        print "  open(11, file=\"gf.nml\", delim=\"apostrophe\")"
        for (i = 1; i <= ng; i++) printf "  call rd_%s(10, 11)\n", groups[i]
        print "  close(11)\nend program" }
' p1.nml > readback.f90
gfortran -o readback readback.f90 || fail "readback.f90 does not compile"
./readback || fail "gfortran namelist read of the print-config output"
nk=$(grep -c ' = ' p1.nml)
[ "$nk" -ge 50 ] || fail "only $nk keys printed"
run --print-config gf.nml > p3.nml || fail "kdtrain cannot read gfortran's namelist output"
cmp p1.nml p3.nml || fail "gfortran's namelist output reads back to a different configuration"
echo "ok: gfortran reads all $nk keys and kdtrain reads gfortran's output back"
