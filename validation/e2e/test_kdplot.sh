#!/bin/sh
# kdplot (src/tools/kdplot.py): metrics.csv of two runs (one distilled with validation
# rows, one plain training without loss parts) -> a PNG; --help exits 0; a file that
# is not a kdtrain metrics file is refused with exit 2 and its name.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
py=
for p in "${KD_PYTHON:-}" python3 /usr/bin/python3; do
  [ -n "$p" ] && "$p" -c "import matplotlib" > /dev/null 2>&1 && { py=$p; break; }
done
[ -n "$py" ] || kd_skip "no Python with matplotlib (Debian: apt-get install python3-matplotlib)"
kdplot() { "$py" "$KD_SRCDIR/src/tools/kdplot.py" "$@"; }
H=step,loss,loss_kd,loss_ce,lr,grad_norm,skipped,tokens,tok_per_s,mfu,mem_peak_bytes,val_loss
mkdir d b
{ echo "$H"
  for s in 1 2 3 4; do echo "$s,$((6 - s)).5,0.$s,$((6 - s)).1,0.001,0.9,0,$((s * 512)),12345.6,0.01,1048576,"; done
  echo "4,,,,,,,,,,,4.25"; } > d/metrics.csv
{ echo "$H"
  for s in 1 2 3 4; do echo "$s,$((7 - s)).5,,$((7 - s)).5,0.001,0.9,0,$((s * 512)),23456.7,0.01,1048576,"; done; } > b/metrics.csv
"$py" "$KD_SRCDIR/src/tools/kdplot.py" --help > help.txt || fail "kdplot --help: exit $?"
grep -q "usage: kdplot" help.txt || fail "kdplot --help prints no usage"
kdplot -o both.png --title "test" distilled=d b/metrics.csv > out.txt || { cat out.txt; fail "kdplot"; }
[ "$(head -c 4 both.png | od -An -c | tr -d ' ')" = "211PNG" ] || fail "both.png is not a PNG"
[ "$(wc -c < both.png)" -gt 10000 ] || fail "both.png is too small to hold the curves"
echo "not,a,metrics,file" > bad.csv
rc=0; kdplot -o bad.png bad.csv 2> err.txt || rc=$?
[ "$rc" -eq 2 ] && grep -q "bad.csv: not a kdtrain metrics file" err.txt || { cat err.txt; fail "bad input: exit $rc"; }
rc=0; kdplot nothere 2> err.txt || rc=$?
[ "$rc" -eq 2 ] || fail "missing file: exit $rc"
echo "ok kdplot"
