"""llmc_write.py: llm.c token shards laid out as llm.c's own writer lays them out, for the
tests (kdtrain's reader must not be the judge of its own input).

The layout follows karpathy/llm.c, dev/data/data_common.py, write_datafile and its
HEADERS_INFO (read at commit f1e2ace651495b74ae22d45d1723443fd00ecd3a, the file last
changed in 16635d41a2a7c0c21ec058eb4201ff75ab97e392): a header of 256 int32 values,
zero but for [0] the magic, [1] the version and [2] the token count, then the tokens;
"gpt-2": magic 20240520, version 1, uint16 tokens; "llama-3": magic 20240801, version 7,
uint32 tokens. Written here from that description (numpy, little-endian as on the hosts
llm.c runs on), not copied.
"""
import numpy as np

HEADERS = {"gpt-2": (20240520, 1, np.uint16), "llama-3": (20240801, 7, np.uint32)}


def write_shard(path, tokens, model="gpt-2"):
    """Write `tokens` (ints) to `path` as an llm.c shard of `model` ('gpt-2' or 'llama-3')."""
    magic, version, dtype = HEADERS[model]
    tokens = np.asarray(tokens)
    if len(tokens) >= 2**31:
        raise ValueError("llm.c shards hold fewer than 2^31 tokens")
    if len(tokens) and (tokens.min() < 0 or tokens.max() > np.iinfo(dtype).max):
        raise ValueError(f"token ids outside the {np.dtype(dtype).name} of a {model} shard")
    header = np.zeros(256, dtype="<i4")
    header[:3] = (magic, version, len(tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(np.dtype(dtype).newbyteorder("<")).tobytes())

