#!/usr/bin/env python3
"""kdprep: text, JSONL, prompt/response JSONL or chat JSONL -> a Megatron-LM indexed
dataset (PREFIX.bin + PREFIX.idx) with a model's Hugging Face tokenizer, plus a loss-mask
dataset (PREFIX_mask.bin + PREFIX_mask.idx, dtype uint8) for instruction and chat data,
where only the response (assistant) tokens count. Byte layout: doc/format.md, "Token data".

The tokenizer comes from a model directory (--tokenizer DIR, as Hugging Face saves it) or
from a kdtrain weights file (--weights FILE.h5: the files stored under /tokenizer). With a
teacher's tokenizer (--teacher-tokenizer / --teacher-weights, for a teacher with another
vocabulary) every document is tokenized by both, and the tokens' ends in the bytes of the
answer text (the offsets files) let a cross-tokenizer loss align the two tokenizations.
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


def tokenizer_dir(directory, weights, keep, opts=("--tokenizer", "--weights")):
    """A directory holding the tokenizer files: the directory given, or the /tokenizer group
    of a weights file written into a temporary directory (removed at exit)."""
    if directory:
        if not os.path.isdir(directory):
            fail(EXIT_INPUT, f"{directory}: not a directory ({opts[0]}); expected a model "
                 "directory with tokenizer.json / tokenizer_config.json")
        return directory
    try:
        import h5py
    except ImportError:
        fail(EXIT_INPUT, f"{opts[1]} needs the h5py package (`make tools-env` installs the "
             "tools' packages: README.md)")
    tmp = tempfile.mkdtemp(prefix="kdprep_tok_")
    keep.append(tmp)
    try:
        with h5py.File(weights, "r") as f:
            if "tokenizer" not in f:
                fail(EXIT_INPUT, f"{weights}: no /tokenizer group; expected the tokenizer "
                     "files kdconvert from-hf stores")
            for name, ds in f["tokenizer"].items():
                with open(os.path.join(tmp, name), "wb") as out:
                    out.write(bytes(ds[()].tobytes()))
    except OSError as e:
        fail(EXIT_INPUT, f"{weights}: cannot read as HDF5 ({e}); expected a kdtrain "
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


# ---- byte offsets of tokens (doc/format.md, "Token data": the answer coordinate) ------

def _byte_level_table():
    """The byte-level BPE alphabet (GPT-2's): the character that stands for each byte ->
    the byte. Printable Latin-1 bytes stand for themselves, the 68 others for 256, 257..."""
    own = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in own:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


BYTE_LEVEL = _byte_level_table()


def char_bytes(text):
    """The byte offset of every character boundary of text (len(text) + 1 of them)."""
    if text.isascii():
        return range(len(text) + 1)
    out, n = [0], 0
    for ch in text:
        c = ord(ch)
        n += 1 if c < 0x80 else 2 if c < 0x800 else 3 if c < 0x10000 else 4
        out.append(n)
    return out


def piece_widths(piece, byte_level):
    """What the offset rules read of a token's piece: byte-level, (its length in
    characters, its length in bytes decoded from the byte alphabet or -1 when a character
    is not in it, whether its first byte is a space); else the bytes it stands for, one for
    a byte-fallback token <0xNN>, its UTF-8 bytes otherwise ('\u2581' a space)."""
    if byte_level:
        code = [BYTE_LEVEL.get(ch) for ch in piece]
        if None in code:
            return len(piece), -1, False
        return len(piece), len(code), code[:1] == [0x20]
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return 1
    return len(piece.replace("\u2581", " ").encode("utf-8", "surrogatepass"))


def _runs(spans):
    """(i, j): the runs of two or more consecutive tokens i..j-1 that share one span."""
    k, n = 1, len(spans)
    while k < n:
        if spans[k] != spans[k - 1]:
            k += 1
            continue
        i = k - 1
        while k < n and spans[k] == spans[i]:
            k += 1
        yield i, k


def ends_byte_level(ids, spans, raw, info):
    """Byte ends of the tokens of a byte-level BPE tokenizer, by the rule of TRL's GOLD
    (trl/experimental/utils.py, encode_with_byte_offsets): spans are the tokens' byte spans
    from the tokenizer's character offsets, info[id] piece_widths' of each id. A run of
    tokens sharing one span (a character cut into byte pieces) is cut into consecutive
    spans when the pieces' lengths in characters fill it. Then, left to right with a cursor
    at the previous token's end: an empty span ends at the cursor; a token whose piece
    decodes to w bytes (the first one dropped when it is a space the text does not have
    there) and whose span overlaps a neighbour or is w wide takes [max(start, cursor), + w)
    when that stays inside its span. Where GOLD would refuse overlapping offsets, the end is
    kept at the cursor (monotone)."""
    spans = list(spans)
    for i, j in _runs(spans):
        a, b = spans[i]
        widths = [info[t][0] for t in ids[i:j]]
        if sum(widths) == b - a:
            for k, w in enumerate(widths, i):
                spans[k] = (a, a + w)
                a += w
    ends, cursor, n = [], 0, len(spans)
    for k, (a, b) in enumerate(spans):
        if a == b:
            ends.append(cursor)
            continue
        _, w, space = info[ids[k]]
        if w >= 0:
            if space and raw[a:a + 1] != b" ":
                w -= 1
            start = a if a > cursor else cursor
            if (a < cursor or w == b - a or (k + 1 < n and spans[k + 1][0] < b)) and \
                    start + w <= b:
                b = start + w
        cursor = b if b > cursor else cursor
        ends.append(cursor)
    return ends


def ends_by_chars(ids, spans, info):
    """Byte ends of the tokens of any other tokenizer (SentencePiece-style BPE with byte
    fallback: Llama 2, Mistral, Gemma): a token ends where its character span ends; in a
    run of tokens sharing one span (a character's byte-fallback tokens <0xNN>, a prepended
    '\u2581') the last ends at the span's end and each one before where the next begins,
    the next being info[id] bytes wide (piece_widths), at most the bytes left in the span.
    Ends are kept monotone."""
    ends = [b for _, b in spans]
    for i, j in _runs(spans):
        start = spans[i][0]
        for k in range(j - 2, i - 1, -1):
            ends[k] = max(start, ends[k + 1] - info[ids[k + 1]])
    for k in range(1, len(ends)):
        if ends[k] < ends[k - 1]:
            ends[k] = ends[k - 1]
    return ends


def answer_ends(ends, ranges):
    """A(b) of every token end b: the answer bytes (ranges of the encoded text's bytes,
    in order) before b."""
    out, r, before = [], 0, 0  # ranges[:r] end at or before b, holding `before` bytes
    for b in ends:
        while r < len(ranges) and ranges[r][1] <= b:
            before += ranges[r][1] - ranges[r][0]
            r += 1
        part = b - ranges[r][0] if r < len(ranges) and ranges[r][0] < b else 0
        out.append(before + part)
    return out


# ---- worker side: the tokenizers, one set per process ---------------------------------

class Side:
    """One tokenizer (the student's or the teacher's) and how it encodes documents."""

    def __init__(self, path, append_eod, name):
        self.tok = load_tokenizer(path)
        self.name = name
        self.eod = self.tok.eos_token_id if append_eod else None
        back = self.tok.backend_tokenizer
        # as GOLD tells byte-level BPE tokenizers apart
        self.byte_level = any("ByteLevel" in repr(x) for x in (back.pre_tokenizer,
                                                                back.decoder))
        self.info = None  # piece_widths of every id, made when first needed

    def _info(self):
        if self.info is None:
            back = self.tok.backend_tokenizer
            size = max(back.get_vocab(with_added_tokens=True).values()) + 1
            self.info = [piece_widths(back.id_to_token(i) or "", self.byte_level)
                         for i in range(size)]
        return self.info

    def encode(self, text):
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def encode_ends(self, text):
        """Ids and byte ends (doc/format.md: byte offsets of tokens) of text."""
        enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, chars = enc["input_ids"], enc["offset_mapping"]
        if text.isascii():
            spans = chars
        else:
            cb = char_bytes(text)
            spans = [(cb[a], cb[b]) for a, b in chars]
        if self.byte_level:
            raw = text.encode("utf-8", "surrogatepass")
            return ids, chars, ends_byte_level(ids, spans, raw, self._info())
        return ids, chars, ends_by_chars(ids, spans, self._info())

    def chat(self, messages, where, offsets):
        """Token ids of a rendered conversation and the mask of its assistant spans: the
        characters from where the generation prompt ends to the end of the assistant turn
        (its end-of-turn marker included) count. With offsets also the answer ends (-1
        where the mask is 0) and the answer's length in bytes."""
        render = lambda m, gen: self.tok.apply_chat_template(m, tokenize=False,
                                                             add_generation_prompt=gen)
        text = render(messages, False)
        spans, contents = [], []
        for i, m in enumerate(messages):
            if m.get("role") != "assistant":
                continue
            start, end = render(messages[:i], True), render(messages[:i + 1], False)
            if not text.startswith(end) or not end.startswith(start):
                raise ValueError(f"{where}: the chat template does not render conversations "
                                 "as prefixes of each other; cannot find the assistant turns")
            spans.append((len(start), len(end)))
            if offsets:
                contents.append(self._content_at(text, m.get("content"), spans[-1], where, i))
        if offsets:
            ids, chars, ends = self.encode_ends(text)
        else:
            enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
            ids, chars = enc["input_ids"], enc["offset_mapping"]
        mask = [1 if any(a <= s < b for a, b in spans) else 0 for s, _ in chars]
        if not offsets:
            return ids, mask, None, 0
        cb = char_bytes(text)
        ranges = [(cb[a], cb[b]) for a, b in contents]
        answer = answer_ends(ends, ranges)
        return ids, mask, [o if k else -1 for o, k in zip(answer, mask)], \
            sum(b - a for a, b in ranges)

    def _content_at(self, text, content, span, where, i):
        """The characters of the assistant content of message i inside its rendered turn
        (span): its first verbatim occurrence there, else exit 2."""
        content = "" if content is None else content
        if not isinstance(content, str):
            raise ValueError(f"{where}: the content of message {i} (assistant) is not a string; "
                             "the answer offsets of --teacher-tokenizer/--teacher-weights need "
                             "text")
        at = text.find(content, span[0], span[1])
        if at < 0:
            raise ValueError(f"{where}: the {self.name}'s chat template does not render the "
                             f"content of message {i} (assistant) verbatim; the answer offsets "
                             "of --teacher-tokenizer/--teacher-weights need each assistant "
                             "content as the messages give it")
        return at, at + len(content)

    def document(self, kind, where, rec, offsets):
        """(ids, mask or None, answer ends or None) of one document."""
        offs, size = None, 0
        if kind == "text":
            mask = None
            if offsets:
                ids, _, offs = self.encode_ends(rec)
                size = len(rec.encode("utf-8", "surrogatepass"))
            else:
                ids = self.encode(rec)
        elif kind == "pr":
            p = self.encode(rec[0])
            if offsets:
                r, _, ends = self.encode_ends(rec[1])
                offs = [-1] * len(p) + ends
                size = len(rec[1].encode("utf-8", "surrogatepass"))
            else:
                r = self.encode(rec[1])
            ids, mask = p + r, [0] * len(p) + [1] * len(r)
        else:
            ids, mask, offs, size = self.chat(rec, where, offsets)
        if self.eod is not None:
            ids = ids + [self.eod]
            if mask is not None:
                mask = mask + [1]
            if offs is not None:
                offs = offs + [size]
        return ids, mask, offs


