"""Reference rows for validation/mpi/test_sample.c: random logits filtered by transformers'
own TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper, in the order
GenerationMixin._get_logits_processor applies them, and the softmax of what is kept.

    sample_ref.py OUT.txt

OUT.txt: the number of cases, then per case a line "V temperature top_k top_p" and three
lines of V numbers: the FP32 logits (9 significant digits: exact), the kept flags (1/0),
the probabilities of the filtered softmax."""
import sys

import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

g = torch.Generator().manual_seed(7)
cases = []
for V, scale in [(37, 1.0), (50, 3.0), (101, 0.5), (256, 2.0), (300, 6.0)]:
    for t, k, p in [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.9), (1.0, 10, 0.8), (0.5, 0, 0.5),
                    (2.0, 3, 0.95), (1.0, 1, 1.0), (1.0, 0, 0.05)]:
        z = (torch.randn(1, V, generator=g) * scale).float()
        x = z.clone()
        ids = torch.zeros(1, 1, dtype=torch.long)
        x = TemperatureLogitsWarper(t)(ids, x)
        if k > 0:
            x = TopKLogitsWarper(top_k=k)(ids, x)
        if p < 1.0:
            x = TopPLogitsWarper(top_p=p)(ids, x)
        kept = torch.isfinite(x)
        prob = torch.softmax(x.double(), dim=-1)
        cases.append((V, t, k, p, z[0], kept[0], prob[0]))

with open(sys.argv[1], "w") as f:
    f.write(f"{len(cases)}\n")
    for V, t, k, p, z, kept, prob in cases:
        f.write(f"{V} {t!r} {k} {p!r}\n")
        f.write(" ".join(f"{v:.9g}" for v in z.tolist()) + "\n")
        f.write(" ".join(str(int(b)) for b in kept.tolist()) + "\n")
        f.write(" ".join(f"{v:.17g}" for v in prob.tolist()) + "\n")
