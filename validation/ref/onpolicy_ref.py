#!/usr/bin/env python3
"""On-policy distillation of kdtrain (loss%onpolicy, src/onpolicy.c) against TRL's GKD loss
and transformers' own generation (validation/e2e/test_onpolicy.sh drives it).

  onpolicy_ref.py make WORK SEQ_LEN
      A random Qwen2 teacher and student written by transformers (ref_step.py's 'qwen2'
      family) into WORK/hf_teacher and WORK/hf_student, and two token files of exactly two
      windows of SEQ_LEN + 1 tokens (2 * SEQ_LEN + 1 ids; a global batch of 2 is both
      windows): WORK/tokens.h5 with /loss_mask, the first PROMPTS[w] tokens of window w not
      counted (its prompt), and WORK/plain.h5 without a mask.
  onpolicy_ref.py check WORK RUN BETA [RUN BETA ...]
      The step-1 rows of RUN/rollouts.h5 (the sequences kdtrain's student generated and
      trained on): the loss of TRL's GKDTrainer.generalized_jsd_loss (the installed TRL's
      own function) with labels -100 outside the generated tokens (the completion mask),
      temperature 1, on the student's and the teacher's logits of transformers' models
      loaded from WORK/hf_*, and the L2 norm of its gradient over the student's
      parameters, against RUN/metrics.csv's step-1 loss and grad_norm (relative 1e-4).
      kdtrain's loss%kind for TRL's beta: 0 -> 'fkl' (KL(teacher || student)), 1 -> 'rkl'
      (KL(student || teacher)), else 'jsd' with loss%beta = beta (both weight the teacher
      by beta in the mixture). Also checks each row's shape: the window's prompt is the
      token file's, the mask covers exactly the continuation, an end id only at its end,
      and the gen_len and gen_eos_frac columns.
  onpolicy_ref.py greedy WORK RUN
      RUN ran with generate%temperature = 0: every continuation of step 1 equals
      transformers' generate(do_sample=False) of the student from the same prompt, with the
      same end ids and at most the same number of new tokens.
  onpolicy_ref.py same RUN_A RUN_B
      RUN_A/rollouts.h5 and RUN_B/rollouts.h5 hold the same rows (every dataset).
"""
import csv
import os
import sys

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
import h5py  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch = ref_step = None  # imported by torch_stack() where needed: 'same' runs without them


def torch_stack():
    global torch, ref_step
    import torch as t
    from transformers.utils import logging as hf_logging
    import ref_step as r
    torch, ref_step = t, r
    hf_logging.disable_progress_bar()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

TOL = 1e-4
PROMPTS = (5, 11)  # prompt tokens of window 0 and window 1
FAMILY = "qwen2"
EOS = (3, 17, 29, 41, 53, 65, 77, 89)  # test_onpolicy.sh's generate%eos
MAX_NEW = 24  # test_onpolicy.sh's generate%max_new_tokens


def gkd_loss():
    """TRL's generalized JSD loss, from wherever the installed TRL keeps GKDTrainer."""
    try:
        from trl.experimental.gkd import GKDTrainer
    except ImportError:
        from trl import GKDTrainer
    return GKDTrainer.generalized_jsd_loss


def make(work, T):
    d = ref_step.make(work, FAMILY, T)  # the models (and a token file replaced below)
    for role in ("teacher", "student"):
        os.replace(os.path.join(d, f"hf_{role}"), os.path.join(work, f"hf_{role}"))
    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, 256, (2 * T + 1,), generator=g).numpy().astype(np.int32)
    mask = np.ones(len(tokens), dtype=np.uint8)
    for w, p in enumerate(PROMPTS):  # window w: tokens w T .. w T + T; its first p not counted
        mask[w * T: w * T + p] = 0
    with h5py.File(os.path.join(work, "tokens.h5"), "w") as f:
        f["tokens"] = tokens
        f["loss_mask"] = mask
    with h5py.File(os.path.join(work, "plain.h5"), "w") as f:
        f["tokens"] = tokens
    print(f"teacher and student written by transformers; windows with prompts of {PROMPTS} tokens")


def rollouts(run, step=1):
    with h5py.File(os.path.join(run, "rollouts.h5"), "r") as f:
        assert f.attrs["format"] in (b"kdtrain-rollouts", "kdtrain-rollouts"), f.attrs["format"]
        rows = f["step"][()] == step
        return {k: f[k][()][rows] for k in ("tokens", "loss_mask", "step", "sample", "prompt_len",
                                            "gen_len")}


def metrics_row(run, step=1):
    with open(os.path.join(run, "metrics.csv"), newline="") as f:
        for row in csv.DictReader(f):
            if row["step"] == str(step) and row["loss"] != "":
                return row
    sys.exit(f"FAIL: {run}/metrics.csv has no row of step {step}")


