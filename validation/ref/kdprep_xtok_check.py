"""kdprep_xtok_check.py WORKDIR KDPREP_CMD...: the checks behind test_kdprep_xtok.sh.

kdprep --teacher-tokenizer / --teacher-weights (cross-tokenizer data, doc/format.md "Token
data"). Test tokenizers trained here by Hugging Face `tokenizers` (tokenizer_ref.py's kinds:
Qwen2-style and Llama-3-style byte-level BPE, Gemma-style and Mistral-style SentencePiece BPE
with byte fallback), saved as model directories with their own chat templates (ChatML, a
Llama-3-like and a Gemma-like one), and a GPT-2-style one (offsets trimmed of spaces). On
multilingual conversations of many lengths, prompt/response JSONL, plain text and hostile
strings (tokenizer_ref's adversarial and random ones), every stream is read back with
megatron.core's IndexedDataset and checked against each tokenizer's own encoding:
  - ids: each tokenizer's ids of the text it renders, the same documents on both sides;
  - masks: 1 exactly on the tokens starting in an assistant turn (the response);
  - offsets: -1 exactly where the mask is 0; for byte-level tokenizers the counted tokens'
    ends are those of TRL's encode_with_byte_offsets (GOLD) on each answer text alone,
    shifted by the answer bytes before it, and template markers and the eod sit at the
    cursor; for SentencePiece ones the ends are the tokens' pieces decoded to bytes
    (<0xNN> one byte, '\u2581' a space, a prepended dummy space dropped), summed;
  - every document's last counted token ends at the answer's length in bytes (hostile
    strings: at most there); where TRL refuses a text's offsets (Qwen2's NFC on decomposed
    characters), kdprep's still rise monotonically;
  - --teacher-weights FILE.h5 gives the same files as --teacher-tokenizer DIR; the student's
    files are those of a run without a teacher;
  - refusals exit 2 naming the file: a template that does not render the content verbatim,
    a teacher without a student tokenizer, a teacher directory that does not exist.
"""
import json
import os
import random
import subprocess
import sys
import warnings

import numpy as np

work, cmd = sys.argv[1], sys.argv[2:]
src = os.environ["KD_SRCDIR"]
sys.path.insert(0, os.path.join(src, "validation", "ref"))
os.chdir(work)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

import tokenizer_ref  # noqa: E402  (the test tokenizers' kinds)
from megatron.core.datasets.indexed_dataset import IndexedDataset  # noqa: E402
from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402
from trl.experimental.utils import encode_with_byte_offsets  # noqa: E402


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


# ---- tokenizers with chat templates ------------------------------------------------------
# each: (kind, eos, template, [(head, tail)] of a turn by role), the turn rendered as
# head + content + tail, the conversation as BOS + turns (+ the assistant head to generate)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3 = ("<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
          "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
          "{% endif %}")
GEMMA = ("<bos>{% for m in messages %}<start_of_turn>"
         "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}"
         "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
         "{% endif %}")
SIDES = {
    "qwen2": ("<|endoftext|>", CHATML, "", lambda r: (f"<|im_start|>{r}\n", "<|im_end|>\n")),
    "llama3": ("<|end_of_text|>", LLAMA3, "<|begin_of_text|>",
               lambda r: (f"<|start_header_id|>{r}<|end_header_id|>\n\n", "<|eot_id|>")),
    "gemma": ("<eos>", GEMMA, "<bos>",
              lambda r: ("<start_of_turn>%s\n" % ("model" if r == "assistant" else r),
                         "<end_of_turn>\n")),
    "mistral": ("</s>", None, "", None),
    "gpt2": ("<|endoftext|>", None, "", None),
}
lines = tokenizer_ref.CORPUS.split("\n")
TOK = {}
for kind, (eos, template, _, _) in SIDES.items():
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer_ref.build(kind, lines),
                                   eos_token=eos)
    if template:
        fast.chat_template = template
    fast.save_pretrained(kind)
    TOK[kind] = AutoTokenizer.from_pretrained(kind)
