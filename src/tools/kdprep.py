#!/usr/bin/env python3
"""kdprep: text, JSONL, prompt/response JSONL or chat JSONL -> a Megatron-LM indexed
dataset (PREFIX.bin + PREFIX.idx) with a model's Hugging Face tokenizer, plus a loss-mask
dataset (PREFIX_mask.bin + PREFIX_mask.idx, dtype uint8) for instruction and chat data,
where only the response (assistant) tokens count. Byte layout: doc/format.md, "Token data".

The tokenizer comes from a model directory (--tokenizer DIR, as Hugging Face saves it) or
from a kdtrain weights file (--weights FILE.h5: the files stored under /tokenizer).
Exit status: 0 done, 2 bad input (file and line named), 3 I/O failure.
"""
import argparse
import json
import multiprocessing as mp
import os
import shutil
import struct
import sys
import tempfile
import time

EXIT_INPUT, EXIT_IO = 2, 3
MAGIC = b"MMIDIDX\x00\x00"
DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6,
               "float32": 7, "uint16": 8}


def fail(status, msg):
    print("kdprep: " + msg, file=sys.stderr)
    sys.exit(status)


def optimal_dtype(cardinality):
    """Megatron's DType.optimal_dtype: uint16 below 65500 ids, else int32."""
    return "uint16" if cardinality is not None and cardinality < 65500 else "int32"


class IndexedWriter:
    """Writes PREFIX.bin as the documents come and PREFIX.idx at the end, byte for byte as
    megatron/core/datasets/indexed_dataset.py (one sequence per document)."""

    def __init__(self, prefix, dtype):
        import numpy as np
        self.np, self.prefix, self.dtype = np, prefix, dtype
        self.lengths = []
        self.bin = open(prefix + ".bin", "wb")

    def add(self, ids):
        self.bin.write(self.np.asarray(ids, dtype=self.dtype).tobytes(order="C"))
        self.lengths.append(len(ids))

    def close(self):
        np = self.np
        self.bin.close()
        size = np.dtype(self.dtype).itemsize
        lengths = np.array(self.lengths, dtype=np.int32)
        pointers = np.zeros(len(lengths), dtype=np.int64)
        if len(lengths) > 1:
            pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64)) * size
        docs = np.arange(len(lengths) + 1, dtype=np.int64)
        with open(self.prefix + ".idx", "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<Q", 1))
            f.write(struct.pack("<B", DTYPE_CODES[self.dtype]))
            f.write(struct.pack("<Q", len(lengths)))
            f.write(struct.pack("<Q", len(docs)))
            f.write(lengths.tobytes(order="C"))
            f.write(pointers.tobytes(order="C"))
            f.write(docs.tobytes(order="C"))


def tokenizer_dir(args, keep):
    """A directory holding the tokenizer files: --tokenizer, or the /tokenizer group of a
    weights file written into a temporary directory (removed at exit)."""
    if args.tokenizer:
        if not os.path.isdir(args.tokenizer):
            fail(EXIT_INPUT, f"{args.tokenizer}: not a directory; expected a model directory "
                 "with tokenizer.json / tokenizer_config.json")
        return args.tokenizer
    try:
        import h5py
    except ImportError:
        fail(EXIT_INPUT, "--weights needs the h5py package (`make tools-env` installs the "
             "tools' packages: README.md)")
    tmp = tempfile.mkdtemp(prefix="kdprep_tok_")
    keep.append(tmp)
    try:
        with h5py.File(args.weights, "r") as f:
            if "tokenizer" not in f:
                fail(EXIT_INPUT, f"{args.weights}: no /tokenizer group; expected the tokenizer "
                     "files kdconvert from-hf stores")
            for name, ds in f["tokenizer"].items():
                with open(os.path.join(tmp, name), "wb") as out:
                    out.write(bytes(ds[()].tobytes()))
    except OSError as e:
        fail(EXIT_INPUT, f"{args.weights}: cannot read as HDF5 ({e}); expected a kdtrain "
             "weights file")
    return tmp


def load_tokenizer(path):
    # the tokenizer alone: no notice that PyTorch is not installed (tools-env has none)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        fail(EXIT_INPUT, f"kdprep needs transformers ({e}); `make tools-env` installs the "
             "tools' packages (README.md)")
    return AutoTokenizer.from_pretrained(path)


# ---- worker side: one tokenizer per process -------------------------------------------

_TOK = None
_EOD = None


def _init(path, append_eod):
    global _TOK, _EOD
    import warnings
    warnings.filterwarnings("ignore")
    _TOK = load_tokenizer(path)
    _EOD = _TOK.eos_token_id if append_eod else None


