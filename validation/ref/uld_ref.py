#!/usr/bin/env python3
"""Reference for validation/unit/test_uld.c: TRL's own GOLD losses (trl/experimental/gold,
ULDLoss with GOLDConfig's defaults: use_extended_uld, the "observed" merge, uld_skip_*_eos,
beta 0.5, hybrid weights None = adaptive, distillation weight 1), run on random logits, and
its byte-offset alignment and vocabulary matching.

    uld_ref.py DIR

writes into DIR:
  loss.txt    cases of ULDLoss.__call__: random logits of 3 samples (answers of different
              lengths, split tokens on both sides, zero-width tokens, a remainder past the last
              common boundary, a sample whose answer is its EOS alone, rows sharp enough that
              the merge's and the JSD's clamps bite), vocab widths 300/517 both ways,
              temperatures 1 and 2, a third of the input tokens their row's most likely, the
              plain loss and the hybrid (adaptive and fixed weights, beta 0.5, 0 and 1); its loss and torch.autograd's gradient w.r.t. the student's
              logits. Per case:
                "B Ss St Vs Vt Ts Tt hybrid adaptive wm wu beta dw"
                per sample "s_start s_size t_start t_size" (the answer rows GOLD scores), then
                its student END offsets and teacher END offsets (one line each)
                ids_s (B*Ss), ids_t (B*St), zs (B*Ss*Vs), zt, ps (softmax(z / T) of the answer
                rows as GOLD computes them, 0 elsewhere), pt, the loss, dzs (B*Ss*Vs)
  align.txt   _align_by_byte_offsets on random non-decreasing END offsets, after GOLD's drop
              of pairs with an empty side, with and without the remainder ("cut"): per case
              "ns nt cut", s_end, t_end, the number of groups, then per group
              "len_s i... len_t j..."
  teacher.json, student.json  two byte-level BPE tokenizers trained by `tokenizers` on
              different corpora (they share the byte alphabet, some merges and two added
              tokens), the hybrid cases' tokenizers
  match.txt   GOLD's mapping of their vocabularies (ULDLoss._vocab_mapping): "n" then n lines
              "teacher_id student_id" by teacher id
"""
import dataclasses
import os
import random
import sys
import types
import warnings

warnings.simplefilter("ignore")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402
from trl.experimental.gold.gold_config import GOLDConfig  # noqa: E402
from trl.experimental.gold.gold_trainer import ULDLoss  # noqa: E402

out = sys.argv[1]
rng = random.Random(39)
torch.manual_seed(39)

# GOLDConfig's defaults of what ULDLoss reads (the dataclass fields, without building the
# TrainingArguments around them)
DEFAULTS = {f.name: f.default for f in dataclasses.fields(GOLDConfig)
            if f.name.startswith("uld_") or f.name in ("beta", "use_extended_uld")}


def config(**kw):
    c = dict(DEFAULTS)
    c.update(kw)
    return types.SimpleNamespace(**c)


def nums(xs, fmt="%.9g"):
    return " ".join(fmt % v for v in xs)


# --- the two tokenizers ------------------------------------------------------------------
WORDS_A = ("the of and to in is was for on that with as by at from his her an were which "
           "student model learns teacher logits token probability distill align merge byte "
           "offset group vocabulary loss gradient sort").split()
WORDS_B = ("the of and to in is it you that he was for on are with as I his they be at one "
           "have this teacher transformer attention head layer vocabulary tokenizer byte "
           "distribution entropy divergence").split()


def corpus(words, seed):
    r = random.Random(seed)
    return [" ".join(r.choice(words) for _ in range(r.randint(4, 14))) + r.choice(".,!?")
            for _ in range(400)]


def train(lines, vocab, specials, added):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t.add_tokens(added)
    return t


ttok = train(corpus(WORDS_B, 1), 420, ["<|endoftext|>", "<pad>"], ["<think>", "</think>"])
stok = train(corpus(WORDS_A, 2), 330, ["<|endoftext|>", "<|im_start|>"], ["<think>"])
for name, t in (("teacher", ttok), ("student", stok)):
    with open(os.path.join(out, name + ".json"), "w") as f:
        f.write(t.to_str())
