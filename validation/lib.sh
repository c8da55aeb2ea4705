# Sourced by the shell tests: the environment `make check` provides, a scratch
# directory (removed on exit) to work in, fail(), kd(), kd_skip(), kd_python_or_skip()
# and kd_same_metrics(). kd_here=1 before sourcing: work in the current directory
# instead (make check's: the build tree root). kd_bg=PIDS: processes killed (-9) when
# the test exits.
: "${KDTRAIN:?}" "${MPIEXEC:?}" "${KD_SRCDIR:?}"
kd_bg="" tmp=""
kd_exit() {
  [ -z "$kd_bg" ] || kill -9 $kd_bg 2> /dev/null || :
  [ -z "$tmp" ] || rm -rf "$tmp"
}
trap kd_exit EXIT
if [ -z "${kd_here:-}" ]; then
  tmp=$(mktemp -d) || exit 1
  cd "$tmp" || exit 1
fi
fail() { echo "FAIL: $*" >&2; exit 1; }

# kd NP WORD...: kdtrain on NP ranks with $kd_nml (default base.nml) and the override
# words; its output and status are the caller's, or with kd_log=FILE its console goes
# to FILE, printed (its last $kd_log_tail lines if set) when the run fails the test.
kd() {
  np=$1; shift
  if [ -z "${kd_log:-}" ]; then
    $MPIEXEC -n "$np" "$KDTRAIN" "${kd_nml:-base.nml}" "$@"
  elif ! $MPIEXEC -n "$np" "$KDTRAIN" "${kd_nml:-base.nml}" "$@" > "$kd_log" 2>&1; then
    if [ -n "${kd_log_tail:-}" ]; then tail -n "$kd_log_tail" "$kd_log"; else cat "$kd_log"; fi
    fail "run on $np rank(s): $*"
  fi
}

# kd_skip REASON: skip the test (exit 77, the reason in the log and the make check
# summary); under CI (the variable CI set) every test must run, so this fails instead.
kd_skip() {
  if [ -n "${CI:-}" ]; then fail "$* (CI is set: a test may not skip)"; fi
  echo "SKIP: $*"
  exit 77
}

# kd_python_or_skip MODULE...: $KD_PYTHON (default python3; make check sets it to the
# test environment, validation/python-env.sh) imports every MODULE, or kd_skip.
kd_python_or_skip() {
  KD_PYTHON=${KD_PYTHON:-python3}
  "$KD_PYTHON" -c "import warnings; warnings.simplefilter('ignore')
import sys, importlib
for m in sys.argv[1:]: importlib.import_module(m)" "$@" > /dev/null 2>&1 \
    || kd_skip "$KD_PYTHON cannot import $* (validation/python-env.sh installs them)"
}

# kd_layout_nml TRAIN [TEACHER_KEYS]: base.nml of the layout comparisons (5 fp32 steps of
# the test student distilled from teacher/final.h5 on TRAIN, seq_len 16, global batch 8),
# TEACHER_KEYS appended to &teacher (", cache = 'tc.h5'"); kd's console goes to log.txt.
kd_layout_nml() {
  cat > base.nml <<EOF2
&run mode = 'distill', steps = 5, seed = 3, out_dir = 'ref' /
&teacher card = 'test-teacher', init = 'teacher/final.h5'${2:-} /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 8 /
&data train = '$1', seq_len = 16 /
&loss kind = 'fkl', alpha = 0.5, temperature = 2.0 /
&optim lr = 1e-2, warmup = 1 /
&precision compute = 'fp32' /
EOF2
  kd_log=log.txt
}

# kd_test_teacher: train the tiny test teacher (card test-teacher, 2 steps) into teacher/
# with the test's base.nml: the teacher the distillation tests load as teacher/final.h5.
kd_test_teacher() {
  kd 1 run%mode=train student%card=test-teacher run%steps=2 run%out_dir="'teacher'" "$@"
}

# kd_same_metrics RUN1 RUN2 WHAT ROWS: the loss (column 2) and grad_norm (column 6) of
# every step row of RUN1/metrics.csv and RUN2/metrics.csv agree within 1e-5 relative,
# and each has ROWS step rows (the layout tests: one rank against a parallel layout).
kd_same_metrics() {
  paste -d, "$1/metrics.csv" "$2/metrics.csv" | awk -F, -v what="$3" -v rows="$4" 'NR > 1 && $2 != "" {
    n++
    for (c = 2; c <= 6; c += 4) { a = $c; b = $(c + 12); d = a - b; if (d < 0) d = -d;
      if (d > 1e-5 * (a < 0 ? -a : a)) { print what ": step " $1 " column " c ": " a " vs " b; bad = 1 } } }
    END { if (n != rows) { print what ": " n " step rows"; bad = 1 } exit bad }'
}
