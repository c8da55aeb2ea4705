#!/usr/bin/env python3
"""Cross-tokenizer distillation (loss%kind = 'uld') against TRL's GOLD (test_xtok.sh).

  xtok_ref.py make WORK [bench]
                               two tokenizers trained by Hugging Face `tokenizers` (a
                               Qwen2/Qwen3-style byte-level BPE of 6,000 tokens for the
                               teacher, a Llama-3-style one of 1,200 for the student), each with
                               its own chat template; a random Qwen3 teacher and a random Llama
                               student written by transformers with them (hf_teacher,
                               hf_student); conversations of many lengths (chat.jsonl: one
                               exchange each, for GOLD, whose answer is one span; multi.jsonl:
                               several turns); bench: the models with Qwen3's and Llama 3's
                               vocabulary widths, bench.jsonl of 64 longer exchanges
                               (validation/perf/xtok_step.sh)
  xtok_ref.py check WORK PREFIX RUN [MATCHED UNMATCHED]
                               the first step's loss_kd and grad_norm of RUN/metrics.csv against
                               TRL's GOLD ULDLoss (trl.experimental.gold, its defaults: token
                               merge 'observed', extended ULD, both skip-eos on, temperatures 1,
                               beta 0.5; the hybrid with fixed weights when given) on the
                               documents of kdprep's files PREFIX*, with the models' own logits
                               (fp32), each document one sample (data%pack = .false.) and the
                               global batch all of them
"""
import json
import os
import random
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from onpolicy_ref import metrics_row  # noqa: E402  (the first step's row of a run's metrics)
TOL = 1e-4

WORDS = ["light", "water", "the earth", "seven days", "a river", "stars", "bread", "salt",
         "naïve café", "Straße", "日本語の文章", "中文句子", "한국어", "emoji 🎉🚀", "Ελληνικά",
         "русский текст", "12345 apples", "  spaced   out ", "tabs\tand\nlines", "العربية"]


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n)).strip()


def conversations(rng, n, turns, most):
    out = []
    for i in range(n):
        msgs = []
        for _ in range(turns if turns else 1):
            msgs.append({"role": "user", "content": sentence(rng, rng.randint(1, 6))})
            msgs.append({"role": "assistant", "content": sentence(rng, rng.randint(1, most))})
        out.append({"messages": msgs})
    return out


def tokenizer_dir(tok, eos, template, path):
    from transformers import PreTrainedTokenizerFast
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=eos)
    fast.chat_template = template
    fast.save_pretrained(path)
    return len(fast)


