#!/bin/sh
# python-env.sh [-r REQUIREMENTS] [LINK]: create (once) the virtual environment of the test
# suite's Python reference stack, validation/requirements.txt (or of REQUIREMENTS: `make
# tools-env` gives src/tools/requirements.txt, the packages of kdprep, kdgen and kdplot),
# and point LINK (default .venv) at it.
# The environment lives in a cache keyed by the requirements and the Python version,
# ${KD_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kdtrain}/venv-KEY, so rebuilds, other
# checkouts and `make clean` reuse it; a second call returns at once. The system Python
# is only used to run `python3 -m venv` (Debian: package python3-venv).
# Environment: KD_PYTHON_BASE (the Python that creates it, default python3),
# KD_TORCH_INDEX (where CPU-only torch is tried first; empty: PyPI only).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
req=$here/requirements.txt
if [ "${1:-}" = -r ]; then
  [ $# -ge 2 ] && [ -f "$2" ] || { echo "python-env: -r needs a requirements file" >&2; exit 1; }
  req=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
  shift 2
fi
link=${1:-.venv}
base=${KD_PYTHON_BASE:-python3}
torch_index=${KD_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
say() { echo "python-env: $*"; }

command -v "$base" > /dev/null 2>&1 || { say "no $base: install Python 3 (./bootstrap --deps)" >&2; exit 1; }
"$base" -c 'import venv, ensurepip' 2> /dev/null \
  || { say "$base cannot create virtual environments: install python3-venv (./bootstrap --deps)" >&2; exit 1; }
pyver=$("$base" -c 'import platform, sys; print(sys.version.split()[0], platform.machine())')
key=$({ cat "$req"; echo "$pyver"; } | sha256sum | cut -c1-12)
cache=${KD_VENV_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/kdtrain}
dir=$cache/venv-$key
mkdir -p "$cache"

# ready DIR: the environment is complete (its stamp, the import check that passed, is
# written last) and its Python starts
ready() { [ -f "$1/kdtrain-ready" ] && "$1/bin/python" -c '' 2> /dev/null; }

if ! ready "$dir"; then
  exec 9> "$dir.lock"
  flock 9 # another make check may be creating the same environment
  if ! ready "$dir"; then
    say "creating $dir (Python $pyver) from $req"
    t0=$(date +%s)
    rm -rf "$dir"
    "$base" -m venv "$dir"
    pip="$dir/bin/python -m pip --disable-pip-version-check --no-input"
    torch=$(grep '^torch\([=<>~ ]\|$\)' "$req" || :)
    if [ -z "$torch" ]; then
      : # no torch asked for
    elif [ -n "$torch_index" ] && "$dir/bin/python" -c "import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=10)" "$torch_index" > /dev/null 2>&1; then
      say "CPU-only torch from $torch_index"
      $pip install -q --index-url "$torch_index" "$torch" \
        || say "CPU-only torch failed: torch from PyPI instead"
    else
      say "$torch_index not reachable: torch from PyPI (CUDA build, runs on the CPU)"
    fi
    $pip install -q -r "$req"
    # the modules the tests import (megatron.core: the distribution megatron-core)
    mods=$(sed -e 's/#.*//' -e 's/[=<>~ ].*//' -e '/^$/d' -e 's/^megatron-core$/megatron.core/' "$req" \
      | tr '\n' ',' | sed 's/,$//')
    printf 'import warnings; warnings.simplefilter("ignore"); import %s\n' "$mods" > "$dir/check.py"
    TRANSFORMERS_VERBOSITY=error "$dir/bin/python" "$dir/check.py" || { say "the new environment cannot import $mods" >&2; exit 1; }
    mv "$dir/check.py" "$dir/kdtrain-ready"
    say "ready after $(($(date +%s) - t0)) s ($(du -sh "$dir" | cut -f1))"
  fi
  exec 9>&-
fi
if [ -e "$link" ] && [ ! -L "$link" ]; then
  say "$link exists and is not a link: left alone; the environment is $dir" >&2
  exit 1
fi
ln -sfn "$dir" "$link"
say "$link -> $dir"
