# Sourced by the shell tests: the environment `make check` provides, a scratch
# directory (removed on exit) to work in, fail(), kd_skip() and kd_python_or_skip().
: "${KDTRAIN:?}" "${MPIEXEC:?}" "${KD_SRCDIR:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*" >&2; exit 1; }

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