def _encode(text):
    return _TOK(text, add_special_tokens=False)["input_ids"]


def _chat(messages, where):
    """Token ids of a rendered conversation and the mask of its assistant spans: the
    characters from where the generation prompt ends to the end of the assistant turn
    (its end-of-turn marker included) count."""
    render = lambda m, gen: _TOK.apply_chat_template(m, tokenize=False, add_generation_prompt=gen)
    text = render(messages, False)
    spans = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        start, end = render(messages[:i], True), render(messages[:i + 1], False)
        if not text.startswith(end) or not end.startswith(start):
            raise ValueError(f"{where}: the chat template does not render conversations as "
                             "prefixes of each other; cannot find the assistant turns")
        spans.append((len(start), len(end)))
    enc = _TOK(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = enc["input_ids"]
    mask = [1 if any(a <= s < b for a, b in spans) else 0 for s, _ in enc["offset_mapping"]]
    return ids, mask


def _work(batch):
    out = []
    for kind, where, rec in batch:
        try:
            if kind == "text":
                ids, mask = _encode(rec), None
            elif kind == "pr":
                p, r = _encode(rec[0]), _encode(rec[1])
                ids, mask = p + r, [0] * len(p) + [1] * len(r)
            else:
                ids, mask = _chat(rec, where)
        except ValueError as e:
            return ("error", str(e))
        if _EOD is not None:
            ids = ids + [_EOD]
            if mask is not None:
                mask = mask + [1]
        out.append((ids, mask))
    return ("ok", out)


# ---- reading the inputs ---------------------------------------------------------------

def records(args):
    """(kind, 'file:line', record) for every document of every input."""
    for path in args.input:
        try:
            f = open(path, encoding="utf-8")
        except OSError as e:
            fail(EXIT_INPUT, f"{path}: cannot open ({e.strerror})")
        with f:
            jsonl = args.input_format == "jsonl" or (
                args.input_format == "auto" and path.endswith((".jsonl", ".json")))
            if not jsonl:
                if args.chat or args.prompt_key:
                    fail(EXIT_INPUT, f"{path}: prompt/response and chat data must be JSONL")
                yield from text_docs(path, f, args.doc_per)
                continue
            for n, line in enumerate(f, 1):
                READ[0] += len(line)
                if not line.strip():
                    continue
                where = f"{path}:{n}"
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    fail(EXIT_INPUT, f"{where}: not valid JSON ({e.msg}); expected one JSON "
                         "object per line")
                yield record(args, obj, where)


def need(obj, key, where, what):
    if not isinstance(obj, dict) or key not in obj:
        fail(EXIT_INPUT, f"{where}: no key '{key}'; expected {what}")
    return obj[key]


def record(args, obj, where):
    if args.chat:
        msgs = need(obj, args.messages_key, where, "a list of {role, content} messages")
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m for m in msgs):
            fail(EXIT_INPUT, f"{where}: '{args.messages_key}' is not a list of "
                 "{role, content} messages")
        return ("chat", where, msgs)
    if args.prompt_key:
        p = need(obj, args.prompt_key, where, "the prompt text")
        r = need(obj, args.response_key, where, "the response text")
        return ("pr", where, (str(p), str(r)))
    return ("text", where, str(need(obj, args.json_key, where, "the document text")))


def text_docs(path, f, per):
    if per == "file":
        text = f.read()
        READ[0] += len(text)
        yield ("text", path, text)
        return
    buf, start = [], 1
    for n, line in enumerate(f, 1):
        READ[0] += len(line)
        if per == "line":
            if line.strip():
                yield ("text", f"{path}:{n}", line)
        elif line.strip():
            if not buf:
                start = n
            buf.append(line)
        elif buf:
            yield ("text", f"{path}:{start}", "".join(buf))
            buf = []
    if buf:
        yield ("text", f"{path}:{start}", "".join(buf))


def batches(it, size):
    b = []
    for r in it:
        b.append(r)
        if len(b) == size:
            yield b
            b = []
    if b:
        yield b


READ = [0]  # characters of input read so far (the progress bar's numerator)


