#!/bin/sh
# test_bad_input.sh: a battery of malformed inputs, model cards and overrides. Each must
# make kdtrain exit 2 with one message that names the file and line (and the group/key
# where one applies), both with --print-config and in a plain run, and the plain run
# must not create its out_dir.
set -u
. "${KD_SRCDIR:?}/validation/lib.sh"
KDTRAIN_MOD_PATH="$KD_SRCDIR/mod"; export KDTRAIN_MOD_PATH
run1() { $MPIEXEC -n 1 "$KDTRAIN" "$@"; }
run2() { $MPIEXEC -n 2 "$KDTRAIN" "$@"; }

printf 'bytes\n' > train.bin
ncase=0 nfail=0

# check FILE WORD...: both runs of FILE exit 2 and print every WORD; no out_dir appears.
check() {
  f=$1; shift; ncase=$((ncase + 1))
  for mode in print plain; do
    if [ $mode = print ]; then out=$(run1 --print-config "$f" $extra 2>&1); rc=$?
    else out=$(run2 "$f" $extra "run%out_dir=$tmp/out" 2>&1); rc=$?; fi
    bad=""
    [ $rc -eq 2 ] || bad="exit status $rc, expected 2"
    for w in "$@"; do
      case "$out" in *"$w"*) ;; *) bad="${bad:+$bad; }message lacks '$w'" ;; esac
    done
    [ -e "$tmp/out" ] && bad="${bad:+$bad; }created its out_dir" && rm -rf "$tmp/out"
    if [ -n "$bad" ]; then
      nfail=$((nfail + 1)); echo "FAIL $f ($mode run): $bad"; echo "  output: $out"
    fi
  done
  extra=""
}
extra=""
cat > base.nml <<'NML'
&teacher card = 'test-teacher' /
&student card = 'test-student' /
&data format = 'bytes', train = 'train.bin' /
NML
b() { cat base.nml - > "$1"; } # a valid file, the defect from line 4 on

b grp.nml <<'NML'
&optm lr = 1e-4 /
NML
check grp.nml "grp.nml:4:" "unknown group '&optm'" "did you mean '&optim'"
b key.nml <<'NML'
&optim lrr = 1e-4 /
NML
check key.nml "key.nml:4:" "&optim" "'lrr'" "did you mean 'lr'"
b other.nml <<'NML'
&loss
  lr = 1e-4
/
NML
check other.nml "other.nml:5:" "&loss" "belongs to &optim"
b int.nml <<'NML'
&run steps = 1.5 /
NML
check int.nml "int.nml:4:" "&run steps" "integer"
b real.nml <<'NML'
&optim lr = fast /
NML
check real.nml "real.nml:4:" "&optim lr" "not a number"
b real2.nml <<'NML'
&optim lr = 1e-3e4 /
NML
check real2.nml "real2.nml:4:" "&optim lr" "not a number"
b logic.nml <<'NML'
&loss t2_scale = 'yes' /
NML
check logic.nml "logic.nml:4:" "&loss t2_scale" "logical"
b lr.nml <<'NML'
&optim lr = -1e-3 /
NML
check lr.nml "lr.nml:4:" "&optim lr" "out of range" "lr >= 0"
b temp.nml <<'NML'
&loss temperature = 0.0 /
NML
check temp.nml "temp.nml:4:" "&loss temperature" "temperature > 0"
b alpha.nml <<'NML'
&loss alpha = 1.5 /
NML
check alpha.nml "alpha.nml:4:" "&loss alpha" "0 <= alpha <= 1"
b beta.nml <<'NML'
&loss beta = 1.0 /
NML
check beta.nml "beta.nml:4:" "&loss beta" "0 < beta < 1"
cat > seq.nml <<'NML'
&teacher card = 'test-teacher' /
&student card = 'test-student' /
&data format = 'bytes', train = 'train.bin'
      seq_len = 0 /
