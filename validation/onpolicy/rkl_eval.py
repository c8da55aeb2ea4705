#!/usr/bin/env python3
"""rkl_eval.py: the reverse KL from teacher to student on the student's own samples.

    rkl_eval.py --student S.h5 --teacher T.h5 --prompts PROMPTS.txt [--new 96] [--seed 7]

The student continues every prompt (kdgen --ids, temperature 1: its own distribution,
no filtering); kdlogits then gives the student's and the teacher's logits on prompt +
continuation, and the figure is KL(p_student || p_teacher) at every generated position
(the positions that predict a generated token), summed over the vocabulary, averaged
over positions and prompts (nats per token). Prints one line: the mean and its standard
error over prompts.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--student", required=True)
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--bindir", default="src/tools")
    a = ap.parse_args()
    gen = os.path.join(a.bindir, "kdgen-ids") if os.path.exists(
        os.path.join(a.bindir, "kdgen-ids")) else os.path.join(a.bindir, "kdgen")
    logits = os.path.join(a.bindir, "kdlogits")
    prompts = [line.split() for line in open(a.prompts) if line.strip()]
    out = subprocess.run([gen, a.student, "--ids", a.prompts, "--max-new-tokens", str(a.new),
                          "--temperature", "1.0", "--seed", str(a.seed)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"rkl_eval: {gen} failed:\n{out.stderr}")
    conts = [line.split() for line in out.stdout.splitlines() if line.strip()]
    if len(conts) != len(prompts) or any(len(c) != a.new for c in conts):
        sys.exit("rkl_eval: every prompt needs --new generated ids (no end-of-sequence id)")
    P = len(prompts[0])
    with tempfile.TemporaryDirectory() as tmp:
        seqs = os.path.join(tmp, "seqs.txt")
        with open(seqs, "w") as f:
            for p, c in zip(prompts, conts):
                f.write(" ".join(p + c) + "\n")
        lp = {}
        for who, w in (("s", a.student), ("t", a.teacher)):
            npy = os.path.join(tmp, who + ".npy")
            subprocess.run([logits, w, seqs, npy], check=True, capture_output=True)
            # positions P-1 .. P+new-2 predict the generated tokens P .. P+new-1
            lp[who] = log_softmax(np.load(npy)[:, P - 1: P + a.new - 1].astype(np.float64))
    kl = (np.exp(lp["s"]) * (lp["s"] - lp["t"])).sum(-1)  # (prompts, new)
    per_prompt = kl.mean(1)
    se = per_prompt.std(ddof=1) / np.sqrt(len(per_prompt))
    print(f"rkl {per_prompt.mean():.5f} +- {se:.5f} nats/token over {len(prompts)} prompts x "
          f"{a.new} generated tokens ({a.student})")


if __name__ == "__main__":
    main()