def progress(docs, toks, t0, total, done=False):
    """One redrawn stderr line: a bar over the input characters read, documents, tokens."""
    frac = 1.0 if done or total == 0 else min(READ[0] / total, 1.0)
    bar = "#" * int(30 * frac) + "." * (30 - int(30 * frac))
    rate = toks / max(time.time() - t0, 1e-9)
    print(f"\rkdprep [{bar}] {100 * frac:5.1f}% {docs} documents, {toks} tokens, "
          f"{rate:,.0f} tokens/s", end="\n" if done else "", file=sys.stderr, flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="kdprep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", nargs="+", required=True, help="text or JSONL files")
    ap.add_argument("--output-prefix", required=True,
                    help="writes PREFIX.bin/.idx (and PREFIX_mask.bin/.idx)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokenizer", help="Hugging Face model (or tokenizer) directory")
    src.add_argument("--weights", help="kdtrain weights file with a /tokenizer group")
    ap.add_argument("--input-format", choices=["auto", "text", "jsonl"], default="auto",
                    help="auto: .jsonl/.json files are JSONL, others plain text")
    ap.add_argument("--doc-per", choices=["paragraph", "line", "file"], default="paragraph",
                    help="plain text: one document per blank-line separated paragraph, line "
                    "or file")
    ap.add_argument("--json-key", default="text", help="JSONL key of the document text")
    ap.add_argument("--prompt-key", help="prompt/response JSONL: key of the prompt (masked)")
    ap.add_argument("--response-key", default="response",
                    help="prompt/response JSONL: key of the response (counted)")
    ap.add_argument("--chat", action="store_true",
                    help="chat JSONL: messages rendered by the tokenizer's chat template; "
                    "only assistant turns count")
    ap.add_argument("--messages-key", default="messages", help="chat JSONL: key of messages")
    ap.add_argument("--append-eod", action="store_true",
                    help="end every document with the tokenizer's eos token")
    ap.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    ap.add_argument("--no-progress", action="store_true", help="no progress line")
    args = ap.parse_args(argv)
    if args.workers < 1:
        fail(EXIT_INPUT, "--workers must be at least 1")
    keep = []
    try:
        return run(args, keep)
    finally:
        for d in keep:
            shutil.rmtree(d, ignore_errors=True)


def run(args, keep):
    path = tokenizer_dir(args, keep)
    try:
        tok = load_tokenizer(path)
    except Exception as e:  # transformers raises many kinds
        fail(EXIT_INPUT, f"{args.tokenizer or args.weights}: cannot load a tokenizer ({e})")
    if args.append_eod and tok.eos_token_id is None:
        fail(EXIT_INPUT, "--append-eod: the tokenizer has no eos token")
    if args.chat and not getattr(tok, "chat_template", None):
        fail(EXIT_INPUT, f"{args.tokenizer or args.weights}: the tokenizer has no chat template")
    masked = bool(args.chat or args.prompt_key)
    dtype = optimal_dtype(len(tok))
    out_dir = os.path.dirname(os.path.abspath(args.output_prefix))
    if not os.path.isdir(out_dir):
        fail(EXIT_IO, f"{out_dir}: output directory does not exist")
    try:
        w = IndexedWriter(args.output_prefix, dtype)
        wm = IndexedWriter(args.output_prefix + "_mask", "uint8") if masked else None
    except OSError as e:
        fail(EXIT_IO, f"{args.output_prefix}: cannot write ({e.strerror})")
    docs = toks = 0
    t0 = last = time.time()
    total = 0
    for p in args.input:  # characters ~ bytes: the bar's denominator
        total += os.path.getsize(p) if os.path.isfile(p) else 0
    ctx = mp.get_context("spawn" if args.workers > 1 else "fork")
    pool = ctx.Pool(args.workers, _init, (path, args.append_eod)) if args.workers > 1 else None
    if pool is None:
        _init(path, args.append_eod)
    jobs = batches(records(args), 64)
    results = pool.imap(_work, jobs) if pool else map(_work, jobs)
    try:
        for status, out in results:
            if status == "error":
                fail(EXIT_INPUT, out)
            for ids, mask in out:
                if not ids:
                    continue
                w.add(ids)
                if wm is not None:
                    wm.add(mask)
                docs += 1
                toks += len(ids)
            if not args.no_progress and time.time() - last > 0.5:
                progress(docs, toks, t0, total)
                last = time.time()
    finally:
        if pool:
            pool.terminate()
    w.close()
    if wm is not None:
        wm.close()
    if not args.no_progress:
        progress(docs, toks, t0, total, done=True)
    dt = max(time.time() - t0, 1e-9)
    names = f"{args.output_prefix}.bin/.idx" + (
        f" and {args.output_prefix}_mask.bin/.idx" if masked else "")
    print(f"kdprep: wrote {names}: {docs} documents, {toks} tokens ({dtype}) in {dt:.2f} s, "
          f"{toks / dt:,.0f} tokens/s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