NML
check seq.nml "seq.nml:4:" "&data seq_len" "seq_len >= 1"
b tp.nml <<'NML'
&parallel tp = 0 /
NML
check tp.nml "tp.nml:4:" "&parallel tp" "tp >= 1"
b big.nml <<'NML'
&parallel pp = 99999999999 /
NML
check big.nml "big.nml:4:" "&parallel pp" "out of range"
b choice.nml <<'NML'
&loss kind = 'fkx' /
NML
check choice.nml "choice.nml:4:" "&loss kind" "did you mean 'fkl'"
b str.nml <<'NML'
&run out_dir = 'abc /
NML
check str.nml "str.nml:4:" "&run out_dir" "unterminated string"
b eof.nml <<'NML'
&optim lr = 1e-3
NML
check eof.nml "eof.nml:4:" "&optim" "not closed"
b next.nml <<'NML'
&optim lr = 1e-3
&loss kind = 'rkl' /
NML
check next.nml "next.nml:4:" "&optim" "not closed before '&loss'"
b dupg.nml <<'NML'
&teacher card = 'test-teacher' /
NML
check dupg.nml "dupg.nml:4:" "&teacher" "twice"
b dupk.nml <<'NML'
&optim lr = 1e-3, lr = 2e-3 /
NML
check dupk.nml "dupk.nml:4:" "&optim lr" "given twice"
b rep.nml <<'NML'
&loss alpha = 3*0.5 /
NML
check rep.nml "rep.nml:4:" "&loss alpha" "3 values"
b two.nml <<'NML'
&run steps = 10 20 /
NML
check two.nml "two.nml:4:" "&run steps" "2 values"
b unq.nml <<'NML'
&run device = cpu /
NML
check unq.nml "unq.nml:4:" "&run device" "not quoted"
b noeq.nml <<'NML'
&optim lr 1e-3 /
NML
check noeq.nml "noeq.nml:4:" "&optim lr" "expected '='"
b arr.nml <<'NML'
&optim lr(1) = 1e-3 /
NML
check arr.nml "arr.nml:4:" "&optim lr" "not supported"
b out.nml <<'NML'
lr = 1e-3
NML
check out.nml "out.nml:4:" "outside a group"
b gb.nml <<'NML'
&parallel micro_batch = 3, global_batch = 8 /
NML
check gb.nml "gb.nml:4:" "&parallel global_batch" "micro_batch"
b dp.nml <<'NML'
&parallel dp = 3, global_batch = 8 /
NML
check dp.nml "dp.nml:4:" "&parallel global_batch" "micro_batch * dp"
b ep.nml <<'NML'
&parallel dp = 2, ep = 3 /
NML
check ep.nml "ep.nml:4:" "&parallel ep" "does not divide the data-parallel size dp = 2"
b minlr.nml <<'NML'
&optim lr = 1e-4,
       min_lr = 1e-3 /
NML
check minlr.nml "minlr.nml:5:" "&optim min_lr" "min_lr <= lr"
# reals are used as 32-bit floats: one that becomes 0 or inf there is refused
b tiny.nml <<'NML'
&loss temperature = 1e-50 /
NML
check tiny.nml "tiny.nml:4:" "&loss temperature" "not representable as a 32-bit float"
b huge.nml <<'NML'
&loss temperature = 1e39 /
NML
check huge.nml "huge.nml:4:" "&loss temperature" "not representable as a 32-bit float"
# a NUL byte would cut a string short: the file is refused, its line named
b nul.nml <<'NML'
&run seed = 7 /
NML
printf "&log level = 'in\000fo' /\n" >> nul.nml
check nul.nml "nul.nml:5:" "a NUL byte" "expected a text file"
# log%metrics in a directory that does not exist: refused before any work
b mdir.nml <<'NML'
&log metrics = 'no/such/dir/m.csv' /
NML
check mdir.nml "mdir.nml:4:" "&log metrics" "does not exist"
cat > teach.nml <<'NML'
&run mode = 'distill' /
&student card = 'test-student' /
&data format = 'bytes', train = 'train.bin' /
NML
check teach.nml "teach.nml:1:" "&teacher card" "missing"
cat > stud.nml <<'NML'
&run mode = 'train' /
&student init = 'random' /
&data format = 'bytes', train = 'train.bin' /
NML
check stud.nml "stud.nml:2:" "&student card" "missing"
cat > train.nml <<'NML'
&teacher card = 'test-teacher' /
&student card = 'test-student' /
&data format = 'bytes', seq_len = 64 /
NML
check train.nml "train.nml:3:" "&data train" "missing"
cat > nodata.nml <<'NML'
&teacher card = 'test-teacher' /
&student card = 'test-student' /
&data format = 'bytes', train = 'nope.bin' /
NML
check nodata.nml "nodata.nml:3:" "&data train" "nope.bin" "not found"
cat > maxpos.nml <<'NML'
&teacher card = 'test-teacher' /
&student card = 'test-student' /
&data format = 'bytes', train = 'train.bin', seq_len = 512 /
NML
check maxpos.nml "maxpos.nml:3:" "&data seq_len" "max_position_embeddings = 256"
cat > nocard.nml <<'NML'
&teacher card = 'test-teacher' /
&student card = 'tset-student' /
&data format = 'bytes', train = 'train.bin' /
NML
check nocard.nml "nocard.nml:2:" "&student card" "not found" "did you mean 'test-student'" "$KD_SRCDIR/mod"

