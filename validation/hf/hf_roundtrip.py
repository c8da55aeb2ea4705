#!/usr/bin/env python3
"""Hugging Face round trip of kdconvert (doc/checkpoint.md).

Builds a small random Qwen2ForCausalLM with transformers, saves it, converts it with
`kdconvert from-hf` to a kdtrain weights file, converts that back with `kdconvert to-hf`,
checks that every tensor comes back bit for bit and that transformers loads the result
and gives the same logits. Needs: pip install torch transformers safetensors.

usage: hf_roundtrip.py PATH/TO/kdconvert [WORKDIR]
"""
import os, subprocess, sys, tempfile

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM


def main():
    conv = sys.argv[1]
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="kd_hf_")
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      torch_dtype="float32")
    model = Qwen2ForCausalLM(cfg).eval()
    src = os.path.join(work, "hf_src")
    model.save_pretrained(src, safe_serialization=True)
    h5 = os.path.join(work, "model.h5")
    subprocess.run([conv, "from-hf", src, h5], check=True)
    back = os.path.join(work, "hf_back")
    subprocess.run([conv, "to-hf", h5, back], check=True)

    a = load_file(os.path.join(src, "model.safetensors"))
    b = load_file(os.path.join(back, "model.safetensors"))
    a.pop("lm_head.weight", None)  # tied: kdtrain stores only the embedding
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    for k in a:
        assert torch.equal(a[k], b[k]), k
    print(f"tensors: {len(a)} identical bit for bit after HF -> kdtrain -> HF")

    again = AutoModelForCausalLM.from_pretrained(back, torch_dtype=torch.float32).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 24))
    with torch.no_grad():
        la, lb = model(ids).logits, again(ids).logits
    rel = ((la - lb).abs().max() / la.abs().max()).item()
    print(f"logits of the reloaded model: max relative difference {rel:.3e}")
    assert rel == 0.0
    print("hf round trip passed")


if __name__ == "__main__":
    main()
