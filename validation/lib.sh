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

# kd_convert_roles: kdconvert from-hf of the Hugging Face directories hf_teacher and hf_student
# (a reference script's models) into teacher.h5 / student.h5 and their cards teacher.nml /
# student.nml; a failure prints kdconvert's output and fails the test.
kd_convert_roles() {
  for role in teacher student; do
    "${KD_BUILDDIR:-$KD_SRCDIR}/src/tools/kdconvert" from-hf "hf_$role" "$role.h5" \
      > "convert_$role.txt" 2>&1 || { cat "convert_$role.txt"; fail "kdconvert from-hf $role"; }
  done
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
&data format = 'bytes', train = '$1', seq_len = 16 /
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
    for (c = 2; c <= 6; c += 4) { a = $c; b = $(c + NF / 2); d = a - b; if (d < 0) d = -d;
      if (d > 1e-5 * (a < 0 ? -a : a)) { print what ": step " $1 " column " c ": " a " vs " b; bad = 1 } } }
    END { if (n != rows) { print what ": " n " step rows"; bad = 1 } exit bad }'
}

# --- the family tests (mpi/test_qwen3.sh, test_gemma3.sh, test_window.sh) ----------------
# kd_family_nml TEACHER STUDENT: base.nml of a family test (3 fp32 steps of card STUDENT
# distilled from card TEACHER's teacher/final.h5, global batch 4, seq_len 16; the
# reference run's out_dir is ref); kd's console goes to log.txt.
kd_family_nml() {
  cat > base.nml <<EOF2
&run mode = 'distill', steps = 3, seed = 3, out_dir = 'ref' /
&teacher card = '$1', init = 'teacher/final.h5' /
&student card = '$2', init = 'random' /
&parallel micro_batch = 1, global_batch = 4 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 16 /
&loss kind = 'fkl', alpha = 0.5, temperature = 2.0 /
&optim lr = 1e-2, warmup = 1 /
&precision compute = 'fp32' /
EOF2
  kd_log=log.txt
}

# kd_cols RUN: step, loss and grad_norm of the step rows of RUN/metrics.csv
kd_cols() { awk -F, 'NR > 1 && $2 != "" { print $1, $2, $6 }' "$1/metrics.csv"; }

# kd_bitwise A B: runs A and B have the same losses and gradient norms, bit for bit as printed
kd_bitwise() {
  kd_cols "$1" > a.txt
  kd_cols "$2" > b.txt
  [ -s a.txt ] && cmp -s a.txt b.txt || { paste a.txt b.txt; fail "$2 differs from $1"; }
  echo "ok $2 = $1"
}

# kd_plan_exact NP NAME [overrides]: run base.nml on NP ranks into NAME, then --dry-run's
# per-rank plan equals the measured peaks to the byte
kd_plan_exact() {
  np=$1 name=$2; shift 2
  kd "$np" run%out_dir="'$name'" "$@"
  awk '/^memory peaks per rank/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print $1, $3, $4, $5, $6, $7, $8 }' \
    log.txt > measured.txt
  if [ "$np" -eq 1 ]; then launch=""; else launch="$MPIEXEC -n $np"; fi
  $launch "$KDTRAIN" --dry-run --bytes --ranks "$np" base.nml "$@" > plan.txt 2>&1 || { cat plan.txt; fail "dry run $np $*"; }
  awk '/^  rank/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print $1, $2, $3, $4, $5, $6, $7 }' \
    plan.txt > predicted.txt
  [ "$(wc -l < measured.txt)" -eq "$np" ] || { cat log.txt; fail "$name: no per-rank memory table"; }
  cmp -s measured.txt predicted.txt || { paste measured.txt predicted.txt; fail "$name: plan != peaks"; }
  echo "ok plan = peaks: $name on $np rank(s) $*"
}