hf_t = PreTrainedTokenizerFast(tokenizer_object=ttok)
hf_s = PreTrainedTokenizerFast(tokenizer_object=stok)
probe = ULDLoss(config(uld_use_hybrid_loss=True), student_tokenizer=hf_s, teacher_tokenizer=hf_t)
mapping = sorted(probe._vocab_mapping.items())
with open(os.path.join(out, "match.txt"), "w") as f:
    f.write("%d\n" % len(mapping) + "".join("%d %d\n" % kv for kv in mapping))
# the logits' widths: each tokenizer's ids plus padding ids, as models round vocab_size up
HYB_VS, HYB_VT = len(hf_s) + 23, len(hf_t) + 97


# --- the loss cases ----------------------------------------------------------------------
def ends_of(L, keep, zero_width):
    """Non-decreasing END offsets of tokens covering bytes [0, L): cuts kept with probability
    `keep`, a zero-width token now and then."""
    e = [x for x in range(1, L) if rng.random() < keep] + [L]
    out = []
    for x in e:
        out.append(x)
        if rng.random() < zero_width:
            out.append(x)
    return out


def sample(L, Ss, St, shape):
    """One sample's student and teacher token layout: prompt rows, answer rows, the EOS row
    (byte offsets (L, L)), padding. shape: 'full' both answers cover the text; 'rem' the
    student stops short of the teacher's last boundary (a remainder group); 'eos' the
    student's answer is its EOS alone."""
    se = ends_of(L, 0.55, 0.05)
    te = ends_of(L, 0.4, 0.05)
    if shape == "rem":
        se = [x for x in se if x < L - 3] + [L - 2]
    if shape == "eos":
        se = []
    sides = []
    for e, S in ((se, Ss), (te, St)):
        n_prompt = rng.randint(1, S - len(e) - 1)
        labels = [-100] * S
        offs = [[0, 0] for _ in range(S)]
        for k, x in enumerate(e + [L]):  # the answer then its EOS (zero-width at the end)
            labels[n_prompt + k] = 1
            offs[n_prompt + k] = [e[k - 1] if k else 0, x]
        sides.append((labels, offs))
    return sides


def loss_case(Vs, Vt, Ts, Tt, hybrid=False, adaptive=True, wm=None, wu=None, beta=0.5,
              shapes=("full", "rem", "full"), sharp=(1.0, 8.0, 3.0)):
    B, Ss, St = len(shapes), 36, 40
    labs, offs = [[], []], [[], []]
    for i, shape in enumerate(shapes):
        for side, (lab, off) in enumerate(sample(rng.randint(12, 26), Ss, St, shape)):
            labs[side].append(lab)
            offs[side].append(off)
    ls, lt = torch.tensor(labs[0]), torch.tensor(labs[1])
    os_, ot = torch.tensor(offs[0]), torch.tensor(offs[1])
    ids_s = torch.randint(0, Vs, (B, Ss))
    ids_t = torch.randint(0, Vt, (B, St))
    scale = torch.tensor(sharp[:B]).view(B, 1, 1)
    zs = (torch.randn(B, Ss, Vs) * scale).requires_grad_(True)
    zt = torch.randn(B, St, Vt) * scale
    # a third of the rows' input tokens are the row's most likely token: their factors in a
    # sharp row are not clamped, beside clamped ones
    with torch.no_grad():
        for ids, z in ((ids_s, zs), (ids_t, zt)):
            top = torch.rand(ids.shape) < 0.35
            ids[top] = z.argmax(-1)[top]
    kw = dict(uld_student_temperature=Ts, uld_teacher_temperature=Tt, beta=beta)
    if hybrid:
        kw.update(uld_use_hybrid_loss=True)
        if not adaptive:
            kw.update(uld_hybrid_matched_weight=wm, uld_hybrid_unmatched_weight=wu)
        uld = ULDLoss(config(**kw), student_tokenizer=hf_s, teacher_tokenizer=hf_t)
    else:
        uld = ULDLoss(config(**kw))
    loss = uld(zs, zt, ls, lt, ids_s, ids_t, student_byte_offsets=os_, teacher_byte_offsets=ot)
    loss.backward()
    # what GOLD scores: its own answer spans, less the EOS, and the probabilities it computes
    s_idx, s_size = uld._get_start_and_size_answers(ls)
    t_idx, t_size = uld._get_start_and_size_answers(lt)
    ps, pt = torch.zeros(B, Ss, Vs), torch.zeros(B, St, Vt)
    lines = ["%d %d %d %d %d %.9g %.9g %d %d %.9g %.9g %.9g %.9g" % (
        B, Ss, St, Vs, Vt, Ts, Tt, hybrid, adaptive, wm or 0, wu or 0, beta,
        uld.distillation_weight)]
    with torch.no_grad():
        for i in range(B):
            a, n, b, m = s_idx[i], s_size[i] - 1, t_idx[i], t_size[i] - 1
            if n > 0:
                ps[i, a:a + n] = F.softmax(zs[i, a:a + n] / Ts, dim=-1)
            if m > 0:
                pt[i, b:b + m] = F.softmax(zt[i, b:b + m] / Tt, dim=-1)
            lines += ["%d %d %d %d" % (a, max(n, 0), b, max(m, 0)),
                      nums(os_[i, a:a + max(n, 0), 1].tolist(), "%d"),
                      nums(ot[i, b:b + max(m, 0), 1].tolist(), "%d")]
    lines += [nums(ids_s.reshape(-1).tolist(), "%d"), nums(ids_t.reshape(-1).tolist(), "%d")]
    for x in (zs.detach(), zt, ps, pt):
        lines.append(nums(x.reshape(-1).tolist()))
    lines += ["%.12g" % loss.item(), nums(zs.grad.reshape(-1).tolist())]
    return lines


