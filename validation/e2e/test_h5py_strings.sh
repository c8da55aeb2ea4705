#!/bin/sh
# Strings as h5py writes them (src/h5attr.c; doc/format.md "Root attributes"): h5py stores
# a Python str as a variable-length UTF-8 string, kdtrain writes fixed-length ASCII ones.
#  - a weights file whose every string attribute (and /config/namelist) h5py rewrote as
#    str: kdtrain evaluates it and trains from it exactly as from the original, kdgen-ids
#    generates the same ids, kdconvert to-hf writes the same bytes;
#  - a rollouts file written by kdtrain (on-policy generation, generate%save), its
#    attributes rewritten as str, and the same rows written anew with h5py's defaults
#    only (str attributes, int64 masks): data%format = 'rollouts' trains exactly as on
#    the original, and data%format = 'auto' still tells the format;
#  - still refused, exit 2 naming the file and the attribute: a card attribute stored as
#    an integer, a variable-length str longer than the reader's buffer, in a weights file
#    and in a rollouts file; a card word with a non-ASCII letter.
# The teacher cache's str attributes: validation/faults/cache_fuzz.py.
# Needs $KD_PYTHON with h5py and numpy (skipped without them, failed when CI is set).
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
kd_python_or_skip h5py numpy
export OMP_NUM_THREADS=1
py=$KD_PYTHON
bin="${KD_BUILDDIR:-$KD_SRCDIR}/src/tools"
T=16

cat > base.nml << EOF
&run mode = 'train', steps = 3, seed = 5, out_dir = 'tr' /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 2, global_batch = 4 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt',
      valid = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = $T, valid_batches = 2 /
&optim lr = 1e-2, warmup = 1 /
&precision compute = 'fp32' /
EOF
kd_log=log.txt

# as_str IN OUT: OUT is IN with every fixed-length string attribute of every object, and
# every scalar string dataset, rewritten by h5py as a Python str (variable-length UTF-8)
as_str() {
  cp "$1" "$2"
  "$py" - "$2" << 'PY'
import sys, h5py, numpy as np
n = 0
with h5py.File(sys.argv[1], "r+") as f:
    objs = [f]
    f.visititems(lambda name, o: objs.append(o))
    for o in objs:
        for k in list(o.attrs):
            t = o.attrs.get_id(k).get_type()
            if isinstance(t, h5py.h5t.TypeStringID) and not t.is_variable_str():
                o.attrs[k] = o.attrs[k].decode()  # h5py's default for a str
                n += 1
    for name in [o.name for o in objs if isinstance(o, h5py.Dataset)]:
        d = f[name]
        if d.shape == () and d.dtype.kind == "S":
            text, attrs = d[()].decode(), dict(d.attrs)
            del f[name]
            f[name] = text
            f[name].attrs.update(attrs)
            n += 1
    t = f.attrs.get_id("format").get_type()
    assert t.is_variable_str() and t.get_cset() == h5py.h5t.CSET_UTF8
print(f"{n} strings rewritten as str")
PY
}
# metrics RUN: the step and validation columns of RUN/metrics.csv
metrics() { cut -d, -f1-6,12 "$1/metrics.csv"; }
same_run() { # A B WHAT: identical metrics
  metrics "$1" > a.csv
  metrics "$2" > b.csv
  [ "$(wc -l < a.csv)" -gt 1 ] && cmp -s a.csv b.csv || { paste a.csv b.csv; fail "$3"; }
}
refused() { # WHAT NEEDLE WORD...: kdtrain exits 2 with NEEDLE in its message
  what=$1 needle=$2
  shift 2
  st=0
  kd_log="" kd 1 "$@" > bad.txt 2>&1 || st=$?
  [ "$st" = 2 ] && grep -q "$needle" bad.txt || { cat bad.txt; fail "$what: exit $st, expected 2 with '$needle'"; }
  echo "ok refused, $what: $(grep -o "$needle.*" bad.txt | head -1)"
}

echo "== a weights file with h5py's str attributes"
kd 1
as_str tr/final.h5 str.h5
kd 1 student%init="'tr/final.h5'" run%out_dir="'c_orig'"
kd 1 student%init="'str.h5'" run%out_dir="'c_str'"
same_run c_orig c_str "training from the str-attribute file differs"
kd 1 run%mode="'eval'" student%init="'str.h5'" run%out_dir="'e_str'"
kd 1 run%mode="'eval'" student%init="'tr/final.h5'" run%out_dir="'e_orig'"
same_run e_orig e_str "evaluating the str-attribute file differs"
echo "ok kdtrain: the same losses, val_loss $(awk -F, 'NR > 1 && $12 != "" { v = $12 } END { print v }' e_str/metrics.csv)"
printf '1 2 3 4 5\n40 41 42\n' > p.txt
for w in tr/final.h5 str.h5; do
  "$bin/kdgen-ids" "$w" --ids p.txt --max-new-tokens 8 > "$w.ids" 2> gen.txt \
    || { cat gen.txt; fail "kdgen-ids $w"; }
  "$bin/kdconvert" to-hf "$w" "hf_${w%%/*}" > conv.txt 2>&1 || { cat conv.txt; fail "kdconvert to-hf $w"; }
