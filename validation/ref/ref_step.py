#!/usr/bin/env python3
"""One distillation step of kdtrain against the same step in PyTorch with transformers'
own models (validation/e2e/test_ref_step.sh drives it).

  ref_step.py WORK SEQ_LEN ROWS
      ROWS: one line per family, "FAMILY KIND ALPHA TEMPERATURE BETA T2_SCALE" (FAMILY a
      key of FAMILIES; T2_SCALE T or F), the &loss of kdtrain's step. For each family:
      a random teacher and student written by transformers' own classes (non-default
      tiny sizes, norms and biases moved off their initial values) into
      WORK/FAMILY/hf_teacher and hf_student (save_pretrained, fp32), and
      WORK/FAMILY/tokens.h5: /tokens (int32) of exactly 2 * SEQ_LEN + 1 ids and
      /loss_mask (uint8) with a few zeros. kdtrain's sampler cuts a file into windows of
      SEQ_LEN + 1 tokens at multiples of SEQ_LEN (src/data.c), so this file holds exactly
      two windows and a global batch of 2 is both of them, whatever the seeded order.
      Then the step in PyTorch with both models loaded back from their directories (fp32,
      eager attention): WORK/FAMILY/ref.txt holds its loss, loss_kd, loss_ce and
      grad_norm, which the test compares with kdtrain's metrics.csv. A family with a
      contrast (its distinguishing feature switched off: the RoPE scaling, the sliding
      window) must change those numbers by more than 10 x the test's 1e-4 there: the data
      is long enough for the feature to matter.

The reference step, written from the definitions, not from kdtrain's code:
  * inputs: each window of SEQ_LEN + 1 tokens is fed whole, labels are the window with
    the ids whose loss mask is 0 set to -100 (Megatron's loss_mask convention: the mask
    of token t + 1 counts the prediction made at t), shifted by one as transformers'
    causal-LM loss shifts them: the last position predicts nothing and is dropped;
  * per counted position, with log-softmaxes at temperature tau of student (s) and
    teacher (t): fkl = KL(p_t || p_s), rkl = KL(p_s || p_t), jsd = TRL's
    generalized_jsd_loss: beta KL(p_t || m) + (1 - beta) KL(p_s || m) with
    m = beta p_t + (1 - beta) p_s; summed over the counted positions of the global batch;
  * CE: the hard-label cross entropy at temperature 1, summed over the same positions;
  * loss = alpha tau^2 KD / N + (1 - alpha) CE / N, N the counted positions of the
    global batch (tau^2 only with t2_scale); loss_kd = tau^2 KD / N, loss_ce = CE / N;
  * grad_norm: the L2 norm over every student parameter of d loss (before clipping;
    a tied embedding once);
  * a mixture-of-experts student (qwen3_moe, mixtral): the student runs one forward per
    window (kdtrain's micro-batch of 1) on its SEQ_LEN inputs (the window without its last
    token, which is only a label) with output_router_logits, and loss_aux is the mean
    over the windows of the aux_loss transformers returns (load_balancing_loss_func over
    that forward's router logits); loss adds router_aux_loss_coef (the student's config)
    times loss_aux; ref.txt then holds loss_aux as a fifth number.

KD_REF_PERTURB=FAMILY:KEY=VALUE (a proof that the test can fail): the
config.json value KEY (a.b for a nested key: rope_parameters.factor) of FAMILY's teacher
and student set to VALUE (JSON) in the models PyTorch loads, kdtrain's files untouched;
KEY 'student.WEIGHT' adds VALUE to the student's tensor WEIGHT (model.norm.weight).
"""
import copy
import json
import os
import sys
import zlib

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig, AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig, MixtralConfig,
    Qwen2Config, Qwen3Config, Qwen3MoeConfig)
from transformers.utils import logging as hf_logging  # noqa: E402

TOL = 1e-4  # test_ref_step.sh: kdtrain against this step, relative
WINDOWS = 2  # the global batch: every window of the token file
# token positions (of 2 * SEQ_LEN + 1) whose loss mask is 0: labels 0, 1 and 9 of window
# 0, the first and the last label of window 1 (the file's last token); as functions of T
MASKED = (lambda T: 1, lambda T: 2, lambda T: 10, lambda T: T + 1, lambda T: 2 * T)
INIT_STD = 0.2  # weights 10x transformers' 0.02: peaked attention and logits