# kd_family_layouts: tp 2, pp 2 and tp 2 x pp 2 with ZeRO-1 give the losses and gradient
# norms of the one-rank run ref within 1e-5 at each of 3 steps
kd_family_layouts() {
  for layout in "2 1 0" "1 2 0" "2 2 1"; do
    set -- $layout
    out="l_$1$2_z$3"
    kd $(($1 * $2)) parallel%tp=$1 parallel%pp=$2 parallel%zero=$3 run%out_dir="'$out'"
    kd_same_metrics ref "$out" "tp=$1 pp=$2 zero=$3" 3 || fail "layout tp=$1 pp=$2 zero=$3"
    echo "ok tp=$1 pp=$2 zero=$3"
  done
}

# kd_family_memory: recompute full/selective and offload give bitwise the losses of
# recompute 'none' in fp32 and bf16, and --dry-run equals the measured peaks to the byte on
# 1, 2 and 4 ranks
kd_family_memory() {
  kd_plan_exact 1 none
  kd_plan_exact 1 full memory%recompute="'full'" memory%recompute_every=2
  kd_plan_exact 1 sel memory%recompute="'selective'"
  kd_plan_exact 1 off memory%offload=.true. memory%recompute="'full'"
  for v in full sel off; do kd_bitwise none $v; done
  kd_plan_exact 1 bnone precision%compute="'bf16'"
  kd_plan_exact 1 bsel precision%compute="'bf16'" memory%recompute="'selective'" memory%offload=.true.
  kd_bitwise bnone bsel
  kd_plan_exact 2 tpbf16 parallel%tp=2 precision%compute="'bf16'" memory%recompute="'full'"
  kd_plan_exact 2 ppsel parallel%pp=2 memory%recompute="'selective'"
  kd_plan_exact 4 tpppzero parallel%tp=2 parallel%pp=2 parallel%zero=1 precision%compute="'bf16'"
}

# kd_family_devsim: tp 2 on the simulated device gives the CPU's metrics and final weights
# bit for bit, in fp32 and bf16
kd_family_devsim() {
  for p in fp32 bf16; do
    kd 2 parallel%tp=2 run%device="'cpu'" precision%compute="'$p'" run%out_dir="'cpu_$p'"
    kd 2 parallel%tp=2 run%device="'devsim'" precision%compute="'$p'" run%out_dir="'sim_$p'"
    grep -q "backend devsim" log.txt || { cat log.txt; fail "the devsim run did not report its backend"; }
    kd_bitwise "cpu_$p" "sim_$p"
    h5diff "cpu_$p/final.h5" "sim_$p/final.h5" /params /params > /dev/null \
      || fail "$p: final weights differ between cpu and devsim"
  done
}