BYTE_LEVEL = {"qwen2", "llama3", "gpt2"}


def ids_of(kind, text):
    return TOK[kind](text, add_special_tokens=False)["input_ids"]


# ---- data like users' data ----------------------------------------------------------------
rng = random.Random(39)
# the decomposed characters' line apart: Qwen2's NFC makes offsets TRL refuses (below)
DECOMPOSED = next(l for l in lines if l.startswith("Decomposed"))
pool = [l.strip() for l in lines + tokenizer_ref.kjv_lines(60) if l.strip() and l != DECOMPOSED]


def passage(lo, hi):
    """Some lines of the multilingual corpus and KJV verses, joined by spaces or newlines."""
    out = rng.choice(pool)
    for _ in range(rng.randint(lo, hi) - 1):
        out += rng.choice([" ", "\n", "\n\n"]) + rng.choice(pool)
    return out


convs = []
for n in range(40):
    msgs = [{"role": "system", "content": passage(1, 2)}] if n % 3 == 0 else []
    for t in range(rng.randint(1, 5)):
        msgs.append({"role": "user", "content": passage(1, 3)})
        msgs.append({"role": "assistant", "content": passage(1, 1 + 12 * (n % 4 == 1))})
    convs.append(msgs)
convs[1][-1]["content"] = ""  # an empty answer
convs[2].append({"role": "user", "content": "¿Y después? 続きは？ 🙂"})  # ends with a user turn
convs[4] = [{"role": "user", "content": "no answer here: 中文 😀"}]  # nothing counts
with open("chat.jsonl", "w") as f:
    for c in convs:
        f.write(json.dumps({"messages": c}, ensure_ascii=(len(c) % 2 == 0)) + "\n")
pairs = [(passage(1, 3), passage(1, 6)) for _ in range(30)]
with open("pr.jsonl", "w") as f:
    for p, r in pairs:
        f.write(json.dumps({"q": p, "a": r}, ensure_ascii=False) + "\n")
texts = [passage(1, 8).replace("\n\n", "\n") + "\n" for _ in range(30)]
with open("plain.txt", "w", encoding="utf-8") as f:
    f.write("\n".join(texts))  # paragraphs: the texts, each ending in one newline


# ---- reading back -------------------------------------------------------------------------
def read_back(prefix, dtype=None):
    ds = IndexedDataset(prefix)
    seqs = [np.array(ds[i], copy=True) for i in range(len(ds))]  # copies: ds unmaps at exit
    got = ds.index.dtype
    del ds
    if dtype is not None and got != dtype:
        fail(f"{prefix}: dtype {got}, expected {np.dtype(dtype)}")
    return [s.tolist() for s in seqs]


def kdprep(*args, status=0):
    r = subprocess.run(cmd + list(args), capture_output=True, text=True)
    if r.returncode != status:
        fail(f"kdprep {' '.join(args)}: exit {r.returncode}, expected {status}\n{r.stderr}")
    return r.stderr


# ---- what each side should hold -----------------------------------------------------------
def nbytes(s):
    return len(s.encode("utf-8"))


def piece_ends(kind, text, ids):
    """SentencePiece-style: the tokens' ends in text's bytes from their pieces decoded to
    bytes (<0xNN> one byte, '\u2581' a space), one prepended dummy space dropped."""
    total, ends = 0, []
    for p in TOK[kind].convert_ids_to_tokens(ids):
        is_byte = len(p) == 6 and p.startswith("<0x") and p.endswith(">")
        total += 1 if is_byte else nbytes(p.replace("\u2581", " "))
        ends.append(total)
    extra = total - nbytes(text)
    if extra not in (0, 1):
        fail(f"{kind}: the pieces of {text[:40]!r} decode to {total} bytes, not {nbytes(text)}")
    return [max(e - extra, 0) for e in ends]