def rope(rope_type, theta, **kw):
    return dict(rope_type=rope_type, rope_theta=theta, **kw)


LLAMA3 = rope("llama3", 1e4, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=32)
YARN = rope("yarn", 1e4, factor=4.0, beta_fast=16.0, original_max_position_embeddings=16)


def sizes(vocab, hidden, inter, layers, heads, kv, **kw):
    return dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                max_position_embeddings=64, initializer_range=INIT_STD, **kw)


def gemma3(role):
    rp = {"sliding_attention": rope("default", 1e4), "full_attention": rope("default", 1e6)}
    if role == "teacher":
        return Gemma3TextConfig(**sizes(128, 48, 96, 3, 4, 2), head_dim=16,
                                query_pre_attn_scalar=24, sliding_window=8, rope_parameters=rp,
                                layer_types=["sliding_attention", "full_attention",
                                             "sliding_attention"], rms_norm_eps=1e-5)
    return Gemma3TextConfig(**sizes(128, 32, 64, 2, 2, 1), head_dim=16, query_pre_attn_scalar=12,
                            sliding_window=8, rope_parameters=rp,
                            layer_types=["sliding_attention", "full_attention"])


# FAMILY -> (role -> transformers config, contrast: config.json changes that switch the
# family's feature off, or None). Teacher and student share the vocabulary; heads, kv
# heads, vocabulary and intermediate sizes divide by 2 (tp 2), >= 2 layers (pp 2).
FAMILIES = {
    "qwen3": (lambda role: Qwen3Config(
        **(sizes(128, 48, 96, 3, 4, 2, rms_norm_eps=1e-5) if role == "teacher" else
           sizes(128, 32, 64, 2, 4, 2)), head_dim=16 if role == "teacher" else 12,
        tie_word_embeddings=False, rope_parameters=rope("default", 1e6)), None),
    "qwen3_tied": (lambda role: Qwen3Config(
        **(sizes(96, 40, 80, 2, 4, 1) if role == "teacher" else sizes(96, 24, 48, 3, 2, 1)),
        head_dim=16 if role == "teacher" else 20, tie_word_embeddings=True,
        rope_parameters=rope("default", 3e4)), None),
    "llama3": (lambda role: LlamaConfig(
        **(sizes(128, 64, 128, 2, 4, 2, rms_norm_eps=1e-5) if role == "teacher" else
           sizes(128, 32, 96, 3, 4, 4)), tie_word_embeddings=role == "student",
        rope_parameters=dict(LLAMA3)),
        {"rope_parameters": rope("default", 1e4)}),
    "yarn": (lambda role: LlamaConfig(
        **(sizes(128, 64, 128, 2, 4, 2) if role == "teacher" else sizes(128, 32, 64, 2, 2, 2)),
        tie_word_embeddings=False, rope_parameters=dict(YARN)),
        {"rope_parameters": rope("default", 1e4)}),
    # the shapes of mod/test-teacher.nml and mod/test-student.nml
    "qwen2": (lambda role: Qwen2Config(
        **(sizes(256, 32, 64, 2, 4, 2) if role == "teacher" else sizes(256, 16, 48, 3, 2, 1)),
        tie_word_embeddings=role == "student", rope_parameters=rope("default", 1e4)), None),
    # sliding windows of 6 and 8 on 32 positions (rows of test_ref_step.sh to enable)
    "mistral_sw": (lambda role: MistralConfig(
        **(sizes(128, 64, 128, 2, 4, 2) if role == "teacher" else sizes(128, 32, 64, 2, 4, 2)),
        sliding_window=8 if role == "teacher" else 6, tie_word_embeddings=False,
        rope_parameters=rope("default", 1e4)),
        {"sliding_window": None}),
    "qwen2_sw": (lambda role: Qwen2Config(
        **(sizes(128, 48, 96, 3, 4, 2) if role == "teacher" else sizes(128, 32, 64, 3, 2, 2)),
        use_sliding_window=True, sliding_window=8, max_window_layers=1 if role == "teacher" else 2,
        tie_word_embeddings=role == "student", rope_parameters=rope("default", 1e4)),
        {"use_sliding_window": False, "layer_types": None}),
    "gemma3": (gemma3, {"sliding_window": 1024}),
    # mixtures of experts (8 experts, top-2): a sparse student of a dense teacher (a dense layer
    # among the student's sparse ones), a sparse teacher of a dense student, a Mixtral student
    "qwen3_moe": (lambda role: Qwen3MoeConfig(
        **sizes(128, 32, 64, 3, 4, 2), head_dim=12, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=24, mlp_only_layers=[1], router_aux_loss_coef=0.05,
        tie_word_embeddings=False, rope_parameters=rope("default", 1e6))
        if role == "student" else Qwen3Config(
        **sizes(128, 48, 96, 2, 4, 2), head_dim=16, tie_word_embeddings=False,
        rope_parameters=rope("default", 1e6)), {"num_experts_per_tok": 3}),
    "qwen3_moe_teacher": (lambda role: Qwen3MoeConfig(
        **sizes(128, 48, 96, 3, 4, 2), head_dim=16, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1,
        tie_word_embeddings=False, rope_parameters=rope("default", 1e6))
        if role == "teacher" else Qwen3Config(
        **sizes(128, 32, 64, 2, 4, 2), head_dim=12, tie_word_embeddings=True,
        rope_parameters=rope("default", 1e6)), {"num_experts_per_tok": 3}),
    "mixtral": (lambda role: MixtralConfig(
        **sizes(128, 32, 48, 2, 4, 2), num_local_experts=8, num_experts_per_tok=2,
        router_aux_loss_coef=0.05, tie_word_embeddings=False, rope_parameters=rope("default", 1e4))
        if role == "student" else MistralConfig(
        **sizes(128, 48, 96, 2, 4, 2), tie_word_embeddings=False,
        rope_parameters=rope("default", 1e4)), {"num_experts_per_tok": 1}),
}
MOE_TYPES = ("qwen3_moe", "mixtral")  # model_type of a mixture-of-experts model


