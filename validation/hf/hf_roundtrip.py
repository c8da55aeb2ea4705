#!/usr/bin/env python3
"""Hugging Face round trip of kdconvert and kdtrain's logits (doc/checkpoint.md).

For a small random Qwen2ForCausalLM (q/k/v bias, grouped-query attention 4/2), once with
tied and once with untied embeddings: save it with transformers, convert it with
`kdconvert from-hf` to a kdtrain weights file, run kdtrain's forward on it with
`kdlogits` and compare the logits with transformers' in fp32 (max |diff| / max |logit|
below 1e-4); convert back with `kdconvert to-hf`, check that every tensor comes back bit
for bit and that transformers loads the result and gives the same logits.
Needs: pip install torch transformers safetensors numpy.

usage: hf_roundtrip.py PATH/TO/kdconvert PATH/TO/kdlogits [WORKDIR]
"""
import os, subprocess, sys, tempfile

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

TOL = 1e-4


def run(cmd, log):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}:\n{r.stdout}")
    log.write(r.stdout)


def case(conv, kdlogits, work, tied, seed):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=tied,
                      torch_dtype="float32")
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # transformers zero-initialises biases: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    tag = "tied" if tied else "untied"
    src = os.path.join(work, f"hf_src_{tag}")
    model.save_pretrained(src, safe_serialization=True)
    h5 = os.path.join(work, f"model_{tag}.h5")
    log = open(os.path.join(work, f"log_{tag}.txt"), "w")
    run([conv, "from-hf", src, h5], log)

    # kdtrain's forward against transformers'
    ids = torch.randint(0, cfg.vocab_size, (3, 40))
    tok = os.path.join(work, f"tokens_{tag}.txt")
    with open(tok, "w") as f:
        for row in ids.tolist():
            f.write(" ".join(map(str, row)) + "\n")
    npy = os.path.join(work, f"logits_{tag}.npy")
    run([kdlogits, h5, tok, npy], log)
    kd = torch.from_numpy(np.load(npy))
    with torch.no_grad():
        ref = model(ids).logits
    assert kd.shape == ref.shape, (kd.shape, ref.shape)
    rel = ((kd - ref).abs().max() / ref.abs().max()).item()
    print(f"{tag}: kdtrain vs transformers logits (fp32, {tuple(ref.shape)}): "
          f"max relative difference {rel:.3e}")
    assert rel < TOL, f"{tag}: logits differ by {rel:.3e} > {TOL}"

    # back to Hugging Face: tensors bit for bit, same logits
    back = os.path.join(work, f"hf_back_{tag}")
    run([conv, "to-hf", h5, back], log)
    a = load_file(os.path.join(src, "model.safetensors"))
    b = load_file(os.path.join(back, "model.safetensors"))
    if tied:
        a.pop("lm_head.weight", None)  # tied: kdtrain stores only the embedding
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    for k in a:
        assert torch.equal(a[k], b[k]), k
    print(f"{tag}: {len(a)} tensors identical bit for bit after HF -> kdtrain -> HF")
    again = AutoModelForCausalLM.from_pretrained(back, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        lb = again(ids).logits
    rel2 = ((ref - lb).abs().max() / ref.abs().max()).item()
    print(f"{tag}: logits of the reloaded model: max relative difference {rel2:.3e}")
    assert rel2 == 0.0
    return rel


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    conv, kdlogits = sys.argv[1], sys.argv[2]
    work = sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp(prefix="kd_hf_")
    worst = max(case(conv, kdlogits, work, tied, seed)
                for tied, seed in ((True, 0), (False, 1)))
    print(f"hf round trip passed (worst logits relative difference {worst:.3e})")


if __name__ == "__main__":
    main()
