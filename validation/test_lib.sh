# Sourced by the shell tests: the environment `make check` provides, a scratch
# directory (removed on exit) to work in, and fail().
: "${KDTRAIN:?}" "${MPIEXEC:?}" "${KD_SRCDIR:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*" >&2; exit 1; }