def check_shape(work, run, r):
    """The rows are prompt + continuation as onpolicy.h says; gen_len, gen_eos_frac agree."""
    with h5py.File(os.path.join(work, "tokens.h5"), "r") as f:
        data = f["tokens"][()]
    T = r["tokens"].shape[1] - 1
    prompts = {tuple(data[w * T: w * T + p]) for w, p in enumerate(PROMPTS)}
    ended = 0
    for i in range(len(r["step"])):
        P, n, tok, m = int(r["prompt_len"][i]), int(r["gen_len"][i]), r["tokens"][i], r["loss_mask"][i]
        want = np.zeros(T + 1, dtype=m.dtype)
        want[P:P + n] = 1
        if tuple(tok[:P]) not in prompts or not (m == want).all() or (tok[P + n:] != 0).any():
            sys.exit(f"FAIL: {run}: row {i} (P {P}, n {n}) is not prompt + continuation + padding")
        if n < 1 or n > min(MAX_NEW, T + 1 - P):
            sys.exit(f"FAIL: {run}: row {i}: {n} tokens generated")
        c = list(tok[P:P + n])
        if any(t in EOS for t in c[:-1]):
            sys.exit(f"FAIL: {run}: row {i}: an end id before the end of its continuation")
        ended += c[-1] in EOS
    row = metrics_row(run)
    for col, want in (("gen_len", r["gen_len"].mean()), ("gen_eos_frac", ended / len(r["step"]))):
        if abs(float(row[col]) - want) > 1e-9:
            sys.exit(f"FAIL: {run}: {col} {row[col]}, rollouts.h5 says {want}")
    if not float(row["gen_tok_per_s"]) > 0:
        sys.exit(f"FAIL: {run}: gen_tok_per_s {row['gen_tok_per_s']}")
    return ended


def check(work, run, beta):
    r = rollouts(run)
    ended = check_shape(work, run, r)
    teacher = ref_step.load(os.path.join(work, "hf_teacher"))
    student = ref_step.load(os.path.join(work, "hf_student"))  # fresh: its grads are this run's
    ids = torch.from_numpy(r["tokens"].astype(np.int64))
    labels = torch.where(torch.from_numpy(r["loss_mask"]) != 0, ids, -100)
    with torch.no_grad():
        zt = teacher(ids).logits[:, :-1]
    zs = student(ids).logits[:, :-1]
    loss = gkd_loss()(zs, zt, labels=labels[:, 1:], beta=beta, temperature=1.0,
                      reduction="batchmean")
    loss.backward()
    gn = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in student.parameters()
                        if p.grad is not None)).item()
    row = metrics_row(run)
    a, b = (float(row["loss"]), float(row["grad_norm"])), (loss.item(), gn)
    worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
    print(f"{run}: beta {beta}: {len(r['step'])} generated rows ({int(r['gen_len'].sum())} tokens, "
          f"{ended} ended by an end id): kdtrain / TRL loss {a[0]:.9g} / {b[0]:.9g}, grad_norm "
          f"{a[1]:.9g} / {b[1]:.9g} | worst {worst:.2e}")
    if worst > TOL:
        sys.exit(f"FAIL: {run}: kdtrain's on-policy step is not TRL's GKD loss")


def greedy(work, run):
    r = rollouts(run)
    check_shape(work, run, r)
    student = ref_step.load(os.path.join(work, "hf_student"))
    T = r["tokens"].shape[1] - 1
    for i in range(len(r["step"])):
        P, n, tok = int(r["prompt_len"][i]), int(r["gen_len"][i]), r["tokens"][i]
        room = min(MAX_NEW, T + 1 - P)
        out = student.generate(torch.from_numpy(tok[None, :P].astype(np.int64)),
                               max_new_tokens=room, do_sample=False, eos_token_id=list(EOS),
                               pad_token_id=0)
        want = [int(t) for t in out[0, P:]]
        got = [int(t) for t in tok[P:P + n]]
        if got != want:
            sys.exit(f"FAIL: {run}: row {i}: kdtrain {got} != transformers {want}")
    print(f"{run}: {len(r['step'])} greedy continuations = transformers' generate")


def same(a, b):
    with h5py.File(os.path.join(a, "rollouts.h5"), "r") as fa, \
            h5py.File(os.path.join(b, "rollouts.h5"), "r") as fb:
        for k in ("tokens", "loss_mask", "step", "sample", "prompt_len", "gen_len"):
            if fa[k].shape != fb[k].shape or not (fa[k][()] == fb[k][()]).all():
                sys.exit(f"FAIL: {a} and {b}: /{k} differs ({fa[k].shape} vs {fb[k].shape})")
        print(f"{a} = {b}: {fa['step'].shape[0]} rows, steps {sorted(set(fa['step'][()]))}")


def main():
    cmd, args = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if cmd == "same" and len(args) == 2:
        same(args[0], args[1])
        return
    if cmd not in ("make", "check", "greedy") or len(args) < 2 or \
            (cmd == "check" and len(args) % 2 != 1) or (cmd != "check" and len(args) != 2):
        sys.exit(__doc__)
    torch_stack()
    if cmd == "make":
        make(args[0], int(args[1]))
    elif cmd == "check":
        for run, beta in zip(args[1::2], args[2::2]):
            check(args[0], run, float(beta))
    else:
        greedy(args[0], args[1])


if __name__ == "__main__":
    main()
