"""kdprep_check.py WORKDIR KDPREP_CMD...: the checks behind test_kdprep.sh.

Trains a small BPE tokenizer on input/corpus/kjv-train.txt (saved as a model-dir-like
folder with tokenizer.json, tokenizer_config.json and a chat template), runs kdprep on
plain text, JSONL, prompt/response JSONL and chat JSONL, and reads every dataset back
with an independent reader of the Megatron format (megatron.core's IndexedDataset when
it imports, else the published layout decoded here with numpy): the ids must be the
tokenizer's own, the masks exactly the response / assistant tokens.
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np

work, cmd = sys.argv[1], sys.argv[2:]
src = os.environ["KD_SRCDIR"]
os.chdir(work)


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


# ---- a local tokenizer -----------------------------------------------------------------
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import PreTrainedTokenizerFast, AutoTokenizer

tk = Tokenizer(models.BPE())
tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tk.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                             "<|im_end|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tk.train([os.path.join(src, "input/corpus/kjv-train.txt")], trainer)
fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>")
fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                      "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
                      "assistant\n{% endif %}")
fast.save_pretrained("tok")
tok = AutoTokenizer.from_pretrained("tok")
eos = tok.eos_token_id
enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]


# ---- an independent reader -------------------------------------------------------------
def read_published(prefix):
    """Decode PREFIX.idx/.bin by the layout of megatron/core/datasets/indexed_dataset.py."""
    codes = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
             7: np.float32, 8: np.uint16}
    raw = open(prefix + ".idx", "rb").read()
    if raw[:9] != b"MMIDIDX\x00\x00" or struct.unpack("<Q", raw[9:17])[0] != 1:
        fail(prefix + ".idx: bad header")
    dt = codes[raw[17]]
    nseq, ndoc = struct.unpack("<QQ", raw[18:34])
    off = 34
    lens = np.frombuffer(raw, np.int32, nseq, off)
    ptrs = np.frombuffer(raw, np.int64, nseq, off + 4 * nseq)
    docs = np.frombuffer(raw, np.int64, ndoc, off + 12 * nseq)
    if len(raw) != off + 12 * nseq + 8 * ndoc:
        fail(prefix + ".idx: size does not match the counts")
    if list(docs) != list(range(nseq + 1)):
        fail(prefix + ".idx: document indices are not 0..nseq")
    binb = open(prefix + ".bin", "rb").read()
    if len(binb) != int(lens.astype(np.int64).sum()) * np.dtype(dt).itemsize:
        fail(prefix + ".bin: size does not match the index")
    return dt, [np.frombuffer(binb, dt, l, p) for l, p in zip(lens, ptrs)]


def read_back(prefix):
    try:
        import warnings
        warnings.filterwarnings("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    except Exception:
        return read_published(prefix)
    ds = IndexedDataset(prefix)
    mine = read_published(prefix)
    seqs = [np.array(ds[i], copy=True) for i in range(len(ds))]  # copies: ds unmaps at exit
    dtype = ds.index.dtype
    del ds
    if len(seqs) != len(mine[1]) or any((a != b).any() for a, b in zip(seqs, mine[1])):
        fail(prefix + ": megatron.core and the published layout disagree")
    print("  read back with megatron.core IndexedDataset")
    return dtype, seqs


def kdprep(*args, status=0):
    r = subprocess.run(cmd + list(args), capture_output=True, text=True)
    if r.returncode != status:
        fail(f"kdprep {' '.join(args)}: exit {r.returncode}, expected {status}\n{r.stderr}")
    return r.stderr


# ---- plain text, paragraphs, two workers, EOD --------------------------------------------
text = "".join(open(os.path.join(src, "input/corpus/kjv-valid.txt")).readlines()[:400])
paras, cur = [], []
for line in text.splitlines(keepends=True):
    if line.strip():
        cur.append(line)
    elif cur:
        paras.append("".join(cur)), cur.clear()
if cur:
    paras.append("".join(cur))
open("plain.txt", "w").write(text)
err = kdprep("--input", "plain.txt", "--output-prefix", "plain", "--tokenizer", "tok",
             "--append-eod", "--workers", "2")
if "tokens/s" not in err or "[" not in err:
    fail("no progress bar / tokens/s line:\n" + err)
dt, seqs = read_back("plain")
if dt != np.uint16:
    fail(f"dtype {dt} for a 700-id vocabulary; expected uint16")
want = [enc(p) + [eos] for p in paras]
if len(seqs) != len(want) or any(list(s) != w for s, w in zip(seqs, want)):
    fail("plain text: ids differ from the tokenizer's")
if os.path.exists("plain_mask.idx"):
    fail("plain text wrote a mask")
print(f"ok: plain text, {len(seqs)} paragraphs, ids as the tokenizer gives them")

# ---- JSONL --json-key --------------------------------------------------------------------
units = [l for l in text.splitlines() if l.strip()]  # verses: material for records
docs = units[:50]
with open("docs.jsonl", "w") as f:
    for d in docs:
        f.write(json.dumps({"body": d, "id": 1}) + "\n")
kdprep("--input", "docs.jsonl", "--output-prefix", "docs", "--tokenizer", "tok",
       "--json-key", "body", "--no-progress")
_, seqs = read_back("docs")
if [list(s) for s in seqs] != [enc(d) for d in docs]:
    fail("JSONL: ids differ")
print("ok: JSONL --json-key")

# ---- prompt / response: the mask is 0 exactly on the prompt tokens ------------------------
pairs = [(units[i], units[i + 1]) for i in range(0, 40, 2)]
with open("pr.jsonl", "w") as f:
    for p, r in pairs:
        f.write(json.dumps({"q": p, "a": r}) + "\n")
kdprep("--input", "pr.jsonl", "--output-prefix", "pr", "--tokenizer", "tok", "--prompt-key", "q",
       "--response-key", "a", "--append-eod")
_, seqs = read_back("pr")
mdt, masks = read_back("pr_mask")
if mdt != np.uint8:
    fail("mask dtype is not uint8")
for (p, r), s, m in zip(pairs, seqs, masks):
    ids_p, ids_r = enc(p), enc(r)
    if list(s) != ids_p + ids_r + [eos]:
        fail("prompt/response ids differ")
    if list(m) != [0] * len(ids_p) + [1] * (len(ids_r) + 1):
        fail("prompt/response mask is not 0 on the prompt, 1 on response + eod")
print("ok: prompt/response mask")

# ---- chat: only the assistant turns (content + end of turn) count -------------------------
convs = []
for i in range(0, 60, 3):
    convs.append([{"role": "system", "content": "Answer in the style of the KJV."},
                  {"role": "user", "content": units[i].strip()},
                  {"role": "assistant", "content": units[i + 1].strip()},
                  {"role": "user", "content": "And then?"},
                  {"role": "assistant", "content": units[i + 2].strip()}])
with open("chat.jsonl", "w") as f:
    for c in convs:
        f.write(json.dumps({"messages": c}) + "\n")
kdprep("--input", "chat.jsonl", "--output-prefix", "chat", "--tokenizer", "tok", "--chat")
_, seqs = read_back("chat")
_, masks = read_back("chat_mask")
for c, s, m in zip(convs, seqs, masks):
    want_ids, want_mask = [], []
    for turn in c:  # rendered piece by piece: header masked, content + <|im_end|>\n counted
        head = enc(f"<|im_start|>{turn['role']}\n")
        body = enc(f"{turn['content']}<|im_end|>\n")
        want_ids += head + body
        want_mask += [0] * len(head) + [1 if turn["role"] == "assistant" else 0] * len(body)
    if list(s) != enc(tok.apply_chat_template(c, tokenize=False)):
        fail("chat ids differ from the rendered conversation's")
    if list(s) != want_ids:
        fail("chat: the test's piecewise tokenization disagrees (boundary merge)")
    if list(m) != want_mask:
        fail("chat mask is not exactly the assistant contents")
print("ok: chat mask")

# ---- the tokenizer of a kdtrain weights file ---------------------------------------------
import h5py
with h5py.File("weights.h5", "w") as f:
    g = f.create_group("tokenizer")
    for name in os.listdir("tok"):
        g.create_dataset(name, data=np.frombuffer(open(os.path.join("tok", name), "rb").read(),
                                                  np.uint8))
kdprep("--input", "pr.jsonl", "--output-prefix", "prw", "--weights", "weights.h5",
       "--prompt-key", "q", "--response-key", "a", "--append-eod", "--workers", "2")
for ext in ("", "_mask"):
    for e in (".bin", ".idx"):
        if open("pr" + ext + e, "rb").read() != open("prw" + ext + e, "rb").read():
            fail("--weights gave other bytes than --tokenizer for pr" + ext + e)
print("ok: tokenizer from a weights file")

# ---- bad input: exit 2 naming file and line ------------------------------------------------
open("bad.jsonl", "w").write('{"text": "a"}\n{"text": \n')
err = kdprep("--input", "bad.jsonl", "--output-prefix", "bad", "--tokenizer", "tok", status=2)
if "bad.jsonl:2" not in err:
    fail("bad JSON line not named: " + err)
err = kdprep("--input", "docs.jsonl", "--output-prefix", "bad", "--tokenizer", "tok", status=2)
if "docs.jsonl:1" not in err or "'text'" not in err:
    fail("missing key not named: " + err)
err = kdprep("--input", "pr.jsonl", "--output-prefix", "bad", "--weights", "plain.txt", status=2)
print("ok: bad input is exit 2 naming file and line")