def answer_ends(kind, text):
    """Ids and ends of the tokens of an answer text encoded alone (base 0)."""
    if kind in BYTE_LEVEL:
        ((ids, spans),) = encode_with_byte_offsets(TOK[kind].backend_tokenizer, [text])
        return ids, [b for _, b in spans]
    ids = ids_of(kind, text)
    return ids, piece_ends(kind, text, ids)


def expect_chat(kind, msgs):
    """(ids, mask, offsets, answer bytes) of a conversation on one side, built turn by turn:
    the head masked, the content counted at the answer's ends shifted by the bytes before,
    the tail (end of turn) counted at the cursor."""
    _, _, bos, turn = SIDES[kind]
    rendered = TOK[kind].apply_chat_template(msgs, tokenize=False)
    pieces = [(bos, 0)]
    for m in msgs:
        head, tail = turn(m["role"])
        pieces += [(head, 0), (m["content"], 1 if m["role"] == "assistant" else 0),
                   (tail, 2 if m["role"] == "assistant" else 0)]
    if "".join(p for p, _ in pieces) != rendered:
        fail(f"{kind}: the test's turns differ from the template's rendering")
    ids = ids_of(kind, rendered)
    if kind in BYTE_LEVEL:  # content tokens as TRL encodes the content alone
        want_ids, mask, offs, cursor = [], [], [], 0
        for text, what in pieces:
            if what == 1:
                got, ends = answer_ends(kind, text)
                offs += [cursor + e for e in ends]
                cursor += nbytes(text)
            else:
                got = ids_of(kind, text)
                offs += [cursor if what == 2 else -1] * len(got)
            want_ids += got
            mask += [1 if what else 0] * len(got)
        if want_ids != ids:
            fail(f"{kind}: the test's turn-by-turn tokenization differs (a merge across a turn)")
        return ids, mask, offs, cursor
    # SentencePiece-style: the ends of the whole rendering from its pieces, mapped to the
    # answer: a token ending inside or after a content counts the answer bytes before its end
    ends = piece_ends(kind, rendered, ids)
    spans, at, counted = [], 0, []  # byte spans of the contents; of the counted turn parts
    for text, what in pieces:
        if what == 1:
            spans.append((at, at + nbytes(text)))
        if what:
            counted.append((at, at + nbytes(text)))
        at += nbytes(text)
    starts = [0] + ends[:-1]
    mask = [1 if any(a <= s < b for a, b in counted) else 0 for s in starts]
    offs = [sum(min(max(e - a, 0), b - a) for a, b in spans) if k else -1
            for e, k in zip(ends, mask)]
    return ids, mask, offs, sum(b - a for a, b in spans)


def check(prefix, side, docs, expect, eod, whole=True):
    """The ids, mask and offsets files of one side against expect(kind, doc); whole: every
    document's last counted token must end at the answer's length. Where TRL refuses a
    text's offsets (expect gives None), they must rise monotonically to the answer's length
    (a tokenizer's offsets may leave the last bytes uncovered: then to no more). Returns the
    tokens and the documents TRL refused."""
    kind, pre = side
    ids = read_back(prefix + pre, np.uint16)
    masks = read_back(prefix + pre + "_mask", np.uint8) if os.path.exists(
        prefix + pre + "_mask.idx") else None
    offs = read_back(prefix + ("_teacher_offsets" if pre else "_offsets"), np.int32)
    if len(ids) != len(docs) or len(offs) != len(docs):
        fail(f"{prefix}{pre}: {len(ids)} documents, {len(offs)} offsets, expected {len(docs)}")
    eos, refused = TOK[kind].eos_token_id, 0
    for n, d in enumerate(docs):
        w_ids, w_mask, w_offs, size = expect(kind, d)
        if eod:
            w_ids = w_ids + [eos]
            w_mask = None if w_mask is None else w_mask + [1]
            w_offs = None if w_offs is None else w_offs + [size]
        where = f"{prefix}{pre} document {n}"
        if ids[n] != w_ids:
            fail(f"{where}: ids differ from the {kind} tokenizer's")
        if masks is not None and masks[n] != w_mask:
            fail(f"{where}: the mask is not exactly the response")
        counted = [o for o in offs[n] if o >= 0]
        if any(b < a for a, b in zip(counted, counted[1:])):
            fail(f"{where}: offsets not monotone")
        if w_offs is None:
            refused += 1
            if len(counted) != len(offs[n]) or (counted and counted[-1] > size):
                fail(f"{where}: offsets -1 or past the answer's length {size}: {offs[n]}")
        elif offs[n] != w_offs:
            bad = next(i for i, (a, b) in enumerate(zip(offs[n], w_offs)) if a != b)
            fail(f"{where}: offsets differ at token {bad}: {offs[n][bad - 2:bad + 3]}, "
                 f"expected {w_offs[bad - 2:bad + 3]}")
        if whole and counted and counted[-1] != size:
            fail(f"{where}: the last counted token ends at {counted[-1]}, not at the answer's "
                 f"length {size}")
    return sum(map(len, ids)), refused


