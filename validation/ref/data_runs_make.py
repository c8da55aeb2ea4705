"""data_runs_make.py: the token files of test_data_runs.sh, each written by its format's own
writer. The bytes of kjv-valid.txt as one stream stored as raw u16 and u32 (numpy), a
Megatron dataset (megatron.core's IndexedDatasetBuilder, uint16, in documents of 97
tokens), llm.c GPT-2 and LLaMA-3 shards (llm.c's write_datafile layout, llmc_write.py)
and HDF5 /tokens (h5py); the same stream in HDF5 with a random /loss_mask and with an
all-zero mask; and two u16 files for a blend. Also windows.txt + mask.txt: the eval
windows (inputs of seq_len T) and their label masks, for the expected-loss computation."""
import logging
import os
import sys
import warnings

import h5py
import numpy as np

warnings.simplefilter("ignore")
logging.disable(logging.WARNING)  # torch's "no CUDA runtime" note when megatron imports
import torch  # noqa: E402
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmc_write import write_shard  # noqa: E402

src, T, nwin = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tok = np.frombuffer(open(src + "/input/corpus/kjv-valid.txt", "rb").read(), np.uint8)
tok = tok[: nwin * T + 1].astype(np.uint16)  # exactly nwin windows
tok.tofile("s.u16")
tok.astype("<u4").tofile("s.u32")
b = IndexedDatasetBuilder("s.bin", dtype=np.uint16)
for i in range(0, len(tok), 97):
    b.add_item(torch.from_numpy(tok[i: i + 97].astype(np.int64)))
    b.end_document()
b.finalize("s.idx")
write_shard("s.llmc", tok, "gpt-2")
write_shard("s.l3.llmc", tok, "llama-3")
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