def seed_of(family):
    """A seed of the family's name alone: a new row changes no other family's models."""
    return zlib.crc32(family.encode()) % 100000


def make(work, fam, T):
    """FAMILY's teacher and student (transformers' save_pretrained) and token file in work."""
    d = os.path.join(work, fam)
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(seed_of(fam))
    vocab = None
    for role in ("teacher", "student"):
        model = AutoModelForCausalLM.from_config(FAMILIES[fam][0](role))
        with torch.no_grad():  # transformers ones the norms and zeroes the biases
            for name, p in model.named_parameters():
                if name.endswith("bias") or "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
        model.save_pretrained(os.path.join(d, f"hf_{role}"))
        vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(100 + seed_of(fam))
    tokens = torch.randint(0, vocab, (WINDOWS * T + 1,), generator=g).numpy()
    mask = np.ones(len(tokens), dtype=np.uint8)
    for m in MASKED:
        mask[m(T)] = 0
    with h5py.File(os.path.join(d, "tokens.h5"), "w") as f:
        f["tokens"] = tokens.astype(np.int32)
        f["loss_mask"] = mask
    return d


def set_key(cfg, key, value):
    *path, last = key.split(".")
    for k in path:
        cfg = cfg[k]
    cfg[last] = value


def load(hf_dir, change=None):
    """The model of hf_dir in fp32 with eager attention, config.json changed by `change`."""
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    for k, v in (change or {}).items():
        set_key(cfg, k, copy.deepcopy(v))
    config = AutoConfig.for_model(**cfg)
    return AutoModelForCausalLM.from_pretrained(hf_dir, config=config, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def divergence(kind, lps, lpt, beta):
    """Per-position divergence (summed over the vocabulary) of log-probabilities."""
    if kind == "fkl":  # KL(teacher || student)
        return F.kl_div(lps, lpt, reduction="none", log_target=True).sum(-1)
    if kind == "rkl":  # KL(student || teacher)
        return F.kl_div(lpt, lps, reduction="none", log_target=True).sum(-1)
    # TRL's generalized JSD: the mixture's log as a logsumexp of the weighted logs
    b = torch.tensor(beta, dtype=lps.dtype)
    lm = torch.logsumexp(torch.stack([lps + torch.log(1 - b), lpt + torch.log(b)]), dim=0)
    kl_t = F.kl_div(lm, lpt, reduction="none", log_target=True).sum(-1)
    kl_s = F.kl_div(lm, lps, reduction="none", log_target=True).sum(-1)
    return b * kl_t + (1 - b) * kl_s


def reference(d, row, change=None, bump=None):
    """loss, loss_kd, loss_ce, grad_norm of one step in PyTorch."""
    kind, alpha, tau, beta, t2 = row
    teacher = load(os.path.join(d, "hf_teacher"), change)
    student = load(os.path.join(d, "hf_student"), change)
    if bump:
        with torch.no_grad():
            student.get_parameter(bump[0]).add_(bump[1])
    with h5py.File(os.path.join(d, "tokens.h5"), "r") as f:
        tokens = torch.from_numpy(f["tokens"][()].astype(np.int64))
        mask = torch.from_numpy(f["loss_mask"][()])
    T = (len(tokens) - 1) // WINDOWS
    assert len(tokens) == WINDOWS * T + 1, len(tokens)
    # the windows: tokens w T .. w T + T, as kdtrain's sampler cuts them
    ids = torch.stack([tokens[w * T: w * T + T + 1] for w in range(WINDOWS)])
    labels = torch.stack([torch.where(mask[w * T: w * T + T + 1] != 0, tokens[w * T: w * T + T + 1],
                                      -100) for w in range(WINDOWS)])
    with torch.no_grad():
        zt = teacher(ids).logits[:, :-1]
    moe = student.config.model_type in MOE_TYPES
    if moe:  # one forward per window (micro-batch) of its SEQ_LEN inputs (the last token is
        # only a label), each with its load-balancing loss
        outs = [student(ids[w:w + 1, :-1], output_router_logits=True) for w in range(WINDOWS)]
        zs = torch.cat([o.logits for o in outs])
        aux = torch.stack([o.aux_loss for o in outs]).mean()
    else:
        zs = student(ids).logits[:, :-1]
    target = labels[:, 1:]
    counted = target != -100
    n = counted.sum()
    lps = F.log_softmax(zs / tau, dim=-1)
    lpt = F.log_softmax(zt / tau, dim=-1)
    kd = divergence(kind, lps, lpt, beta)[counted].sum() * (tau * tau if t2 else 1.0)
    ce = F.cross_entropy(zs.reshape(-1, zs.shape[-1]), target.reshape(-1), ignore_index=-100,
                         reduction="sum")
    loss = alpha * kd / n + (1 - alpha) * ce / n
    if moe:
        loss = loss + student.config.router_aux_loss_coef * aux
    loss.backward()
    gn = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in student.parameters()
                        if p.grad is not None))
    return [loss.item(), (kd / n).item(), (ce / n).item(), gn.item()] + \
        ([aux.item()] if moe else [])


def rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def perturbation(fam):
    """KD_REF_PERTURB's change for FAMILY: (config change, student weight bump)."""
    perturb = os.environ.get("KD_REF_PERTURB", "")
    if not perturb.startswith(fam + ":"):
        return None, None
    key, value = perturb[len(fam) + 1:].split("=", 1)
    print(f"{fam}: KD_REF_PERTURB: {key} = {value} in the PyTorch models only")
    if key.startswith("student."):
        return None, (key[len("student."):], float(value))
    return {key: json.loads(value)}, None


def run(work, T, rows_file):
    bad = []
    for line in open(rows_file):
        if not line.split():
            continue
        fam, kind, alpha, tau, beta, t2 = line.split()[:6]
        row = (kind, float(alpha), float(tau), float(beta), t2 == "T")
        d = make(work, fam, T)
        ref = reference(d, row, *perturbation(fam))
        with open(os.path.join(d, "ref.txt"), "w") as f:
            f.write(" ".join(f"{v:.9g}" for v in ref) + "\n")
        print(f"{fam}: teacher and student written by transformers; PyTorch's step: " +
              ", ".join(f"{n} {v:.7g}" for n, v in zip(("loss", "loss_kd", "loss_ce",
                                                         "grad_norm", "loss_aux"), ref)))
        contrast = FAMILIES[fam][1]
        if contrast is not None:
            far = rel(reference(d, row, contrast), ref)
            print(f"{fam}: with {json.dumps(contrast)} PyTorch's step differs by {far:.2e}")
            if far <= 10 * TOL:
                bad.append(f"{fam}: {json.dumps(contrast)} changes the step by {far:.2e} only")
    if bad:
        sys.exit("FAIL: " + "; ".join(bad))


def main():
    hf_logging.disable_progress_bar()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    run(sys.argv[1], int(sys.argv[2]), sys.argv[3])


if __name__ == "__main__":
    main()
