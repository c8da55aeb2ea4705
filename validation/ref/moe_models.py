#!/usr/bin/env python3
"""Mixture-of-experts models through kdconvert and kdlogits (validation/e2e/test_moe_models.sh).

Small random models written by transformers 5's own classes (8 experts, top-2, non-default
sizes), router weights spread (std 0.5) so that no token has two near-equal experts:

  qwen3_moe  Qwen3MoeForCausalLM: 3 layers, layer 1 dense (mlp_only_layers = [1]),
             moe_intermediate_size 24 (the dense MLP 40), head_dim 16 (hidden 48 / 4 heads
             would be 12), q/k norms, GQA 4/2, norm_topk_prob false, untied
  qwen3_moe_norm  the same with norm_topk_prob true, decoder_sparse_step 2 (layer 1 sparse
             only), tied embeddings
  mixtral    MixtralForCausalLM: 2 layers, intermediate_size 40 for every expert, GQA 4/2,
             sliding_window 6 on 24-token sequences (every layer windowed)

For each: save_pretrained as transformers writes it by default (the Hub's per-expert
tensors: Qwen3-MoE mlp.experts.E.gate_proj, Mixtral block_sparse_moe.experts.E.w1/w3/w2)
and with save_original_format=False (transformers' own fused mlp.experts.gate_up_proj
(E, 2 I, C) and down_proj (E, C, I)); `kdconvert from-hf` of both gives the same weights
file tensors; kdtrain's logits (kdlogits) against transformers' (fp32, max |diff| / max
|logit| below 1e-4); the routing matters (the same weights with another top-k differ by
more than 10 x that); `kdconvert to-hf` -> transformers loads it: every tensor bit for bit
and the same logits. Then refusals: exit status 2 naming the key.

usage: moe_models.py KDCONVERT KDLOGITS WORKDIR
"""
import json, os, sys

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
import h5py
import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, MixtralConfig, Qwen3MoeConfig
from transformers.utils import logging as hf_logging

# the dense round trip's helpers (the same kdlogits call, tolerance and command runner)
from hf_roundtrip import TOL, logits_of, rel, run  # noqa: E402


