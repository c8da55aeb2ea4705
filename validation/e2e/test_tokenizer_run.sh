#!/bin/sh
# The tokenizer travels with the model through kdtrain: a teacher whose weights file
# carries /tokenizer gives a randomly initialised student its tokenizer (when its ids fit the
# student's vocabulary), which every
# checkpoint and final.h5 carry (byte for byte), also after a resume; a student whose
# tokenizer differs from the teacher's is refused (exit 2, naming the file that differs), by
# the run and by --dry-run.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
kd_python_or_skip h5py numpy

cat > base.nml <<EOF2
&run mode = 'train', steps = 2, seed = 3, out_dir = 't' /
&teacher card = 'test-teacher', init = 't/final.h5' /
&student card = 'test-teacher', init = 'random' /
&parallel micro_batch = 2, global_batch = 4 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 16 /
&optim lr = 1e-2, warmup = 1 /
&precision compute = 'fp32' /
EOF2

# tok FILE digest: a digest of FILE's /tokenizer ('-' when it has none)
tok() {
  "$KD_PYTHON" - "$@" <<'EOF2'
import hashlib, sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    if "tokenizer" not in f:
        print("-")
    else:
        h = hashlib.sha256()
        for name in sorted(f["tokenizer"]):
            h.update(name.encode() + bytes(f["tokenizer"][name][()]))
        print(h.hexdigest())
EOF2
}

# give FILE TEXT: FILE's model with a tokenizer (tokenizer.json = TEXT, a fixed
# tokenizer_config.json), as a user gives one: kdconvert to-hf, the tokenizer files into
# the Hugging Face directory, kdconvert from-hf (which writes /tokenizer with its checksums)
conv="${KD_BUILDDIR:-$KD_SRCDIR}/src/tools/kdconvert"
give() {
  rm -rf hf.give && "$conv" to-hf "$1" hf.give > conv.txt 2>&1 || { cat conv.txt; fail "to-hf $1"; }
  printf '%s' "$2" > hf.give/tokenizer.json
  printf '%s' '{"x": 1}' > hf.give/tokenizer_config.json
  "$conv" from-hf hf.give "$1.new" conv.nml > conv.txt 2>&1 || { cat conv.txt; fail "from-hf $1"; }
  mv "$1.new" "$1"
}

echo "== a teacher with a tokenizer"
kd 1 > log.txt 2>&1 || { cat log.txt; fail "teacher"; }
[ "$(tok t/final.h5 digest)" = "-" ] || fail "a random model's final.h5 has a tokenizer"
give t/final.h5 '{"model": {"vocab": {"a": 0}}}'
want=$(tok t/final.h5 digest)

echo "== a random student distilled from it carries the teacher's tokenizer"
kd 2 run%mode="'distill'" student%card="'test-student'" run%out_dir="'s'" checkpoint%every=1 \
  checkpoint%keep=1 > log.txt 2>&1 || { cat log.txt; fail "distill"; }
grep -q "tokenizer files of .*t/final.h5 travel" log.txt || { cat log.txt; fail "start line"; }
for f in s/final.h5 s/checkpoints/step_00000002.h5; do
  [ "$(tok "$f" digest)" = "$want" ] || fail "$f does not carry the teacher's tokenizer"
done

echo "== a teacher tokenizer whose ids do not fit the student's vocabulary is not carried"
cp t/final.h5 wide.h5
give wide.h5 '{"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": 300, "content": "<x>"}]}'
kd 1 run%mode="'distill'" student%card="'test-student'" teacher%init="'wide.h5'" \
  run%out_dir="'w'" > log.txt 2>&1 || { cat log.txt; fail "distill from wide.h5"; }
grep -q "tokenizer (.*wide.h5) is not carried .*ids up to 300, the student's vocabulary has 256" \
  log.txt || { cat log.txt; fail "no line saying the tokenizer is not carried"; }
[ "$(tok w/final.h5 digest)" = "-" ] || fail "w/final.h5 carries a tokenizer whose ids it lacks"

echo "== resumed: the checkpoint's tokenizer goes on"
kd 1 run%mode="'distill'" student%card="'test-student'" run%out_dir="'s'" run%steps=3 \
  checkpoint%every=1 checkpoint%keep=1 > log.txt 2>&1 || { cat log.txt; fail "resume"; }
grep -q "resumed from" log.txt || { cat log.txt; fail "did not resume"; }
for f in s/final.h5 s/checkpoints/step_00000003.h5; do
  [ "$(tok "$f" digest)" = "$want" ] || fail "$f (after resume) does not carry the tokenizer"
done

echo "== a student whose tokenizer differs from the teacher's is refused"
cp s/final.h5 other.h5
give other.h5 '{"model": {"vocab": {"b": 0}}}'
set +e
kd 1 run%mode="'distill'" student%card="'test-student'" student%init="'other.h5'" \
  run%out_dir="'x'" > log.txt 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || { cat log.txt; fail "differing tokenizers: exit $rc, expected 2"; }
grep -q "differs from the student's .*other.h5) in tokenizer.json" log.txt || { cat log.txt; fail "message"; }
[ ! -e x/final.h5 ] || fail "a refused run wrote x/final.h5"

echo "== --dry-run reads the tokenizers (not the weights) and refuses the same pair"
set +e
"$KDTRAIN" --dry-run base.nml run%mode="'distill'" student%card="'test-student'" \
  student%init="'other.h5'" > dry.txt 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || { cat dry.txt; fail "--dry-run of differing tokenizers: exit $rc, expected 2"; }
grep -q "differs from the student's .*other.h5) in tokenizer.json" dry.txt || { cat dry.txt; fail "dry-run message"; }
"$KDTRAIN" --dry-run base.nml run%mode="'distill'" student%card="'test-student'" \
  student%init="'s/final.h5'" > dry.txt 2>&1 || { cat dry.txt; fail "--dry-run of equal tokenizers"; }
echo PASS