_SIDES = []  # this process's tokenizers: the student's, then the teacher's when given


def _init(paths, append_eod):
    import warnings
    warnings.filterwarnings("ignore")
    _SIDES[:] = [Side(p, append_eod, name) for p, name in zip(paths, ("student", "teacher"))]


def _work(batch):
    """Per document, one (ids, mask, answer ends) per side; offsets only with a teacher."""
    offsets = len(_SIDES) > 1
    out = []
    for kind, where, rec in batch:
        try:
            out.append([s.document(kind, where, rec, offsets) for s in _SIDES])
        except ValueError as e:
            return ("error", str(e))
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
    ap = argparse.ArgumentParser(prog="kdprep", description=__doc__.split("\n\n")[0],
                                 epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", nargs="+", required=True, help="text or JSONL files")
    ap.add_argument("--output-prefix", required=True,
                    help="writes PREFIX.bin/.idx (and PREFIX_mask.bin/.idx)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--tokenizer", help="Hugging Face model (or tokenizer) directory (this "
                     "or --weights is required)")
    src.add_argument("--weights", help="kdtrain weights file with a /tokenizer group")
    teacher = ap.add_mutually_exclusive_group()
    teacher.add_argument("--teacher-tokenizer", metavar="DIR",
                         help="also tokenize with a teacher's tokenizer (another vocabulary): "
                         "writes PREFIX_teacher*, PREFIX_offsets and PREFIX_teacher_offsets")
    teacher.add_argument("--teacher-weights", metavar="FILE.h5",
                         help="the same with the /tokenizer group of a teacher's weights file")
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
    if not (args.tokenizer or args.weights):
        given = args.teacher_tokenizer or args.teacher_weights
        if given:
            opt = "--teacher-tokenizer" if args.teacher_tokenizer else "--teacher-weights"
            fail(EXIT_INPUT, f"{given}: {opt} needs the student's tokenizer as well "
                 "(--tokenizer DIR or --weights FILE.h5); the teacher's files go beside the "
                 "student's")
        ap.error("one of the arguments --tokenizer --weights is required")
    if args.workers < 1:
        fail(EXIT_INPUT, "--workers must be at least 1")
    keep = []
    try:
        return run(args, keep)
    finally:
        for d in keep:
            shutil.rmtree(d, ignore_errors=True)


EPILOG = """\
with --teacher-tokenizer DIR or --teacher-weights FILE.h5 (cross-tokenizer distillation),
every document is also tokenized by the teacher's tokenizer, and beside the student's files:
  PREFIX_teacher.bin/.idx          the teacher's ids (same documents, same order)
  PREFIX_teacher_mask.bin/.idx     the teacher's loss mask (when the student has one)
  PREFIX_offsets.bin/.idx          int32 per student token: its end in the answer's bytes,
                                   -1 where the mask is 0
  PREFIX_teacher_offsets.bin/.idx  int32 per teacher token: the same
The answer is the text the loss counts (the document; the response; the assistant
contents, which the chat templates must render verbatim): doc/format.md, "Token data"."""


def open_side(directory, weights, keep, args, opts, who):
    """The tokenizer directory and the tokenizer of one side, checked for the options."""
    path = tokenizer_dir(directory, weights, keep, opts)
    name = directory or weights
    try:
        tok = load_tokenizer(path)
    except Exception as e:  # transformers raises many kinds
        fail(EXIT_INPUT, f"{name}: cannot load a tokenizer ({e})")
    if args.append_eod and tok.eos_token_id is None:
        fail(EXIT_INPUT, f"--append-eod: the {who}tokenizer has no eos token" +
             (f" ({name})" if who else ""))
    if args.chat and not getattr(tok, "chat_template", None):
        fail(EXIT_INPUT, f"{name}: the {who}tokenizer has no chat template")
    return path, tok


SIDE_FILES = (("", "_offsets"), ("_teacher", "_teacher_offsets"))  # ids, offsets per side


def run(args, keep):
    paths = []
    path, tok = open_side(args.tokenizer, args.weights, keep, args,
                          ("--tokenizer", "--weights"), "")
    paths.append(path)
    teacher = bool(args.teacher_tokenizer or args.teacher_weights)
    if teacher:
        tpath, ttok = open_side(args.teacher_tokenizer, args.teacher_weights, keep, args,
                                ("--teacher-tokenizer", "--teacher-weights"), "teacher's ")
        paths.append(tpath)
    masked = bool(args.chat or args.prompt_key)
    dtype = optimal_dtype(len(tok))
    # (suffix, dtype) of the files, one writer each; a document adds one sequence to each
    files = [("", dtype)] + ([("_mask", "uint8")] if masked else [])
    if teacher:
        tdtype = optimal_dtype(len(ttok))
        files += [("_teacher", tdtype)] + ([("_teacher_mask", "uint8")] if masked else [])
        files += [("_offsets", "int32"), ("_teacher_offsets", "int32")]
    out_dir = os.path.dirname(os.path.abspath(args.output_prefix))
    if not os.path.isdir(out_dir):
        fail(EXIT_IO, f"{out_dir}: output directory does not exist")
    try:
        writers = {sfx: IndexedWriter(args.output_prefix + sfx, dt) for sfx, dt in files}
    except OSError as e:
        fail(EXIT_IO, f"{args.output_prefix}: cannot write ({e.strerror})")
    docs = toks = ttoks = 0
    t0 = last = time.time()
    total = 0
    for p in args.input:  # characters ~ bytes: the bar's denominator
        total += os.path.getsize(p) if os.path.isfile(p) else 0
    ctx = mp.get_context("spawn" if args.workers > 1 else "fork")
    pool = ctx.Pool(args.workers, _init, (paths, args.append_eod)) if args.workers > 1 else None
    if pool is None:
        _init(paths, args.append_eod)
    jobs = batches(records(args), 64)
    results = pool.imap(_work, jobs) if pool else map(_work, jobs)
    try:
        for status, out in results:
            if status == "error":
                fail(EXIT_INPUT, out)
            for sides in out:
                if not all(ids for ids, _, _ in sides):
                    continue  # no tokens (on either side): no document
                for (ids, mask, offs), (pre, off) in zip(sides, SIDE_FILES):
                    writers[pre].add(ids)
                    if masked:
                        writers[pre + "_mask"].add(mask)
                    if teacher:
                        writers[off].add(offs)
                docs += 1
                toks += len(sides[0][0])
                ttoks += len(sides[-1][0])
            if not args.no_progress and time.time() - last > 0.5:
                progress(docs, toks, t0, total)
                last = time.time()
    finally:
        if pool:
            pool.terminate()
    for wr in writers.values():
        wr.close()
    if not args.no_progress:
        progress(docs, toks, t0, total, done=True)
    dt = max(time.time() - t0, 1e-9)
    names = f"{args.output_prefix}.bin/.idx" + (
        f" and {args.output_prefix}_mask.bin/.idx" if masked else "")
    if teacher:
        names = ", ".join(f"{args.output_prefix}{sfx}.bin/.idx" for sfx, _ in files)
    print(f"kdprep: wrote {names}: {docs} documents, {toks} tokens ({dtype}) in {dt:.2f} s, "
          f"{toks / dt:,.0f} tokens/s" + (f"; teacher {ttoks} tokens ({tdtype})" if teacher
                                            else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