def config(kind):
    common = dict(vocab_size=96, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                  num_experts_per_tok=2, router_aux_loss_coef=0.02)
    if kind == "mixtral":
        return MixtralConfig(**dict(common, num_hidden_layers=2), intermediate_size=40,
                             num_local_experts=8, sliding_window=6, tie_word_embeddings=False,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    norm = kind == "qwen3_moe_norm"
    return Qwen3MoeConfig(**common, intermediate_size=40, moe_intermediate_size=24, num_experts=8,
                          head_dim=16, norm_topk_prob=norm, decoder_sparse_step=2 if norm else 1,
                          mlp_only_layers=[] if norm else [1], tie_word_embeddings=norm,
                          rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def make(kind):
    model = AutoModelForCausalLM.from_config(config(kind)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # transformers ones the norms
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):  # routers: clear choices
                p.normal_(0.0, 0.5)
            elif "experts" in name:
                p.normal_(0.0, 0.1)
    return model


def params_of(h5):
    with h5py.File(h5, "r") as f:
        return {k: f["params"][k][()] for k in f["params"]}


def case(conv, kdlogits, work, kind, log):
    torch.manual_seed({"qwen3_moe": 11, "qwen3_moe_norm": 12, "mixtral": 13}[kind])
    model = make(kind)
    src = os.path.join(work, f"hf_{kind}")
    model.save_pretrained(src)
    names = set(load_file(os.path.join(src, "model.safetensors")))
    sparse = 1 if kind == "qwen3_moe_norm" else 0  # a sparse layer of the model
    hub = f"model.layers.{sparse}.block_sparse_moe.experts.3.w1.weight" if kind == "mixtral" \
        else f"model.layers.{sparse}.mlp.experts.3.gate_proj.weight"
    assert hub in names, sorted(names)[:12]
    fused_dir = os.path.join(work, f"hf_{kind}_fused")
    model.save_pretrained(fused_dir, save_original_format=False)
    fnames = set(load_file(os.path.join(fused_dir, "model.safetensors")))
    assert f"model.layers.{sparse}.mlp.experts.gate_up_proj" in fnames, sorted(fnames)[:12]
    h5 = os.path.join(work, f"{kind}.h5")
    run([conv, "from-hf", src, h5], log)
    h5f = os.path.join(work, f"{kind}_fused.h5")
    run([conv, "from-hf", fused_dir, h5f], log)
    a, b = params_of(h5), params_of(h5f)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), "fused import"
    print(f"{kind}: per-expert ({hub}) and fused (gate_up_proj) files import the same "
          f"{len(a)} tensors")
    ids = torch.randint(0, model.config.vocab_size, (3, 24))
    kd = logits_of(kdlogits, h5, ids, work, kind, log)
    with torch.no_grad():
        ref = model(ids).logits
    r1 = rel(kd, ref)
    print(f"{kind}: kdtrain vs transformers logits (fp32, {tuple(ref.shape)}): {r1:.3e}")
    assert r1 < TOL, f"{kind}: logits differ by {r1:.3e} > {TOL}"
    other = type(model.config).from_pretrained(src)
    other.num_experts_per_tok = 3
    alt = AutoModelForCausalLM.from_config(other).eval()
    alt.load_state_dict(model.state_dict())
    with torch.no_grad():
        r0 = rel(alt(ids).logits, ref)
    print(f"{kind}: the same weights with top-3 routing differ by {r0:.3e}")
    assert r0 > 10 * TOL, f"{kind}: the routing changes the logits by {r0:.3e} only"

    back = os.path.join(work, f"hf_back_{kind}")
    run([conv, "to-hf", h5, back], log)
    bt = load_file(os.path.join(back, "model.safetensors"))
    st = load_file(os.path.join(src, "model.safetensors"))
    assert set(st) == set(bt), sorted(set(st) ^ set(bt))[:8]
    for k in st:
        assert torch.equal(st[k].float(), bt[k]), k
    again = AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    for key in ("num_experts_per_tok", "router_aux_loss_coef", "norm_topk_prob",
                "decoder_sparse_step", "mlp_only_layers", "moe_intermediate_size",
                "sliding_window", "tie_word_embeddings"):
        if hasattr(model.config, key):
            assert getattr(again.config, key) == getattr(model.config, key), key
    assert again.config.num_local_experts == model.config.num_local_experts
    with torch.no_grad():
        r2 = rel(again(ids).logits, ref)
    print(f"{kind}: to-hf: {len(st)} tensors bit for bit, transformers' logits of the reloaded "
          f"model: {r2:.3e}")
    assert r2 == 0.0
    return src


def refusals(conv, work, src, log):
    cfg = json.load(open(os.path.join(src, "config.json")))
    for key, value, expect in (("router_jitter_noise", 0.1, "router_jitter_noise"),
                               ("num_experts_per_tok", 9, "num_experts_per_tok")):
        bad = os.path.join(work, f"bad_{key}")
        os.makedirs(bad, exist_ok=True)
        c = dict(cfg, **{key: value})
        json.dump(c, open(os.path.join(bad, "config.json"), "w"))
        os.symlink(os.path.join(src, "model.safetensors"), os.path.join(bad, "model.safetensors"))
        out = run([conv, "from-hf", bad, os.path.join(work, f"bad_{key}.h5")], log, expect=2)
        assert expect in out, out
        assert not os.path.exists(os.path.join(work, f"bad_{key}.h5"))
        print(f"refused: {key} = {value}: {out.strip().splitlines()[-1]}")


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    conv, kdlogits, work = sys.argv[1:]
    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    with open(os.path.join(work, "moe_models.log"), "w") as log:
        for kind in ("qwen3_moe", "qwen3_moe_norm", "mixtral"):
            src = case(conv, kdlogits, work, kind, log)
        refusals(conv, work, src, log)
    print("ok moe models")


if __name__ == "__main__":
    main()
