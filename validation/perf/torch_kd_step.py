#!/usr/bin/env python3
"""The kdtrain distillation step in PyTorch, for side-by-side timing.

--impl hf (the default, the baseline kd_step reports): the model is Hugging Face
transformers' own Qwen2ForCausalLM / Qwen3ForCausalLM / LlamaForCausalLM built from
the same card with
attn_implementation="sdpa" (what a user distilling with transformers runs), loading
kdtrain's weights by their state-dict names; teacher under torch.no_grad, one
log_softmax-based KL, AdamW with foreach=True. --compile wraps both models in
torch.compile (an extra row where it works on the CPU).

--impl plain: a hand-written decoder of the same architecture, kept as a reference:
same architecture as kdtrain's decoder (src/layers.c, Qwen2 style): token
embedding, per layer RMSNorm -> fused-free q/k/v projections with bias ->
(Qwen3: per-head RMSNorm of queries and keys, q_norm / k_norm, and a head_dim
apart from hidden / heads) -> rotary embedding (Hugging Face rotate_half) -> causal grouped-query attention
(F.scaled_dot_product_attention) -> o_proj -> residual -> RMSNorm -> SwiGLU MLP
-> residual; final RMSNorm and an untied (or tied) LM head. Sizes come from the
same model cards (mod/*.nml). Same objective as kdtrain mode='distill'
(doc/user-guide.md): alpha * tau^2 * KL(p_t || p_s) + (1 - alpha) * CE, both at
the token mean, teacher frozen; AdamW with weight decay on matrices only and
global-norm clipping.

One step = teacher forward (no_grad) + student forward + loss + backward +
clip + optimizer step. Prints one JSON line with per-step seconds, the median
tokens/s over the steps after the first, and peak resident memory (VmHWM).

--eval-batches N instead evaluates the student's hard-label cross entropy on N
sequential batches of the data file (what `kdtrain` mode='eval' reports as
val_loss), which checks that both programs compute the same model.
"""
import argparse
import json
import math
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from nml_card import read_card


class RMSNorm(nn.Module):
    def __init__(self, c, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * y).to(x.dtype)


