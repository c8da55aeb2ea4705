"""data_runs_expect.py LOGITS.npy WINDOWS.txt MASK.txt [all]: the mean cross entropy of
kdlogits' logits over the labels whose mask is 1 (every label with 'all'), double precision."""
import sys

import numpy as np

z = np.load(sys.argv[1]).astype(np.float64)  # (B, T, V)
win = np.loadtxt(sys.argv[2], dtype=np.int64, ndmin=2)
mask = np.loadtxt(sys.argv[3], dtype=np.int64, ndmin=2)
if len(sys.argv) > 4:
    mask[:] = 1
B, T, V = z.shape
# label t of window w is input t + 1, the last label is the token after the window
nxt = np.loadtxt("next.txt", dtype=np.int64, ndmin=1)
lab = np.concatenate([win[:, 1:], nxt[:, None]], axis=1)
m = z.max(axis=2, keepdims=True)
lse = (m[..., 0] + np.log(np.exp(z - m).sum(axis=2)))
ce = lse - np.take_along_axis(z, lab[..., None], axis=2)[..., 0]
print(f"{(ce * mask).sum() / mask.sum():.9g}")