# --- the reference step (e2e/test_ref_step.sh, e2e/test_families.sh) ---------------------
# kd_ref_step FAMILY KIND ALPHA TEMPERATURE BETA T2_SCALE LAYOUT SEQ_LEN: the teacher and
# student validation/ref/ref_step.py wrote into FAMILY/hf_teacher and hf_student through
# kdconvert from-hf, then one fp32 kdtrain step ('distill', &loss KIND ALPHA TEMPERATURE
# BETA, t2_scale T or F) of FAMILY/tokens.h5's two windows of SEQ_LEN in micro-batches of
# 1: loss, loss_kd, loss_ce, grad_norm (and an MoE student's loss_aux) within 1e-4 relative
# of PyTorch's (FAMILY/ref.txt); tp 2 and pp 2 (and dp 2 when LAYOUT is dp) give the
# one-rank loss and gradient norm within 1e-5 (and loss_aux with dp). The caller reads its
# rows on a descriptor other than 0: mpiexec forwards its standard input to rank 0.
kd_ref_step() {
  rs_fam=$1 rs_kind=$2 rs_alpha=$3 rs_tau=$4 rs_beta=$5 rs_t2=$6 rs_second=$7 rs_T=$8
  rs_conv="${KD_BUILDDIR:-$KD_SRCDIR}/src/tools/kdconvert"
  echo "== $rs_fam: kdconvert from-hf, one step on 1 rank ($rs_kind), tp 2, pp 2$([ "$rs_second" = dp ] && echo ", dp 2")"
  for rs_role in teacher student; do
    "$rs_conv" from-hf "$rs_fam/hf_$rs_role" "$rs_fam/$rs_role.h5" > "$rs_fam/convert_$rs_role.txt" 2>&1 \
      || { cat "$rs_fam/convert_$rs_role.txt"; fail "$rs_fam: kdconvert from-hf $rs_role"; }
  done
  rs_t2_scale=$([ "$rs_t2" = T ] && echo .true. || echo .false.)
  kd_nml="$rs_fam/base.nml" kd_log=log.txt
  cat > "$kd_nml" <<EOF2
&run mode = 'distill', steps = 1, seed = 7, out_dir = '$rs_fam/r1' /
&teacher card = '$rs_fam/teacher.nml', init = '$rs_fam/teacher.h5' /
&student card = '$rs_fam/student.nml', init = '$rs_fam/student.h5' /
&parallel micro_batch = 1, global_batch = 2 /
&data train = '$rs_fam/tokens.h5', format = 'h5', seq_len = $rs_T /
&loss kind = '$rs_kind', alpha = $rs_alpha, temperature = $rs_tau, beta = $rs_beta, t2_scale = $rs_t2_scale /
&optim lr = 1e-2, warmup = 1 /
&precision compute = 'fp32' /
EOF2
  kd 1
  kd_ref_same "$rs_fam" || fail "$rs_fam: kdtrain's step is not PyTorch's"
  rs_dp2=
  [ "$rs_second" = dp ] && rs_dp2="1 1" # two ranks of tp 1, pp 1: dp 2
  for rs_layout in "2 1" "1 2" ${rs_dp2:+"$rs_dp2"}; do
    set -- $rs_layout
    kd 2 parallel%tp=$1 parallel%pp=$2 run%out_dir="'$rs_fam/r$1$2'"
    kd_same_metrics "$rs_fam/r1" "$rs_fam/r$1$2" "$rs_fam tp=$1 pp=$2" 1 || fail "$rs_fam: tp=$1 pp=$2"
    [ "$rs_second" = dp ] && { kd_aux_same "$rs_fam/r1" "$rs_fam/r$1$2" "$rs_fam tp=$1 pp=$2" || fail "$rs_fam: loss_aux"; }
    echo "ok $rs_fam tp=$1 pp=$2 dp=$((2 / ($1 * $2))): the one-rank loss and gradient norm"
  done
}

# kd_ref_same FAMILY: loss, loss_kd, loss_ce, grad_norm (and an MoE student's loss_aux) of
# FAMILY/r1/metrics.csv (its one step row) within 1e-4 relative of PyTorch's (FAMILY/ref.txt)
kd_ref_same() {
  awk -F, -v fam="$1" 'NR == FNR { nref = split($0, ref, " "); next }
    FNR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $2 != "" { n++; line = fam ": kdtrain / PyTorch:"
      split("loss loss_kd loss_ce grad_norm loss_aux", k, " ")
      for (i = 1; i <= nref; i++) {
        if (!col[k[i]]) { print fam ": metrics.csv has no column " k[i]; bad = 1; continue }
        a = $(col[k[i]]); b = ref[i]; d = a - b; if (d < 0) d = -d
        r = d / (b < 0 ? -b : b); if (r > worst) worst = r
        line = line sprintf(" %s %.9g / %.9g", k[i], a, b) }
      print line sprintf(" | worst %.2e", worst) }
    END { if (n != 1) { print fam ": " n " step rows"; bad = 1 } exit bad || worst > 1e-4 }' \
    "$1/ref.txt" "$1/r1/metrics.csv"
}

# kd_aux_same RUN1 RUN2 WHAT: the loss_aux column of both runs' step rows within 1e-5 relative
kd_aux_same() {
  paste -d, "$1/metrics.csv" "$2/metrics.csv" | awk -F, -v what="$3" 'NR == 1 {
      for (i = 1; i <= NF / 2; i++) if ($i == "loss_aux") c = i; next }
    $2 != "" { a = $c; b = $(c + NF / 2); d = a - b; if (d < 0) d = -d
      if (a == "" || d > 1e-5 * (a < 0 ? -a : a)) { print what ": loss_aux " a " vs " b; bad = 1 } }
    END { exit bad || !c }'
}
