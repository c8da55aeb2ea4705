#!/usr/bin/env python3
"""make_data.py: prompt/continuation records of the quickstart corpus for the on-policy
validation case (validation/onpolicy/run.sh).

    make_data.py CORPUS.txt OUT.h5 [--record 128] [--prompt 32]
    make_data.py CORPUS.txt PROMPTS.txt --prompts-only [--count 64] [--prompt 32]

The corpus is cut into records of --record bytes (the run's seq_len, so that each of
kdtrain's windows is one record): the first --prompt bytes are the prompt (loss mask 0),
the rest its continuation (mask 1). Written with h5py as data%format = 'h5' reads it:
/tokens (uint8 byte ids) and /loss_mask (uint8), one token stream. --prompts-only writes
the first --count prompts instead, one line of byte ids each (kdgen --ids).
"""
import argparse

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--record", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--prompts-only", action="store_true")
    ap.add_argument("--count", type=int, default=64)
    a = ap.parse_args()
    data = np.frombuffer(open(a.corpus, "rb").read(), dtype=np.uint8)
    n = len(data) // a.record
    rec = data[: n * a.record].reshape(n, a.record)
    if a.prompts_only:
        with open(a.out, "w") as f:
            for r in rec[: a.count]:
                f.write(" ".join(str(int(x)) for x in r[: a.prompt]) + "\n")
        return
    import h5py

    mask = np.ones_like(rec)
    mask[:, : a.prompt] = 0
    with h5py.File(a.out, "w") as f:
        f.create_dataset("tokens", data=rec.reshape(-1))
        f.create_dataset("loss_mask", data=mask.reshape(-1))
    print(f"{a.out}: {n} records of {a.record} bytes ({a.prompt} prompt, "
          f"{a.record - a.prompt} continuation)")


if __name__ == "__main__":
    main()
