#!/bin/sh
# Memory benchmark of issue 5 (doc/memory.md, "Measured"): not part of make check.
#
#   validation/perf/memory.sh [--lengths "1024 4096 16384"] [--techs "none full sel offload tiled all"]
#   validation/perf/memory.sh --limit [--verify 2048] [--margin-gib 2]
#
# Table mode: a 1-rank fp32 distillation (mod/mem-teacher.nml -> mod/mem-student.nml, byte
# vocabulary, micro_batch 1, loss%chunk_tokens=0 with no budget: the chunk is the rows that
# fit in 1 GiB, i.e. all N rows for a 256-symbol vocabulary) at each sequence length with each
# technique; prints the measured arena peaks (kdtrain's "memory peaks per rank", rank 0), the
# --dry-run prediction of the device total, tok_per_s of the last step of metrics.csv
# (2 steps up to 4096 tokens, 1 step above) and the growth of the activation and loss peaks
# per 4x length.
#
# Limit mode: the longest seq_len whose --dry-run plan of mod/bench-long-teacher.nml ->
# mod/bench-long-student.nml (vocabulary 32768, micro_batch 1, loss chunk from the default
# 1 GiB) fits in MemTotal minus a margin, everything off against everything on, by bisection;
# on the CPU backend "host (offload)" is the same RAM, so device total + host must fit. Then
# real 1-step runs at --verify tokens (0: none) check that the plan equals the measured peaks.
#
# Run from the build tree root after make. Work files go to out/perf/memory/; every command
# is printed with the numbers it gives.
set -eu
cd "$(dirname "$0")/../.."
KDTRAIN=${KDTRAIN:-./src/kdtrain}
SRC=${KD_SRCDIR:-.}
W=out/perf/memory
LENGTHS="1024 4096 16384"
TECHS="none full sel offload tiled all"
LIMIT=0 VERIFY=2048 MARGIN=2
while [ $# -gt 0 ]; do
  case $1 in
    --lengths) LENGTHS=$2; shift 2 ;;
    --techs) TECHS=$2; shift 2 ;;
    --limit) LIMIT=1; shift ;;
    --verify) VERIFY=$2; shift 2 ;;
    --margin-gib) MARGIN=$2; shift 2 ;;
    *) echo "usage: $0 [--lengths L] [--techs T] | --limit [--verify T] [--margin-gib G]" >&2; exit 2 ;;
  esac
done
mkdir -p "$W"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