def head_dim(cd):
    """A card's head_dim: its own key (Qwen3), else hidden / heads (0 means the same)."""
    return cd.get("head_dim", 0) or cd["hidden_size"] // cd["num_attention_heads"]


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cd):
        super().__init__()
        c, self.nh, self.nkv = cd["hidden_size"], cd["num_attention_heads"], cd["num_key_value_heads"]
        self.hd = head_dim(cd)
        bias = cd.get("attention_bias", cd.get("arch", "qwen2") == "qwen2")
        if cd.get("arch") == "qwen3":
            eps = cd.get("rms_norm_eps", 1e-6)
            self.q_norm, self.k_norm = RMSNorm(self.hd, eps), RMSNorm(self.hd, eps)
        self.q_proj = nn.Linear(c, self.nh * self.hd, bias=bias)
        self.k_proj = nn.Linear(c, self.nkv * self.hd, bias=bias)
        self.v_proj = nn.Linear(c, self.nkv * self.hd, bias=bias)
        self.o_proj = nn.Linear(self.nh * self.hd, c, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.nkv != self.nh:
            k = k.repeat_interleave(self.nh // self.nkv, dim=1)
            v = v.repeat_interleave(self.nh // self.nkv, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, cd):
        super().__init__()
        c, i = cd["hidden_size"], cd["intermediate_size"]
        self.gate_proj = nn.Linear(c, i, bias=False)
        self.up_proj = nn.Linear(c, i, bias=False)
        self.down_proj = nn.Linear(i, c, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cd):
        super().__init__()
        eps = cd.get("rms_norm_eps", 1e-6)
        self.input_layernorm = RMSNorm(cd["hidden_size"], eps)
        self.self_attn = Attention(cd)
        self.post_attention_layernorm = RMSNorm(cd["hidden_size"], eps)
        self.mlp = MLP(cd)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """Parameter names are the Hugging Face state-dict names kdtrain's HDF5 files use."""

    def __init__(self, cd):
        super().__init__()
        self.cd = cd
        m = nn.Module()
        m.embed_tokens = nn.Embedding(cd["vocab_size"], cd["hidden_size"])
        m.layers = nn.ModuleList(Layer(cd) for _ in range(cd["num_hidden_layers"]))
        m.norm = RMSNorm(cd["hidden_size"], cd.get("rms_norm_eps", 1e-6))
        self.model = m
        self.tied = cd.get("tie_word_embeddings", False)
        if not self.tied:
            self.lm_head = nn.Linear(cd["hidden_size"], cd["vocab_size"], bias=False)
        hd = head_dim(cd)
        self.theta, self.hd = float(cd.get("rope_theta", 10000.0)), hd
        self.init_weights()

    def init_weights(self):
        """kdtrain's random init: N(0, 0.02) matrices, residual projections / sqrt(2 L)."""
        L = self.cd["num_hidden_layers"]
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                std = 0.02 / math.sqrt(2 * L) if ("o_proj" in name or "down_proj" in name) else 0.02
                nn.init.normal_(p, 0.0, std)

    def rope(self, T, device):
        inv = self.theta ** (-torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        ang = torch.cat((ang, ang), dim=-1)
        return ang.cos().float().to(device), ang.sin().float().to(device)

    def forward(self, tokens):
        cos, sin = self.rope(tokens.shape[1], tokens.device)
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        w = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        return F.linear(x, w)

    def load_h5(self, path):
        import h5py

        with h5py.File(path, "r") as f:
            sd = {k: torch.from_numpy(np.asarray(f["params"][k], dtype=np.float32))
                  for k in self.state_dict() if k in f["params"]}
        missing = set(self.state_dict()) - set(sd)
        if missing:
            sys.exit(f"{path}: missing tensors {sorted(missing)[:3]} ...")
        self.load_state_dict(sd)


def hf_model(cd):
    """transformers' causal LM for a kdtrain card (qwen2, qwen3, qwen3_moe or llama), SDPA
    attention, fp32. A qwen3_moe model returns its load-balancing loss (output_router_logits)."""
    import transformers
    arch = cd.get("arch", "qwen2")
    common = dict(vocab_size=cd["vocab_size"], hidden_size=cd["hidden_size"],
                  intermediate_size=cd["intermediate_size"],
                  num_hidden_layers=cd["num_hidden_layers"],
                  num_attention_heads=cd["num_attention_heads"],
                  num_key_value_heads=cd["num_key_value_heads"],
                  rms_norm_eps=cd.get("rms_norm_eps", 1e-6),
                  rope_theta=float(cd.get("rope_theta", 10000.0)),
                  max_position_embeddings=cd.get("max_position_embeddings", 4096),
                  tie_word_embeddings=cd.get("tie_word_embeddings", False),
                  hidden_act="silu", attn_implementation="sdpa", torch_dtype=torch.float32)
    if arch == "qwen2":
        cfg = transformers.Qwen2Config(**common, use_sliding_window=False)
        _set_theta(cfg, common["rope_theta"])
        model = transformers.Qwen2ForCausalLM(cfg)
    elif arch == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(
            **common, head_dim=head_dim(cd), attention_bias=cd.get("attention_bias", False),
            num_experts=cd["num_experts"], num_experts_per_tok=cd["num_experts_per_tok"],
            moe_intermediate_size=cd["moe_intermediate_size"],
            norm_topk_prob=cd.get("norm_topk_prob", False),
            router_aux_loss_coef=cd.get("router_aux_loss_coef", 0.001),
            decoder_sparse_step=cd.get("decoder_sparse_step", 1),
            mlp_only_layers=list(cd.get("mlp_only_layers", []) or []),
            output_router_logits=True, use_sliding_window=False)
        _set_theta(cfg, common["rope_theta"])
        model = transformers.Qwen3MoeForCausalLM(cfg)
    elif arch == "qwen3":
        cfg = transformers.Qwen3Config(**common, head_dim=head_dim(cd), use_sliding_window=False,
                                       attention_bias=cd.get("attention_bias", False))
        _set_theta(cfg, common["rope_theta"])
        model = transformers.Qwen3ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(**common, attention_bias=cd.get("attention_bias", False),
                                       mlp_bias=False)
        _set_theta(cfg, common["rope_theta"])
        model = transformers.LlamaForCausalLM(cfg)
    model.config.use_cache = False
    return model.float()


def _set_theta(cfg, theta):
    """transformers 5 reads the RoPE base from config.rope_parameters, 4 from rope_theta."""
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict):
        rp["rope_theta"] = theta
    cfg.rope_theta = theta


class HFDecoder(nn.Module):
    """transformers' model behind the interface of Decoder: logits of tokens."""

    def __init__(self, cd):
        super().__init__()
        self.m = hf_model(cd)

    def forward(self, tokens):
        out = self.m(input_ids=tokens, use_cache=False)
        self.aux = getattr(out, "aux_loss", None)  # MoE: the load-balancing loss
        return out.logits

    def load_h5(self, path):
        import h5py

        sd = self.m.state_dict()
        with h5py.File(path, "r") as f:
            p = f["params"]
            new = {k: torch.from_numpy(np.asarray(p[k], dtype=np.float32)) for k in sd if k in p}
            for k in sd:  # transformers 5 holds an MoE layer's experts fused, weights files per expert
                if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj"):
                    pre, E = k.rsplit(".", 1)[0], sd[k].shape[0]
                    parts = ("gate_proj", "up_proj") if k.endswith("gate_up_proj") else ("down_proj",)
                    if all(f"{pre}.0.{q}.weight" in p for q in parts):
                        new[k] = torch.from_numpy(np.stack([np.concatenate(
                            [np.asarray(p[f"{pre}.{e}.{q}.weight"], dtype=np.float32) for q in parts])
                            for e in range(E)]))
        missing = [k for k in sd if k not in new and not k.endswith("rotary_emb.inv_freq")]
        if self_tied(self.m) and "lm_head.weight" in missing:
            missing.remove("lm_head.weight")
        if missing:
            sys.exit(f"{path}: missing tensors {sorted(missing)[:3]} ...")
        self.m.load_state_dict(new, strict=False)


def self_tied(m):
    return bool(getattr(m.config, "tie_word_embeddings", False))


def make_model(impl, cd):
    return HFDecoder(cd) if impl == "hf" else Decoder(cd)


def read_tokens(path, fmt):
    dt = {"bytes": np.uint8, "u16": np.dtype("<u2"), "u32": np.dtype("<u4")}[fmt]
    return np.fromfile(path, dtype=dt).astype(np.int64)


def batch(tok, first_sample, B, T):
    """Samples first_sample .. +B-1 in file order: inputs and next-token labels."""
    ns = (len(tok) - 1) // T
    idx = [(first_sample + j) % ns for j in range(B)]
    x = np.stack([tok[s * T:s * T + T] for s in idx])
    y = np.stack([tok[s * T + 1:s * T + T + 1] for s in idx])
    return torch.from_numpy(x), torch.from_numpy(y)


def kd_loss(zs, zt, y, tau, alpha):
    """alpha * tau^2 * mean_tokens KL(p_t || p_s) + (1 - alpha) * CE (fp32 logits)."""
    V = zs.shape[-1]
    zs, zt = zs.float().reshape(-1, V), zt.float().reshape(-1, V)
    ls = F.log_softmax(zs / tau, dim=-1)
    lt = F.log_softmax(zt / tau, dim=-1)
    kd = F.kl_div(ls, lt, log_target=True, reduction="batchmean") * tau * tau
    ce = F.cross_entropy(zs, y.reshape(-1))
    return alpha * kd + (1 - alpha) * ce


def peak_rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--teacher-card")
    ap.add_argument("--student-card", required=True)
    ap.add_argument("--teacher-weights", help="kdtrain HDF5 file (/params/<name>)")
    ap.add_argument("--student-weights", help="HDF5 file; default: kdtrain-style random init")
    ap.add_argument("--data", required=True)
    ap.add_argument("--format", default="bytes", choices=["bytes", "u16", "u32"])
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4, help="sequences per step")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=0, help="0: torch default")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--alpha", type=float, default=0.9)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--eval-batches", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--impl", default="hf", choices=["hf", "plain"],
                    help="hf: transformers with SDPA attention (default); plain: hand-written")
    ap.add_argument("--compile", action="store_true", help="torch.compile both models")
    a = ap.parse_args()

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    tok = read_tokens(a.data, a.format)
    T, B = a.seq_len, a.batch
    student = make_model(a.impl, read_card(a.student_card))
    if a.student_weights:
        student.load_h5(a.student_weights)
    amp = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.precision == "bf16" \
        else (lambda: torch.autocast("cpu", enabled=False))

    if a.eval_batches:
        ce = 0.0
        with torch.no_grad(), amp():
            for b in range(a.eval_batches):
                x, y = batch(tok, b * B, B, T)
                z = student(x).float()
                ce += F.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1)).item()
        print(json.dumps({"eval_ce": ce / a.eval_batches}))
        return

    teacher = make_model(a.impl, read_card(a.teacher_card))
    if a.teacher_weights:
        teacher.load_h5(a.teacher_weights)
    teacher.requires_grad_(False)
    teacher.eval()
    decay = [p for n, p in student.named_parameters() if p.dim() == 2]
    nodecay = [p for n, p in student.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    if a.compile:
        teacher = torch.compile(teacher)
        student = torch.compile(student)

    import resource
    times, losses, faults = [], [], []
    for step in range(a.steps):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        x, y = batch(tok, step * B, B, T)
        t0 = time.perf_counter()
        with amp():
            with torch.no_grad():
                zt = teacher(x)
            zs = student(x)
            loss = kd_loss(zs, zt, y, a.temperature, a.alpha)
            aux = getattr(student, "aux", None)
            if aux is not None:  # an MoE student: + router_aux_loss_coef x load balancing
                loss = loss + student.m.config.router_aux_loss_coef * aux
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        del zt, zs, loss
    tps = [B * T / t for t in times[1:]] or [B * T / times[0]]
    print(json.dumps({"impl": a.impl + ("+compile" if a.compile else ""), "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "precision": a.precision, "tokens_per_step": B * T, "step_s": times,
                      "tok_per_s": statistics.median(tps), "loss": losses,
                      "peak_rss_mib": peak_rss_mib(),
                      "minflt_per_step": statistics.median(faults[1:] or faults)}))


if __name__ == "__main__":
    main()