def make(work, bench=False):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging
    import tokenizer_ref
    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    rng = random.Random(5)
    lines = tokenizer_ref.kjv_lines(None)[:3000] + [sentence(rng, 8) for _ in range(3000)]
    teacher_tok = tokenizer_ref.bytelevel_kind(lines, "qwen2_big")
    student_tok = tokenizer_ref.bytelevel_kind(lines, "llama3")
    chatml = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    llama = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
             "{{ m['content'] }}<|eot_id|>{% endfor %}"
             "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
             "{% endif %}")
    nt = tokenizer_dir(teacher_tok, "<|im_end|>", chatml, os.path.join(work, "hf_teacher"))
    ns = tokenizer_dir(student_tok, "<|eot_id|>", llama, os.path.join(work, "hf_student"))
    torch.manual_seed(3)
    # bench: the real families' vocabulary widths (Qwen3's 151,936, Llama 3's 128,256; the ids
    # past the tokenizers are padding), the sizes the sorts and gathers work on
    teacher = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=151936 if bench else (nt + 63) // 64 * 64, hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=512, tie_word_embeddings=False, rope_theta=10000.0))
    student = LlamaForCausalLM(LlamaConfig(
        vocab_size=128256 if bench else (ns + 31) // 32 * 32, hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, tie_word_embeddings=False, rope_theta=10000.0))
    for m, role in ((teacher, "teacher"), (student, "student")):
        with torch.no_grad():  # transformers ones the norms: make them matter
            for name, p in m.named_parameters():
                if "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
                else:
                    p.mul_(4.0)  # peaked distributions: ULD's sorted mass is not all noise
        m.save_pretrained(os.path.join(work, f"hf_{role}"))
    sets = (("bench.jsonl", 0, 64),) if bench else (("chat.jsonl", 0, 12), ("multi.jsonl", 3, 8))
    for name, turns, n in sets:
        with open(os.path.join(work, name), "w", encoding="utf-8") as f:
            for c in conversations(rng, n, turns, 60 if bench else 9):
                f.write(json.dumps(c, ensure_ascii=False) + "\n")
    print(f"teacher: Qwen3, {nt} tokens, vocab_size {teacher.config.vocab_size}; student: Llama, "
          f"{ns} tokens, vocab_size {student.config.vocab_size}")


def read_indexed(prefix):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    ds = IndexedDataset(prefix, multimodal=False, mmap=True)
    return [np.array(ds[i]) for i in range(len(ds))]


def gold_setup(work, **kw):
    """The two sides' Hugging Face tokenizers and fp32 models of WORK and TRL's GOLD ULDLoss
    with GOLDConfig's defaults (kw: the hybrid's settings)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    from trl.experimental.gold import GOLDConfig
    from trl.experimental.gold.gold_trainer import ULDLoss
    hf_logging.disable_progress_bar()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = GOLDConfig(output_dir=os.path.join(work, "gold"), use_uld_loss=True, report_to=[],
                     use_cpu=True, bf16=False, **kw)
    hf = {r: os.path.join(work, f"hf_{r}") for r in ("teacher", "student")}
    toks = {r: AutoTokenizer.from_pretrained(hf[r]) for r in hf}
    models = {r: AutoModelForCausalLM.from_pretrained(hf[r], dtype=torch.float32,
                                                      attn_implementation="eager").eval()
              for r in hf}
    return toks, models, ULDLoss(cfg, student_tokenizer=toks["student"],
                                 teacher_tokenizer=toks["teacher"])


def check(work, prefix, run, matched=None, unmatched=None):
    import torch
    hybrid = matched is not None
    kw = {"uld_use_hybrid_loss": True, "uld_hybrid_matched_weight": float(matched),
          "uld_hybrid_unmatched_weight": float(unmatched)} if hybrid else {}
    toks, models, uld = gold_setup(work, **kw)
    ids = {"student": read_indexed(prefix), "teacher": read_indexed(prefix + "_teacher")}
    offs = {"student": read_indexed(prefix + "_offsets"),
            "teacher": read_indexed(prefix + "_teacher_offsets")}
    losses = []
    for d in range(len(ids["student"])):
        inp, lab, bo = {}, {}, {}
        for r in ("student", "teacher"):
            x = torch.tensor(ids[r][d].astype(np.int64))[None]
            o = torch.tensor(offs[r][d].astype(np.int64))
            inp[r] = x
            lab[r] = torch.where(o[None] >= 0, x, torch.full_like(x, -100))
            ends = o.clamp_min(0)
            bo[r] = torch.stack([ends, ends], -1)[None]  # GOLD reads the ends only
        with torch.no_grad():
            zt = models["teacher"](inp["teacher"]).logits
        zs = models["student"](inp["student"]).logits
        losses.append(uld(zs, zt, lab["student"], lab["teacher"], inp["student"], inp["teacher"],
                          student_byte_offsets=bo["student"], teacher_byte_offsets=bo["teacher"]))
    loss = torch.stack([l.reshape(()) for l in losses]).mean()
    models["student"].zero_grad()
    loss.backward()
    gn = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in models["student"].parameters()
                        if p.grad is not None)).item()
    row = metrics_row(run)
    got_kd, got_gn = float(row["loss_kd"]), float(row["grad_norm"])
    what = "hybrid" if hybrid else "ULD"
    print(f"{run}: {what}: kdtrain loss_kd {got_kd:.9g} grad_norm {got_gn:.9g}; GOLD "
          f"{loss.item():.9g} grad_norm {gn:.9g} over {len(losses)} documents")
    bad = abs(got_kd - loss.item()) > TOL * max(1.0, abs(loss.item())) or \
        abs(got_gn - gn) > TOL * max(1.0, gn)
    if bad:
        sys.exit(f"FAIL: {run}: kdtrain and GOLD differ by more than {TOL}")


def onpolicy(work, prefix, run):
    """Step 1 of an on-policy run (loss%onpolicy = 1, data%pack = .false., rollouts saved)
    against GOLD: the student's rows from rollouts.h5, each continuation's text decoded as GOLD
    does (skip_special_tokens=False) and re-encoded by the teacher's tokenizer with GOLD's own
    encode_with_byte_offsets after the teacher's prompt of the same document (kdprep's teacher
    tokens before its first answer token), the teacher's end of sequence appended at the text's
    end; the student's ends by GOLD's piece_byte_len."""
    import h5py
    import torch
    from trl.experimental.utils import encode_with_byte_offsets, piece_byte_len
    toks, models, uld = gold_setup(work)
    sdocs, tdocs = read_indexed(prefix), read_indexed(prefix + "_teacher")
    toffs = read_indexed(prefix + "_teacher_offsets")
    with h5py.File(os.path.join(run, "rollouts.h5"), "r") as f:
        rows = f["step"][()] == 1
        tok, plen, glen = f["tokens"][()][rows], f["prompt_len"][()][rows], f["gen_len"][()][rows]
        ttok, tplen, tlen = (f[k][()][rows] for k in ("teacher_tokens", "teacher_prompt_len",
                                                      "teacher_len"))
    losses = []
    for r in range(len(tok)):
        P, n = int(plen[r]), int(glen[r])
        prompt, cont = [int(x) for x in tok[r][:P]], [int(x) for x in tok[r][P:P + n]]
        d = [i for i, x in enumerate(sdocs) if len(x) >= P and [int(y) for y in x[:P]] == prompt]
        assert d, f"row {r}: no document starts with its prompt"
        first = int(np.argmax(toffs[d[0]] >= 0))
        tprompt = [int(x) for x in tdocs[d[0]][:first]]
        text = toks["student"].decode(cont, skip_special_tokens=False,
                                      clean_up_tokenization_spaces=False)
        (tids, toff), = encode_with_byte_offsets(toks["teacher"].backend_tokenizer, [text])
        clen = len(text.encode("utf-8"))
        t_ids = tprompt + list(tids) + [toks["teacher"].eos_token_id]
        t_off = [(0, 0)] * len(tprompt) + list(toff) + [(clen, clen)]
        got = [int(x) for x in ttok[r][:int(tplen[r]) + int(tlen[r])]]
        if got != t_ids or int(tplen[r]) != len(tprompt):
            sys.exit(f"FAIL: {run}: rollouts.h5 row {r}: the teacher's tokens {got} (prompt "
                     f"{int(tplen[r])}), expected {t_ids} (prompt {len(tprompt)}): the C "
                     "tokenizer's re-encoding differs from Hugging Face's")
        s_off, at = [(0, 0)] * P, 0
        for c in cont:  # an id past the tokenizer (the model's padding ids): 0 bytes, no text
            piece = toks["student"].convert_ids_to_tokens([c])[0]
            nb = piece_byte_len(piece) if piece is not None else 0
            s_off.append((at, at + nb))
            at += nb
        xs, xt = torch.tensor([prompt + cont]), torch.tensor([t_ids])
        ls = torch.tensor([[-100] * P + cont])
        lt = torch.tensor([[-100] * len(tprompt) + t_ids[len(tprompt):]])
        with torch.no_grad():
            zt = models["teacher"](xt).logits
        zs = models["student"](xs).logits
        losses.append(uld(zs, zt, ls, lt, xs, xt, student_byte_offsets=torch.tensor([s_off]),
                          teacher_byte_offsets=torch.tensor([t_off])).reshape(()))
    loss = torch.stack(losses).mean()
    loss.backward()
    gn = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in models["student"].parameters()
                        if p.grad is not None)).item()
    row = metrics_row(run)
    got_kd, got_gn = float(row["loss_kd"]), float(row["grad_norm"])
    print(f"{run}: rollouts.h5 keeps the teacher's tokenization of the {len(tok)} rows, "
          "Hugging Face's ids")
    print(f"{run}: on-policy ULD: kdtrain loss_kd {got_kd:.9g} grad_norm {got_gn:.9g}; GOLD "
          f"{loss.item():.9g} grad_norm {gn:.9g} over {len(losses)} continuations")
    if abs(got_kd - loss.item()) > TOL * max(1.0, abs(loss.item())) or \
            abs(got_gn - gn) > TOL * max(1.0, gn):
        sys.exit(f"FAIL: {run}: kdtrain and GOLD differ by more than {TOL}")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    if sys.argv[1] == "make":
        make(sys.argv[2], len(sys.argv) > 3 and sys.argv[3] == "bench")
    elif sys.argv[1] == "check":
        check(*sys.argv[2:])
    elif sys.argv[1] == "onpolicy":
        onpolicy(*sys.argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