done
cmp tr/final.h5.ids str.h5.ids || fail "kdgen-ids: other ids from the str-attribute file"
diff -r hf_tr hf_str.h5 || fail "kdconvert to-hf: other files from the str-attribute file"
echo "ok kdgen-ids: the same ids; kdconvert to-hf: the same bytes ($(ls hf_str.h5 | tr '\n' ' '))"

echo "== a rollouts file with h5py's str attributes, and one written by h5py alone"
kd_test_teacher
"$py" - $T << 'PY'
import sys, h5py, numpy as np
T = int(sys.argv[1])
rng = np.random.default_rng(3)
tok = rng.integers(1, 200, size=16 * T + 1)
mask = np.ones_like(tok)
for w in range(16):  # every window's prompt: its first 5 tokens
    mask[w * T + 1 : w * T + 6] = 0
with h5py.File("prompts.h5", "w") as f:
    f["tokens"], f["loss_mask"] = tok, mask
PY
cat > onp.nml << EOF
&run mode = 'distill', steps = 2, seed = 9, out_dir = 'op' /
&teacher card = 'test-teacher', init = 'teacher/final.h5' /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 4 /
&data train = 'prompts.h5', format = 'h5', seq_len = $T /
&loss kind = 'rkl', onpolicy = 1.0 /
&generate max_new_tokens = 8, temperature = 1.0, save = .true. /
&optim lr = 1e-2, warmup = 1 /
&precision compute = 'fp32' /
EOF
kd_nml=onp.nml kd 1
as_str op/rollouts.h5 str_roll.h5
"$py" - << 'PY'
import h5py, numpy as np
with h5py.File("op/rollouts.h5", "r") as f:
    tok, mask, seq = f["tokens"][()].tolist(), f["loss_mask"][()].tolist(), int(f.attrs["seq_len"])
with h5py.File("py_roll.h5", "w") as f:  # h5py's defaults only: str, int64
    f.attrs["format"], f.attrs["seq_len"] = "kdtrain-rollouts", seq
    f["tokens"], f["loss_mask"] = np.array(tok), np.array(mask)
    assert f["loss_mask"].dtype == np.int64 and f.attrs.get_id("format").get_type().is_variable_str()
print(f"py_roll.h5: {len(tok)} rows of {seq + 1} tokens")
PY
for r in op/rollouts.h5 str_roll.h5 py_roll.h5; do # 'auto': read as 'h5', a 2-D /tokens is exit 2
  name=$(basename "$r" .h5)
  kd_nml=onp.nml kd 1 data%train="'$r'" data%format="'rollouts'" loss%onpolicy=0 \
    run%out_dir="'rp_$name'"
  kd_nml=onp.nml kd 1 data%train="'$r'" data%format="'auto'" generate%save=.false. \
    run%out_dir="'on_$name'"
done
for name in str_roll py_roll; do
  same_run rp_rollouts "rp_$name" "replay of $name.h5 differs from the original rollouts.h5"
  same_run on_rollouts "on_$name" "on-policy from $name.h5 differs from the original rollouts.h5"
done
echo "ok 'rollouts' from kdtrain's, its str-attribute copy and h5py's own file: the same replay and on-policy runs"

echo "== still refused, naming the file and the attribute"
"$py" - << 'PY'
import shutil, h5py
shutil.copy("str.h5", "int_arch.h5")
with h5py.File("int_arch.h5", "r+") as f:
    f["config"].attrs["arch"] = 7
shutil.copy("str.h5", "long_arch.h5")
with h5py.File("long_arch.h5", "r+") as f:
    f["config"].attrs["arch"] = "q" * 70000
shutil.copy("str.h5", "utf8_arch.h5")
with h5py.File("utf8_arch.h5", "r+") as f:
    f["config"].attrs["arch"] = "qw\u00e9n2"
shutil.copy("py_roll.h5", "long_roll.h5")
with h5py.File("long_roll.h5", "r+") as f:
    f.attrs["format"] = "kdtrain-rollouts" + "\u00e9" * 40
shutil.copy("py_roll.h5", "int_roll.h5")
with h5py.File("int_roll.h5", "r+") as f:
    f.attrs["format"] = 1
PY
refused "card attribute stored as an integer" \
  "int_arch.h5: /config attribute 'arch' is an integer, expected a string" student%init="'int_arch.h5'"
refused "card word as a 70000-character str" \
  "long_arch.h5: /config attribute 'arch' is a string of 70000 characters, expected at most 63" \
  student%init="'long_arch.h5'"
refused "card word with a non-ASCII letter" \
  "utf8_arch.h5: /config is not a valid model card: arch = 'qw.*n2': expected one of" \
  student%init="'utf8_arch.h5'"
refused "rollouts format as a 96-byte str" \
  "long_roll.h5: / attribute 'format' is a string of 96 characters, expected at most 63" \
  data%train="'long_roll.h5'" data%format="'rollouts'" data%valid="''"
refused "rollouts format stored as an integer" \
  "int_roll.h5: / attribute 'format' is an integer, expected a string" \
  data%train="'int_roll.h5'" data%format="'rollouts'" data%valid="''"