def both(prefix, student, teacher, docs, expect, eod=False, whole=True):
    (n, r), (m, q) = (check(prefix, (kind, pre), docs, expect, eod, whole)
                      for kind, pre in ((student, ""), (teacher, "_teacher")))
    print(f"ok: {prefix}: {len(docs)} documents, {student} {n} tokens, {teacher} {m} tokens" +
          (f" (TRL refuses {r} and {q} documents' offsets)" if r + q else ""))


def expect_pr(kind, pr):
    p = ids_of(kind, pr[0])
    r, ends = answer_ends(kind, pr[1])
    return p + r, [0] * len(p) + [1] * len(r), [-1] * len(p) + ends, nbytes(pr[1])


def expect_text(kind, text):
    try:
        ids, ends = answer_ends(kind, text)
    except ValueError:  # TRL refuses overlapping offsets it cannot normalize
        return ids_of(kind, text), None, None, nbytes(text)
    if ids != ids_of(kind, text):
        fail(f"{kind}: TRL's ids differ from the tokenizer's")
    return ids, None, ends, nbytes(text)


# ---- chat: byte-level student and teacher (ChatML, Llama-3), two workers --------------------
kdprep("--input", "chat.jsonl", "--chat", "--output-prefix", "c1", "--tokenizer", "qwen2",
       "--teacher-tokenizer", "llama3", "--workers", "2")
both("c1", "qwen2", "llama3", convs, expect_chat)
kdprep("--input", "chat.jsonl", "--chat", "--output-prefix", "c0", "--tokenizer", "qwen2",
       "--no-progress")
for ext in ("", "_mask"):
    for e in (".bin", ".idx"):
        if open("c0" + ext + e, "rb").read() != open("c1" + ext + e, "rb").read():
            fail(f"the student's c1{ext}{e} differs from a run without a teacher")
print("ok: the student's files are those of a run without a teacher")

# ---- chat: byte-level student, SentencePiece-style teacher (Gemma-like template), eod -------
kdprep("--input", "chat.jsonl", "--chat", "--output-prefix", "c2", "--tokenizer", "llama3",
       "--teacher-tokenizer", "gemma", "--append-eod", "--no-progress")
both("c2", "llama3", "gemma", convs, expect_chat, eod=True)

# ---- prompt/response and plain text: Mistral-style teacher (Metaspace, dummy prefix) -------
kdprep("--input", "pr.jsonl", "--prompt-key", "q", "--response-key", "a", "--output-prefix",
       "pr", "--tokenizer", "qwen2", "--teacher-tokenizer", "mistral", "--append-eod")
both("pr", "qwen2", "mistral", pairs, expect_pr, eod=True)
kdprep("--input", "plain.txt", "--output-prefix", "tx", "--tokenizer", "mistral",
       "--teacher-tokenizer", "llama3", "--append-eod")