cases = [
    loss_case(300, 517, 1.0, 1.0),
    loss_case(300, 517, 2.0, 1.0, shapes=("full", "eos", "rem")),
    loss_case(517, 300, 1.0, 2.0, shapes=("rem", "full")),
    loss_case(HYB_VS, HYB_VT, 2.0, 2.0, hybrid=True),
    loss_case(HYB_VS, HYB_VT, 1.0, 1.0, hybrid=True, adaptive=False, wm=0.7, wu=0.3),
    loss_case(HYB_VS, HYB_VT, 1.0, 2.0, hybrid=True, adaptive=False, wm=1.5, wu=0.25, beta=0.0),
    loss_case(HYB_VS, HYB_VT, 2.0, 1.0, hybrid=True, beta=1.0, shapes=("rem", "full", "eos")),
]
with open(os.path.join(out, "loss.txt"), "w") as f:
    f.write("%d\n" % len(cases) + "".join("\n".join(c) + "\n" for c in cases))


# --- the alignment -----------------------------------------------------------------------
def rand_ends(n, L):
    return sorted(rng.randint(0, L) for _ in range(n))


with open(os.path.join(out, "align.txt"), "w") as f:
    lines = []
    for k in range(400):
        L = rng.randint(1, 40)
        if k % 4 == 0:  # tokenizations of one text: both end at L
            s = ends_of(L, rng.random(), 0.1)
            t = ends_of(L, rng.random(), 0.1)
        else:  # anything non-decreasing, empty sides too
            s = rand_ends(rng.randint(0, 12), L)
            t = rand_ends(rng.randint(0, 12), L)
        raw_s, raw_t = ULDLoss._align_by_byte_offsets([[0, x] for x in s], [[0, x] for x in t])
        for cut in (0, 1):
            gs, gt = list(raw_s), list(raw_t)
            # the remainder GOLD appends after the walk: the last group, when it does not close
            # at a common boundary (a closed group ends at the same byte on both sides)
            if cut and gs and (not gs[-1] or not gt[-1] or s[gs[-1][-1]] != t[gt[-1][-1]]):
                gs, gt = gs[:-1], gt[:-1]
            pairs = [(a, b) for a, b in zip(gs, gt) if a and b]  # GOLD's drop of empty sides
            lines += ["%d %d %d" % (len(s), len(t), cut), nums(s, "%d"), nums(t, "%d"),
                      "%d" % len(pairs)]
            lines += ["%d %s %d %s" % (len(a), nums(a, "%d"), len(b), nums(b, "%d"))
                      for a, b in pairs]
    f.write("800\n" + "\n".join(lines) + "\n")
