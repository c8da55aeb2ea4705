"""data_runs_make.py: the token files of test_data_runs.sh. The bytes of kjv-valid.txt as
one stream stored as raw u16, a Megatron dataset (uint16, in documents of 97 tokens), an
llm.c v1 shard and HDF5 /tokens; the same stream in HDF5 with a random /loss_mask and with
an all-zero mask; and two u16 files for a blend. Also windows.txt + mask.txt: the eval
windows (inputs of seq_len T) and their label masks, for the expected-loss computation."""
import struct
import sys

import h5py
import numpy as np

src, T, nwin = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tok = np.frombuffer(open(src + "/input/corpus/kjv-valid.txt", "rb").read(), np.uint8)
tok = tok[: nwin * T + 1].astype(np.uint16)  # exactly nwin windows
tok.tofile("s.u16")
lens = [97] * (len(tok) // 97) + ([len(tok) % 97] if len(tok) % 97 else [])
ptrs = np.concatenate([[0], np.cumsum(lens)[:-1]]) * 2
with open("s.idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(lens), len(lens) + 1))
    f.write(np.array(lens, np.int32).tobytes() + np.array(ptrs, np.int64).tobytes())
    f.write(np.arange(len(lens) + 1, dtype=np.int64).tobytes())
tok.tofile("s.bin")
with open("s.llmc", "wb") as f:
    f.write(np.array([20240520, 1, len(tok)] + [0] * 253, np.int32).tobytes() + tok.tobytes())
rng = np.random.default_rng(7)
mask = (rng.random(len(tok)) < 0.4).astype(np.uint8)
for name, m in (("s.h5", None), ("masked.h5", mask), ("empty.h5", np.zeros_like(mask))):
    with h5py.File(name, "w") as f:
        f["tokens"] = tok.astype(np.int32)
        if m is not None:
            f["loss_mask"] = m
with open("windows.txt", "w") as f, open("mask.txt", "w") as g, open("next.txt", "w") as h:
    for w in range(nwin):
        h.write(f"{int(tok[w * T + T])}\n")
        f.write(" ".join(str(int(x)) for x in tok[w * T: w * T + T]) + "\n")
        g.write(" ".join(str(int(x)) for x in mask[w * T + 1: w * T + T + 1]) + "\n")
train = np.frombuffer(open(src + "/input/corpus/kjv-train.txt", "rb").read(), np.uint8)
train[:40000].astype(np.uint16).tofile("a.u16")
train[-20000:].astype(np.uint16).tofile("b.u16")