techargs() { # the &memory overrides of a technique name
  case $1 in
    none) echo "" ;;
    full) echo "memory%recompute='full'" ;;
    sel) echo "memory%recompute='selective'" ;;
    offload) echo "memory%offload=.true." ;;
    tiled) echo "memory%tiled_mlp=.true." ;;
    all) echo "memory%recompute='full' memory%offload=.true. memory%tiled_mlp=.true." ;;
    all*) echo "memory%recompute='full' memory%recompute_every=${1#all} memory%offload=.true. memory%tiled_mlp=.true." ;;
    *) echo "unknown technique $1" >&2; exit 2 ;;
  esac
}
# measured rank-0 peaks of a log: weights grads optim acts loss comm host scratch total
peaks() { awk '/^memory peaks per rank/ { on = 1; next } on && $1 == "0" { print $3, $4, $5, $6, $7, $8, $9, $10, $11; exit }' "$1"; }
# predicted rank-0 plan of a --dry-run output: weights grads optim acts loss comm host total
plan() { awk '/^  rank/ { on = 1; next } on && $1 == "0" { print $2, $3, $4, $5, $6, $7, $8, $9; exit }' "$1"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

# teacher INPUT CARD DIR: one mode='train' step of the teacher card at seq 64 (its weights)
teacher() {
  [ -f "$3/final.h5" ] && return 0
  cmd="$KDTRAIN $1 run%mode='train' student%card='$2' data%seq_len=64 run%out_dir='$3'"
  echo "# teacher weights: $cmd"
  eval "$cmd" > "$3.log" 2>&1 || { cat "$3.log"; exit 1; }
}

if [ "$LIMIT" -eq 0 ]; then
  cat > "$W/mem.nml" <<EOF
&run mode = 'distill', steps = 1, seed = 5 /
&teacher card = 'mem-teacher', init = '$W/teacher/final.h5' /
&student card = 'mem-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 1 /
&data train = '$SRC/input/corpus/kjv-train.txt', format = 'bytes', seq_len = 1024 /
&precision compute = 'fp32' /
&log every = 1 /
EOF
  teacher "$W/mem.nml" mem-teacher "$W/teacher"
  : > "$W/table.txt"
  : > "$W/commands.txt"
  printf '%7s %-8s %12s %12s %12s %12s %12s %9s\n' seq_len tech acts loss host total \
    "plan total" "tok/s" | tee -a "$W/table.txt"
  for T in $LENGTHS; do
    steps=1
    [ "$T" -gt 4096 ] || steps=2
    for t in $TECHS; do
      d="$W/T${T}_$t"
      cmd="$KDTRAIN $W/mem.nml data%seq_len=$T run%steps=$steps run%out_dir='$d' $(techargs "$t")"
      eval "nice -n 10 $cmd" > "$d.log" 2>&1 || { tail -5 "$d.log"; echo "FAILED: $cmd"; continue; }
      eval "$KDTRAIN --dry-run --bytes $W/mem.nml data%seq_len=$T $(techargs "$t")" > "$d.plan" 2>&1
      # shellcheck disable=SC2046 # the peaks are split into $1 .. $9 on purpose
      set -- $(peaks "$d.log")
      acts=$4 loss=$5 host=$7 total=$9
      ptot=$(plan "$d.plan" | awk '{ print $8 }')
      tps=$(awk -F, 'NR > 1 && $9 != "" { v = $9 } END { printf "%.0f", v }' "$d/metrics.csv")
      printf '%7s %-8s %12s %12s %12s %12s %12s %9s\n' "$T" "$t" "$acts" "$loss" "$host" \
        "$total" "$ptot" "$tps" | tee -a "$W/table.txt"
      echo "T=$T $t: $cmd" >> "$W/commands.txt"
    done
  done
  echo
  echo "growth per 4x sequence length (measured peaks; 4.00 = linear, 16.00 = quadratic)"
  printf '%-8s %-13s %8s %8s %8s\n' tech lengths acts loss total
  awk 'NR > 1 { a[$1 " " $2] = $3; l[$1 " " $2] = $4; t[$1 " " $2] = $6; lens[$1] = 1; techs[$2] = 1; order[++n] = $2 }
       END { for (i = 1; i <= n; i++) { k = order[i]; if (seen[k]++) continue;
               for (x in lens) { y = 4 * x; if ((y " " k) in a)
                 printf "%-8s %-13s %8.2f %8.2f %8.2f\n", k, x "->" y, a[y " " k] / a[x " " k],
                        l[y " " k] / l[x " " k], t[y " " k] / t[x " " k] } } }' "$W/table.txt" | sort -k1,1 -k2n
  echo
  echo "commands (from the build root; --dry-run with the same arguments gives 'plan total'):"
  cat "$W/commands.txt"
  exit 0
fi

# ---- limit mode
mem_kb=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)
budget=$(awk -v k="$mem_kb" -v m="$MARGIN" 'BEGIN { printf "%.0f", k * 1024 - m * 1073741824 }')
cat > "$W/long.nml" <<EOF
&run mode = 'distill', steps = 1, seed = 5 /
&teacher card = 'bench-long-teacher', init = '$W/long-teacher/final.h5' /
&student card = 'bench-long-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 1 /
&data train = '$SRC/input/corpus/kjv-train.txt', format = 'bytes', seq_len = 1024 /
&precision compute = 'fp32' /
&log every = 1 /
EOF
echo "budget: MemTotal $(mib $((mem_kb * 1024))) MiB - ${MARGIN} GiB margin (OS, MPI, BLAS, unplanned scratch) = $(mib "$budget") MiB for device total + host"
# need T TECH: predicted device total + host bytes at seq_len T
# shellcheck disable=SC2046 # the &memory overrides are separate words on purpose
# (the plan needs the teacher's card, not its weights: init='' before they exist)
need() { $KDTRAIN --dry-run --bytes "$W/long.nml" teacher%init="''" data%seq_len="$1" $(techargs "$2") 2>&1 |
         awk '/^  rank/ { on = 1; next } on && $1 == "0" { printf "%.0f\n", $8 + $9; exit }'; }
printf '%-6s %10s %14s %14s   %s\n' tech seq_len "needed MiB" "at +1 MiB" "command"
for t in none sel all1 all2 all4; do
  lo=1024 hi=2048
  [ "$(need $lo "$t")" -le "$budget" ] || { echo "$t: 1024 tokens do not fit"; continue; }
  while [ "$(need $hi "$t")" -le "$budget" ]; do lo=$hi; hi=$((hi * 2)); done
  while [ $((hi - lo)) -gt 1 ]; do
    mid=$(((lo + hi) / 2))
    if [ "$(need $mid "$t")" -le "$budget" ]; then lo=$mid; else hi=$mid; fi
  done
  printf '%-6s %10s %14s %14s   %s\n' "$t" "$lo" "$(mib "$(need $lo "$t")")" "$(mib "$(need $hi "$t")")" \
    "$KDTRAIN --dry-run --bytes $W/long.nml teacher%init=\"''\" data%seq_len=$lo $(techargs "$t")"
done
[ "$VERIFY" -gt 0 ] || exit 0
echo
echo "plan vs measured at seq_len $VERIFY (1 real step; columns weights grads optim acts loss comm host total)"
teacher "$W/long.nml" bench-long-teacher "$W/long-teacher"
for t in none all1; do
  d="$W/verify_${VERIFY}_$t"
  cmd="$KDTRAIN $W/long.nml data%seq_len=$VERIFY run%out_dir='$d' $(techargs "$t")"
  start=$(date +%s)
  eval "nice -n 10 $cmd" > "$d.log" 2>&1 || { tail -5 "$d.log"; echo "FAILED: $cmd"; continue; }
  secs=$(($(date +%s) - start))
  eval "$KDTRAIN --dry-run --bytes $W/long.nml data%seq_len=$VERIFY $(techargs "$t")" > "$d.plan" 2>&1
  m=$(peaks "$d.log" | awk '{ print $1, $2, $3, $4, $5, $6, $7, $9 }')
  p=$(plan "$d.plan")
  echo "$t measured: $m   (scratch $(peaks "$d.log" | awk '{ print $8 }'), ${secs} s wall)"
  echo "$t planned:  $p   $([ "$m" = "$p" ] && echo "(identical)" || echo "(DIFFERENT)")"
  echo "  $cmd"
done
