#!/bin/sh
# kdtrain quickstart: train a teacher on the embedded corpus, distil a student from
# it, train the same student without the teacher, and compare validation losses.
# Run from the top of the source tree after ./configure && make.
set -e
cd "$(dirname "$0")/../.."
KDTRAIN=${KDTRAIN:-./src/kdtrain}
MPIEXEC=${MPIEXEC:-mpiexec}
NP=${NP:-1}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
run() { echo "== $MPIEXEC -n $NP $KDTRAIN $*"; $MPIEXEC -n "$NP" "$KDTRAIN" "$@"; }

start=$(date +%s)
run input/quickstart/teacher.nml "$@"
run input/quickstart/distill.nml "$@"
run input/quickstart/baseline.nml "$@"
end=$(date +%s)

# the last val_loss of each run's metrics
val() { awk -F, 'NR > 1 && $12 != "" { v = $12 } END { print v }' "$1/metrics.csv"; }
t=$(val out/qs-teacher); d=$(val out/qs-distill); b=$(val out/qs-baseline)
echo
echo "quickstart validation loss (hard-label cross entropy, nats/byte, held-out Gospel of John):"
echo "  teacher            $t"
echo "  distilled student  $d"
echo "  baseline student   $b   (same student, steps and tokens, no teacher)"
echo "  wall time          $((end - start)) s"
if awk -v d="$d" -v b="$b" 'BEGIN { exit !(d < b) }'; then
  echo "  => the distilled student is ahead by $(awk -v d="$d" -v b="$b" 'BEGIN { printf "%.4f", b - d }') nats/byte"
else
  echo "  => the distilled student is NOT ahead" >&2
  exit 1
fi