both("tx", "mistral", "llama3", texts, expect_text, eod=True)
for f in ("pr_teacher_mask.idx", "tx_mask.idx", "tx_teacher_mask.idx"):
    if os.path.exists(f) != (f == "pr_teacher_mask.idx"):
        fail(f"{f}: a mask file where the student has none, or none where it has one")

# ---- hostile strings (tokenizer_ref's adversarial and random ones, the decomposed
# characters' line: Qwen2's NFC gives offsets TRL refuses) as JSONL documents; GPT-2's
# trim_offsets leaves trailing spaces out of every token, so ends may stop short there ---------
hostile = [t for t in tokenizer_ref.ADVERSARIAL + tokenizer_ref.rand_strings(rng, 150) +
           [DECOMPOSED, DECOMPOSED + " " + DECOMPOSED] if t]
with open("hostile.jsonl", "w") as f:
    for t in hostile:
        f.write(json.dumps({"text": t}) + "\n")
kdprep("--input", "hostile.jsonl", "--output-prefix", "hs", "--tokenizer", "gpt2",
       "--teacher-tokenizer", "qwen2", "--no-progress")
both("hs", "gpt2", "qwen2", hostile, expect_text, whole=False)

# ---- the teacher's tokenizer from a kdtrain weights file ------------------------------------
import h5py  # noqa: E402
with h5py.File("gemma.h5", "w") as f:
    g = f.create_group("tokenizer")
    for name in os.listdir("gemma"):
        with open(os.path.join("gemma", name), "rb") as fh:
            g.create_dataset(name, data=np.frombuffer(fh.read(), np.uint8))
kdprep("--input", "chat.jsonl", "--chat", "--output-prefix", "c3", "--tokenizer", "llama3",
       "--teacher-weights", "gemma.h5", "--append-eod", "--no-progress")
for ext in ("", "_mask", "_teacher", "_teacher_mask", "_offsets", "_teacher_offsets"):
    for e in (".bin", ".idx"):
        if open("c2" + ext + e, "rb").read() != open("c3" + ext + e, "rb").read():
            fail("--teacher-weights gave other bytes than --teacher-tokenizer for c3" + ext + e)
print("ok: --teacher-weights FILE.h5 gives the files of --teacher-tokenizer DIR")

# ---- refusals: exit 2 naming the file --------------------------------------------------------
trim = PreTrainedTokenizerFast.from_pretrained("llama3")
trim.chat_template = LLAMA3.replace("{{ m['content'] }}", "{{ m['content'] | trim }}")
trim.save_pretrained("llama3_trim")
with open("pad.jsonl", "w") as f:
    f.write(json.dumps({"messages": convs[0]}) + "\n")
    f.write(json.dumps({"messages": [{"role": "user", "content": "Hi"},
                                     {"role": "assistant", "content": " Hello! \n"}]}) + "\n")
err = kdprep("--input", "pad.jsonl", "--chat", "--output-prefix", "bad", "--tokenizer", "qwen2",
             "--teacher-tokenizer", "llama3_trim", status=2)
if "pad.jsonl:2" not in err or "verbatim" not in err:
    fail("a template that trims the content: not refused naming pad.jsonl:2\n" + err)
err = kdprep("--input", "pr.jsonl", "--prompt-key", "q", "--response-key", "a",
             "--output-prefix", "bad", "--teacher-tokenizer", "llama3", status=2)
if "llama3" not in err or "--tokenizer" not in err:
    fail("--teacher-tokenizer without a student tokenizer: not refused naming it\n" + err)
err = kdprep("--input", "pr.jsonl", "--prompt-key", "q", "--response-key", "a",
             "--output-prefix", "bad", "--tokenizer", "qwen2", "--teacher-tokenizer",
             "no_such_dir", status=2)
if "no_such_dir" not in err:
    fail("a teacher directory that does not exist: not named\n" + err)
print("ok: refusals exit 2 naming the file")
