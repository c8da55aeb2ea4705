#!/bin/sh
# Tokens/s and per-rank peak memory of a distillation step of the quickstart models
# on every layout that fits the given number of ranks (informational: on a 2-core
# machine every extra rank shares the same cores).
#   usage: validation/perf/layouts.sh [NP=4] [STEPS=4]   (after make; needs out/qs-teacher/final.h5
#          from input/quickstart/run.sh, or set TEACHER=path)
set -eu
cd "$(dirname "$0")/../.."
NP=${1:-4}
STEPS=${2:-4}
KDTRAIN=${KDTRAIN:-./src/kdtrain}
MPIEXEC=${MPIEXEC:-mpiexec}
TEACHER=${TEACHER:-out/qs-teacher/final.h5}
[ -f "$TEACHER" ] || { echo "no teacher weights $TEACHER: run input/quickstart/run.sh first" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%-14s %-5s %10s %16s\n' "tp pp dp" zero "tok/s" "max peak MiB"
for tp in 1 2; do for pp in 1 2; do
  dp=$((NP / (tp * pp)))
  [ $((tp * pp * dp)) -eq "$NP" ] || continue
  for zero in 0 1; do
    [ "$dp" -gt 1 ] || [ "$zero" -eq 0 ] || continue
    out="$tmp/o_${tp}${pp}${dp}${zero}"
    OMP_NUM_THREADS=1 $MPIEXEC -n "$NP" "$KDTRAIN" input/quickstart/distill.nml \
      teacher%init="'$TEACHER'" run%steps="$STEPS" run%out_dir="'$out'" parallel%tp=$tp \
      parallel%pp=$pp parallel%dp=$dp parallel%zero=$zero data%valid="''" > "$out.log" 2>&1 \
      || { echo "tp=$tp pp=$pp dp=$dp zero=$zero failed:"; tail -3 "$out.log"; continue; }
    # median tok/s of the steps after the first; largest arena peak of any rank
    tps=$(awk -F, 'NR > 2 && $9 != "" { print $9 }' "$out/metrics.csv" | sort -g |
          awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
    peak=$(awk -F, 'NR > 1 && $11 != "" { p = $11 } END { printf "%.1f", p / 1048576 }' "$out/metrics.csv")
    printf '%-14s %-5s %10.0f %16s\n' "$tp  $pp  $dp" "$zero" "$tps" "$peak"
  done
done; done
