#!/bin/sh
# Hostile document indices (doc/format.md, "Documents"): with data%samples = 'documents', an
# index inconsistent with its data is exit 2 naming the file and the document, never a crash
# (the sanitizer build runs this too). h5 /doc_offsets: not starting at 0, decreasing
# (overlapping documents), past the end, ending before the end, negative, a 2^62 length;
# Megatron (written by megatron.core, then edited as its published layout says): document
# indices out of order, a pointer past the .bin, a mask dataset of other lengths. A valid
# index of each kind is accepted (the cases are not refused for another reason).
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
kd_python_or_skip numpy h5py megatron.core
export OMP_NUM_THREADS=1
"$KD_PYTHON" - <<'PY'
import warnings, logging
warnings.simplefilter("ignore"); logging.disable(logging.WARNING)
import struct, shutil
import h5py, numpy as np, torch
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
tok = (np.arange(400) % 250).astype(np.int32)
mask = (np.arange(400) % 3 != 0).astype(np.uint8)
cases = {"good": [0, 100, 250, 400], "start": [5, 100, 400], "unsorted": [0, 200, 100, 400],
         "past": [0, 100, 500, 400], "short": [0, 100, 300], "negative": [0, -3, 400],
         "huge": [0, 1 << 62, 400]}
for name, off in cases.items():
    with h5py.File(f"{name}.h5", "w") as f:
        f["tokens"], f["loss_mask"] = tok, mask
        f["doc_offsets"] = np.array(off, np.int64)
for prefix, lens in (("m", [100, 150, 150]), ("m_mask", [100, 150, 150]), ("k_mask", [100, 140, 160])):
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint8 if "mask" in prefix else np.uint16)
    at = 0
    for l in lens:
        src = mask if "mask" in prefix else tok
        b.add_item(torch.from_numpy(src[at:at + l].astype(np.int64)))
        b.end_document()
        at += l
    b.finalize(prefix + ".idx")
# mega_order: document indices 0, 2, 1, 3 (the index's last section: ndocs + 1 int64)
for name in ("order", "ptr", "lens"):
    for ext in (".bin", ".idx"):
        shutil.copy("m" + ext, f"{name}{ext}")
    shutil.copy("k_mask.bin" if name == "lens" else "m_mask.bin", f"{name}_mask.bin")
    shutil.copy("k_mask.idx" if name == "lens" else "m_mask.idx", f"{name}_mask.idx")
raw = bytearray(open("order.idx", "rb").read())
nseq, ndoc = struct.unpack_from("<QQ", raw, 18)
docs = 34 + 12 * nseq
struct.pack_into("<QQ", raw, docs + 8, 2, 1)
open("order.idx", "wb").write(raw)
raw = bytearray(open("ptr.idx", "rb").read())
struct.pack_into("<Q", raw, 34 + 4 * nseq + 8, 10 ** 9)  # pointer of sequence 1 past the .bin
open("ptr.idx", "wb").write(raw)
PY
cat > base.nml <<EOF2
&run mode = 'eval', steps = 1, seed = 1, out_dir = 'ev' /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 1 /
&data valid = 'good.h5', format = 'h5', seq_len = 64, valid_batches = 0, samples = 'documents' /
&precision compute = 'fp32' /
EOF2
# refused FILE FORMAT PATTERN: exit 2 with PATTERN in the message
refused() {
  st=0
  kd 1 data%valid="'$1'" data%format="'$2'" > out.txt 2>&1 || st=$?
  [ "$st" = 2 ] && grep -q "$3" out.txt || { cat out.txt; fail "$1: status $st, expected 2 and '$3'"; }
  echo "ok $1: exit 2: $(grep -o "$3.*" out.txt | head -1 | cut -c1-110)"
}
kd 1 > out.txt 2>&1 || { cat out.txt; fail "a valid index was refused"; }
kd 1 data%valid="'m'" data%format="'megatron'" run%out_dir="'ev2'" > out.txt 2>&1 \
  || { cat out.txt; fail "a valid Megatron index was refused"; }
echo "ok: valid h5 and Megatron indices accepted"
refused start.h5 h5 "start.h5:/doc_offsets: document 0 starts at token 5"
refused unsorted.h5 h5 "unsorted.h5:/doc_offsets: document 2 starts at token 100"
refused past.h5 h5 "past.h5:/doc_offsets: document 2 starts at token 500"
refused short.h5 h5 "short.h5:/doc_offsets: document 2 starts at token 300"
refused negative.h5 h5 "negative.h5: /doc_offsets\[1\] is -3"
refused huge.h5 h5 "huge.h5:/doc_offsets: document 1 starts at token 4611686018427387904"
refused order megatron "order.idx: document index 2 is 1"
refused ptr megatron "ptr.idx: sequence 1 has length"
refused lens megatron "lens_mask.idx: sequence 1 of the loss mask has 140 entries"
echo "all document-index checks passed"
