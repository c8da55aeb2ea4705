"""docs_ref.py WORK T: the data and the reference numbers of test_documents.sh.

Writes into WORK:
  tok/              a byte-level BPE tokenizer trained on the corpus, with a chat template
                    (<|im_start|>ROLE ... <|im_end|>), saved by transformers
  train.jsonl, valid.jsonl   chat conversations of many lengths (one to three turns, short
                    and long answers; a few longer than seq_len + 1 = T + 1 tokens)
  hf_KIND/          random models written by transformers' own classes: qwen2 (full
                    attention), mistral_sw (a sliding window of 5 on every layer, shorter than
                    every conversation) and gemma3 (window 16, a soft cap of the scores)
  want_KIND.txt     transformers' loss of that model on the validation set: every
                    conversation alone (cut to its first T + 1 tokens, as kdtrain cuts a
                    document longer than a window), the cross entropy summed over the tokens
                    kdprep counts (the assistant turns), divided by their number
  want_KIND.bf16.txt  the same with the model's weights in bfloat16 (the BF16 tolerance's
                    reference scale)
  lengths.txt       the conversations' token lengths (valid set)
The conversations are tokenized by transformers' apply_chat_template here; kdprep --chat
(run by the test) must give the same ids and a mask of the assistant turns
(kdprep_check.py proves that)."""
import json
import os
import sys
import warnings

warnings.simplefilter("ignore")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast)  # noqa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_roundtrip import make_gemma, make_model  # noqa: E402

work, T = sys.argv[1], int(sys.argv[2])
src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
corpus = os.path.join(src, "input/corpus/kjv-train.txt")
os.chdir(work)
torch.manual_seed(5)
rng = np.random.default_rng(5)

tk = Tokenizer(models.BPE())
tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tk.decoder = decoders.ByteLevel()
tk.train([corpus], trainers.BpeTrainer(
    vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>",
                               pad_token="<|endoftext|>")
fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                      "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
                      "assistant\n{% endif %}")
fast.save_pretrained("tok")
tok = AutoTokenizer.from_pretrained("tok")
V = len(tok)

words = open(corpus, encoding="utf-8").read().split()


def text(n):
    """n words from a random place of the corpus."""
    i = int(rng.integers(0, len(words) - n))
    return " ".join(words[i:i + n])


def conversation():
    """One to three turns; answers from 1 to 30 words (a few conversations are long)."""
    msgs = []
    for _ in range(int(rng.choice([1, 1, 1, 2, 3]))):
        msgs.append({"role": "user", "content": text(int(rng.integers(1, 8)))})
        msgs.append({"role": "assistant", "content": text(int(rng.integers(1, 31)))})
    return msgs


def write(name, n):
    convs = [conversation() for _ in range(n)]
    with open(name, "w") as f:
        for c in convs:
            f.write(json.dumps({"messages": c}) + "\n")
    return convs


write("train.jsonl", 64)
valid = write("valid.jsonl", 40)


def ids_and_mask(c):
    """The ids of the rendered conversation and kdprep's mask: the assistant turns' content
    and end of turn count, every header and user turn does not."""
    ids, mask = [], []
    for turn in c:
        head = tok(f"<|im_start|>{turn['role']}\n", add_special_tokens=False)["input_ids"]
        body = tok(f"{turn['content']}<|im_end|>\n", add_special_tokens=False)["input_ids"]
        ids += head + body
        mask += [0] * len(head) + [int(turn["role"] == "assistant")] * len(body)
    whole = tok.apply_chat_template(c, tokenize=False)
    assert ids == tok(whole, add_special_tokens=False)["input_ids"], "boundary merge"
    return ids, mask


docs = [ids_and_mask(c) for c in valid]
lens = [len(i) for i, _ in docs]
with open("lengths.txt", "w") as f:
    f.write(" ".join(map(str, lens)) + "\n")
print(f"valid: {len(docs)} conversations of {min(lens)} to {max(lens)} tokens, "
      f"{sum(l > T + 1 for l in lens)} longer than T + 1 = {T + 1}; vocabulary {V}")


def loss_of(model):
    tot, n = 0.0, 0
    with torch.no_grad():
        for ids, mask in docs:
            ids, mask = ids[:T + 1], mask[:T + 1]
            logits = model(torch.tensor([ids])).logits[0].double()
            lp = torch.log_softmax(logits, -1)
            for t in range(len(ids) - 1):
                if mask[t + 1]:
                    tot -= float(lp[t, ids[t + 1]])
                    n += 1
    return tot / n, n


for kind in ("qwen2", "mistral_sw", "gemma3"):
    model = make_gemma(kind, V) if kind == "gemma3" else make_model(kind, V)
    model.config.max_position_embeddings = 256
    model.save_pretrained(f"hf_{kind}")
    tok.save_pretrained(f"hf_{kind}")
    want, n = loss_of(model)
    with open(f"want_{kind}.txt", "w") as f:
        f.write(f"{want:.10f} {n}\n")
    b = AutoModelForCausalLM.from_pretrained(f"hf_{kind}", dtype=torch.bfloat16).eval()
    wb, _ = loss_of(b)
    with open(f"want_{kind}.bf16.txt", "w") as f:
        f.write(f"{wb:.10f} {n}\n")
    print(f"{kind}: transformers' loss {want:.8f} over {n} counted tokens (bf16 weights {wb:.6f})")


# ---- one distillation step over every validation conversation, each run alone ------------
# The test's step: teacher mistral_sw, student qwen2, loss%kind 'fkl', alpha 0.5, temperature
# 2 (t2_scale), a global batch of every window of the validation file (one epoch: the same
# documents whatever the order and the packing). Per conversation alone (cut to T + 1): KD =
# sum over the counted positions of KL(p_t || p_s) at temperature tau, CE the hard-label cross
# entropy; loss = alpha tau^2 KD / N + (1 - alpha) CE / N over the N counted positions of all
# conversations; grad_norm the L2 norm of d loss over every student parameter (tied once).
import torch.nn.functional as F  # noqa: E402

ALPHA, TAU = 0.5, 2.0
teacher = AutoModelForCausalLM.from_pretrained("hf_mistral_sw", dtype=torch.float32).eval()
student = AutoModelForCausalLM.from_pretrained("hf_qwen2", dtype=torch.float32).eval()
kd = ce = 0.0
n = 0
terms = []
for ids, mask in docs:
    ids, mask = ids[:T + 1], mask[:T + 1]
    x = torch.tensor([ids])
    with torch.no_grad():
        zt = teacher(x).logits[0, :-1]
    zs = student(x).logits[0, :-1]
    counted = torch.tensor(mask[1:]) != 0
    target = torch.tensor(ids[1:])
    lps = F.log_softmax(zs / TAU, -1)
    lpt = F.log_softmax(zt / TAU, -1)
    k = F.kl_div(lps, lpt, reduction="none", log_target=True).sum(-1)[counted].sum()
    c = F.cross_entropy(zs[counted], target[counted], reduction="sum")
    terms.append((k, c))
    n += int(counted.sum())
loss = sum(ALPHA * TAU * TAU * k / n + (1 - ALPHA) * c / n for k, c in terms)
loss.backward()
gn = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in student.parameters()
                    if p.grad is not None))
kd = float(sum(k for k, _ in terms)) * TAU * TAU / n
ce = float(sum(c for _, c in terms)) / n
with open("want_step.txt", "w") as f:
    f.write(f"{loss.item():.10f} {kd:.10f} {ce:.10f} {gn.item():.10f}\n")
print(f"step: loss {loss.item():.8f} kd {kd:.8f} ce {ce:.8f} grad_norm {gn.item():.8f}")
