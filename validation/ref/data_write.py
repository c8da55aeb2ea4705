"""data_write.py MANIFEST: token files of every format with a header, written by each
format's own writer, for validation/unit/test_data.c (kdtrain's readers must not be the judge
of their own input). Each line of MANIFEST is one file to write from a raw stream of
little-endian uint32 token ids (TOKENS) and, where given, a byte per token of loss mask:

    megatron PREFIX TOKENS CODE PER_DOC  megatron.core's IndexedDatasetBuilder, dtype of
                                         Megatron code CODE, one sequence and document per
                                         PER_DOC tokens (the last one shorter)
    llmc OUT TOKENS gpt-2|llama-3        llm.c's write_datafile layout (llmc_write.py)
    h5 OUT TOKENS [MASK]                 h5py: /tokens int32 (+ /loss_mask uint8);
                                         TOKENS '-': a file with no dataset

Exit status 77 (with the reason) when megatron.core, h5py or numpy do not import.
"""
import logging
import os
import sys
import warnings

try:
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)  # torch's "no CUDA runtime" note when megatron imports
    import h5py
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
except Exception as e:  # the test decides whether a missing writer is a skip or a failure
    print(f"data_write.py: {type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmc_write import write_shard  # noqa: E402


def megatron(prefix, tokens, code, per_doc):
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.dtype_from_code(int(code)))
    for i in range(0, len(tokens), int(per_doc)):
        b.add_item(torch.from_numpy(tokens[i: i + int(per_doc)].astype(np.int64)))
        b.end_document()
    b.finalize(prefix + ".idx")


def h5(path, tokens, mask=None):
    with h5py.File(path, "w") as f:
        if tokens is not None:
            f["tokens"] = tokens.astype(np.int32)
        if mask is not None:
            f["loss_mask"] = mask


for line in open(sys.argv[1]):
    kind, out, src, *args = line.split()
    tok = None if src == "-" else np.fromfile(src, dtype="<u4")
    if kind == "megatron":
        megatron(out, tok, *args)
    elif kind == "llmc":
        write_shard(out, tok, *args)
    elif kind == "h5":
        h5(out, tok, np.fromfile(args[0], dtype=np.uint8) if args else None)
    else:
        sys.exit(f"data_write.py: {sys.argv[1]}: unknown kind '{kind}'")