# bad model cards: the message names the card file and line
card() { # FILE then the &model body on stdin
  { echo '&model'; cat; echo '/'; } > "$1"
  printf "&teacher card = 'test-teacher' /\n&student card = '%s' /\n&data format = 'bytes', train = 'train.bin' /\n" \
    "$1" > "use_$1"
}
card kv.nml <<'NML'
vocab_size = 256, hidden_size = 32, intermediate_size = 64, num_hidden_layers = 1
num_attention_heads = 4
num_key_value_heads = 3
NML
check use_kv.nml "kv.nml:4:" "&model num_key_value_heads" "divisor" "use_kv.nml:2"
card hid.nml <<'NML'
vocab_size = 256, hidden_size = 30, intermediate_size = 64, num_hidden_layers = 1
num_attention_heads = 4, num_key_value_heads = 2
NML
check use_hid.nml "hid.nml:2:" "&model hidden_size" "not divisible"
card odd.nml <<'NML'
vocab_size = 256
hidden_size = 12, intermediate_size = 64, num_hidden_layers = 1
num_attention_heads = 4, num_key_value_heads = 2
NML
check use_odd.nml "odd.nml:3:" "&model hidden_size" "odd"
card arch.nml <<'NML'
arch = 'gpt2'
vocab_size = 256, hidden_size = 32, intermediate_size = 64, num_hidden_layers = 1
num_attention_heads = 4, num_key_value_heads = 2
NML
check use_arch.nml "arch.nml:2:" "&model arch" "'qwen2', 'llama', 'qwen3', 'gemma3', 'qwen3_moe', 'mixtral', 'olmo2', 'phi3' or 'smollm3'"
card act.nml <<'NML'
hidden_activation = 'gelu_pytorch_tanh'
vocab_size = 256, hidden_size = 32, intermediate_size = 64, num_hidden_layers = 1
num_attention_heads = 4, num_key_value_heads = 2
NML
check use_act.nml "act.nml:2:" "&model hidden_activation" "not computed for arch 'qwen2'"
card moekey.nml <<'NML'
vocab_size = 256, hidden_size = 32, intermediate_size = 64, num_hidden_layers = 1
num_attention_heads = 4, num_key_value_heads = 2
num_experts = 8
NML
check use_moekey.nml "moekey.nml:4:" "&model num_experts" "mixture-of-experts key on a 'qwen2' card"
card moek.nml <<'NML'
arch = 'qwen3_moe', vocab_size = 256, hidden_size = 32, intermediate_size = 64
num_hidden_layers = 1, num_attention_heads = 4, num_key_value_heads = 2
num_experts = 4, moe_intermediate_size = 16
num_experts_per_tok = 5
NML
check use_moek.nml "moek.nml:5:" "&model num_experts_per_tok" "expected at most num_experts"
card mixnorm.nml <<'NML'
arch = 'mixtral', vocab_size = 256, hidden_size = 32, intermediate_size = 64
num_hidden_layers = 1, num_attention_heads = 4, num_key_value_heads = 2, num_experts = 4
norm_topk_prob = .false.
NML
check use_mixnorm.nml "mixnorm.nml:4:" "&model norm_topk_prob" "it always renormalises"
card ckey.nml <<'NML'
vocab_size = 256, hidden_size = 32, intermediate_size = 64, num_layers = 1
num_attention_heads = 4, num_key_value_heads = 2
NML
check use_ckey.nml "ckey.nml:2:" "&model" "did you mean 'num_hidden_layers'"
card creq.nml <<'NML'
vocab_size = 256, intermediate_size = 64, num_hidden_layers = 1
num_attention_heads = 4, num_key_value_heads = 2
NML
check use_creq.nml "creq.nml:1:" "&model hidden_size" "missing"

# a missing input file, and bad command-line words on a good file
check nosuch.nml "nosuch.nml" "cannot read"
cp base.nml good.nml
extra="optm%lr=1e-4"; check good.nml "command line 'optm%lr=1e-4'" "did you mean '&optim'"
extra="optim%lr=abc"; check good.nml "command line 'optim%lr=abc'" "&optim lr" "not a number"
extra="loss%kind=fkx"; check good.nml "command line 'loss%kind=fkx'" "did you mean 'fkl'"
extra="optim.lr=1"; check good.nml "command line 'optim.lr=1'" "group%key=value"

echo "$ncase cases, $nfail failed runs"
[ "$ncase" -ge 25 ] && [ "$nfail" -eq 0 ]
