#!/usr/bin/env python3
"""kdgen: sample text from a kdtrain weights file (or checkpoint) with the tokenizer the
file carries (its /tokenizer group, as kdconvert from-hf stores it), or the one
--tokenizer names.

    kdgen WEIGHTS.h5 [--prompt TEXT]... [--prompts FILE] [--max-new-tokens N]
          [--temperature T] [--top-k K] [--top-p P] [--seed S] [--jsonl OUT]
          [--tokenizer DIR|FILE.h5]
          [--tp N] [--pp N] [--dp N] [--device auto|cpu|cuda] [--precision fp32|bf16]

--tokenizer DIR takes a Hugging Face tokenizer directory (tokenizer.json,
tokenizer_config.json, ... as save_pretrained writes them), --tokenizer FILE.h5 the
/tokenizer group of another kdtrain weights file, e.g. the teacher's for a student trained
from student%init = 'random', whose final.h5 carries none. The tokenizer must not hold ids
beyond the model's vocab_size.

Prompts come from the command line, or from FILE: one prompt per line, or JSONL (the first
non-blank line starts with '{') whose objects hold a "prompt" string or a "messages" chat
(kdprep --chat input: the turns before the first assistant turn, rendered by the
tokenizer's chat template with the generation prompt), or FILE is the PREFIX of a kdprep
dataset with a loss mask (--chat or --prompt-key output: PREFIX_mask.idx exists): each
document's tokens before its first counted token. Writes each prompt followed by its
continuation (blank lines between), or with --jsonl one object per prompt with "prompt",
"text" and the generated token ids "ids". Generation stops at the tokenizer's end-of-
sequence id or after --max-new-tokens.

How it runs: plain-text prompts (--prompt, a text --prompts file, JSONL "prompt" objects;
each one non-blank line) with the weights file's own tokenizer go straight to the C engine
kdgen-ids beside it (this front end becomes it: exec), which encodes them with the C
tokenizer (src/tokenizer.h), generates (src/generate.c) and on rank 0 writes the text
itself: no Python tokenization, transformers not needed. Otherwise (chats, whose templates
need jinja; kdprep datasets; --tokenizer; a prompt with a line break; a tokenizer the C
tokenizer refuses or that transformers 5 reads otherwise than its tokenizer.json, which the
engine finds before MPI starts and hands back to this front end; transformers older than 5
installed; KDGEN_PYTHON_TOKENIZER=1 in the environment) this front end tokenises the prompts
with transformers into a temporary ids file, then becomes the engine, which generates and,
on rank 0, becomes this front end again (--finish) to write the text. Both write the same
bytes. Under `mpiexec -n N kdgen ...`
every rank does the same, so the engine runs on the N ranks of the launch: tp x pp x dp = N
(default: all tensor parallel; --pp N pipeline stages, --dp N replicas, each generating
its share of the prompts). --device as kdtrain's run%device (auto, the default: the CUDA
device of every rank where kdtrain was built with CUDA and the node has one, else the CPU);
--precision bf16 holds the weights in BF16 and computes in BF16. The engine prints the
tokens/s, the backend and the precision on stderr (and, on the C tokenizer's path, the
time it took to encode and decode).

Exit status: 0 done, 2 bad input (the file or option named: an unreadable or malformed
prompt file, a weights file without /tokenizer and no --tokenizer, a --tokenizer that
cannot be loaded or exceeds the vocabulary, an empty prompt), 3 I/O failure.
"""
import argparse
import json
import os
import shutil
import struct
import sys
import tempfile

EXIT_INPUT, EXIT_IO = 2, 3


def fail(status, msg):
    print("kdgen: " + msg, file=sys.stderr)
    sys.exit(status)


def read_dataset(prefix):
    """The prompt part of every document of a kdprep dataset with a loss mask (PREFIX.bin/.idx
    and PREFIX_mask.bin/.idx, Megatron's indexed format): its tokens before the first counted
    one."""
    import numpy as np
    codes = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}

    def read(p):
        try:
            with open(p + ".idx", "rb") as f:
                raw = f.read()
            if raw[:9] != b"MMIDIDX\x00\x00" or len(raw) < 34 or raw[17] not in codes:
                fail(EXIT_INPUT, f"{p}.idx: not a Megatron index (kdprep output)")
            n = struct.unpack("<Q", raw[18:26])[0]
            lens = np.frombuffer(raw, np.int32, n, 34)
            ptrs = np.frombuffer(raw, np.int64, n, 34 + 4 * n)
            data = np.fromfile(p + ".bin", dtype=codes[raw[17]])
        except (OSError, ValueError) as e:
            fail(EXIT_INPUT, f"{p}: cannot read the dataset ({e})")
        size = np.dtype(codes[raw[17]]).itemsize
        return [data[q // size:q // size + m] for q, m in zip(ptrs, lens)]

    docs, masks = read(prefix), read(prefix + "_mask")
    if len(docs) != len(masks):
        fail(EXIT_INPUT, f"{prefix}: {len(docs)} documents but {len(masks)} masks")
    out = []
    for i, (d, m) in enumerate(zip(docs, masks)):
        counted = np.flatnonzero(m)
        if len(m) != len(d) or not len(counted):
            fail(EXIT_INPUT, f"{prefix}: document {i + 1} has no counted token (or its mask "
                 "is not its length); expected a kdprep --chat or --prompt-key dataset")
        out.append((None, None, [int(t) for t in d[:counted[0]]]))
    return out


def read_prompts(args):
    """[(text, messages, ids)] (one of them set): the prompts of --prompt and --prompts."""
    out = [(p, None, None) for p in args.prompt or []]
    if not args.prompts:
        return out
    if os.path.exists(args.prompts + "_mask.idx") and not os.path.isfile(args.prompts):
        return out + read_dataset(args.prompts)
    try:
        with open(args.prompts, encoding="utf-8") as f:
            lines = [ln[:-1] if ln.endswith("\r") else ln for ln in f.read().split("\n")]
    except (OSError, UnicodeDecodeError) as e:
        fail(EXIT_INPUT, f"{args.prompts}: cannot read the prompt file ({e})")
    first = next((ln for ln in lines if ln.strip()), "")
    if not first.lstrip().startswith("{"):
        args.text_file = True  # kdgen-ids --text reads it as it stands
        return out + [(ln, None, None) for ln in lines if ln.strip()]
    for n, ln in enumerate(lines, 1):
        if not ln.strip():
            continue
        try:
            obj = json.loads(ln)
        except ValueError as e:
            fail(EXIT_INPUT, f"{args.prompts}:{n}: not JSON ({e}); expected one object per line")
        if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
            out.append((obj["prompt"], None, None))
        elif isinstance(obj, dict) and isinstance(obj.get("messages"), list):
            msgs = []
            for m in obj["messages"]:
                if not isinstance(m, dict) or not isinstance(m.get("content"), str):
                    fail(EXIT_INPUT, f"{args.prompts}:{n}: a message without a string content")
                if m.get("role") == "assistant":
                    break
                msgs.append(m)
            if not msgs:
                fail(EXIT_INPUT, f"{args.prompts}:{n}: no turn before the first assistant turn")
            out.append((None, msgs, None))
        else:
            fail(EXIT_INPUT, f"{args.prompts}:{n}: expected an object with a string \"prompt\" "
                 "or a \"messages\" list")
    return out


def tokenizer_files(path, tmp, hint):
    """Write the files of the /tokenizer group of kdtrain weights file `path` into tmp
    (exit 2 naming the file, and `hint`, where it has none)."""
    import h5py
    try:
        with h5py.File(path, "r") as f:
            if "tokenizer" not in f:
                fail(EXIT_INPUT, f"{path}: no /tokenizer group; {hint}")
            for name, ds in f["tokenizer"].items():
                with open(os.path.join(tmp, name), "wb") as out:
                    out.write(bytes(ds[()].tobytes()))
    except OSError as e:
        fail(EXIT_INPUT, f"{path}: cannot read as HDF5 ({e}); expected a kdtrain weights file")


def load_tokenizer(weights, tokenizer=None):
    """The Hugging Face tokenizer of --tokenizer (a tokenizer directory, or the /tokenizer
    group of another weights file) or else the one stored under /tokenizer of the weights
    file, and the model's max_position_embeddings (/config; None when not stated)."""
    try:
        import h5py
        # the tokenizer alone: no notice that PyTorch is not installed (tools-env has none)
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        from transformers import AutoTokenizer
    except ImportError as e:
        fail(EXIT_INPUT, f"kdgen needs h5py and transformers ({e}); `make tools-env` "
             "installs them (README.md)")
    try:
        with h5py.File(weights, "r") as f:
            cfg = f["config"].attrs if "config" in f else {}
            npos, vocab = cfg.get("max_position_embeddings"), cfg.get("vocab_size")
    except OSError as e:
        fail(EXIT_INPUT, f"{weights}: cannot read as HDF5 ({e}); expected a kdtrain weights "
             "file")
    tmp = tempfile.mkdtemp(prefix="kdgen_tok_")
    try:
        if tokenizer is None:
            where = weights
            tokenizer_files(weights, tmp, "name a tokenizer with --tokenizer DIR (a Hugging "
                            "Face tokenizer directory) or --tokenizer FILE.h5 (a weights file "
                            "that carries one, e.g. the teacher's)")
            src = tmp
        elif os.path.isdir(tokenizer):
            where = src = tokenizer
        elif os.path.isfile(tokenizer):
            where = tokenizer
            tokenizer_files(tokenizer, tmp, "expected a weights file that carries a tokenizer "
                            "(--tokenizer FILE.h5) or a tokenizer directory (--tokenizer DIR)")
            src = tmp
        else:
            fail(EXIT_INPUT, f"--tokenizer {tokenizer}: no such directory or file; expected a "
                 "Hugging Face tokenizer directory or a kdtrain weights file")
        import warnings
        warnings.filterwarnings("ignore")
        try:
            tok = AutoTokenizer.from_pretrained(src)
        except Exception as e:  # noqa: BLE001 (any tokenizer file the library refuses)
            fail(EXIT_INPUT, f"{where}: cannot load the tokenizer"
                 f"{' of /tokenizer' if src == tmp else ''} ({e})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if tokenizer is not None and vocab is not None and len(tok) > int(vocab):
        fail(EXIT_INPUT, f"--tokenizer {tokenizer}: {len(tok)} tokens, more than the "
             f"vocab_size = {int(vocab)} of {weights}; expected the model's own tokenizer")
    return tok, None if npos is None else int(npos)


def prompt_text(tok, p, where):
    """The text of prompt p: itself, its chat turns rendered with the generation prompt, or
    its ids decoded."""
    text, msgs, ids = p
    if ids is not None:
        return tok.decode(ids)
    if msgs is None:
        return text
    if not getattr(tok, "chat_template", None):
        fail(EXIT_INPUT, f"{where}: chat prompts, but the tokenizer has no chat template")
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def encode(tok, p, text):
    """Token ids of a prompt: the tokenizer's own call (its special tokens, e.g. a BOS), for
    a rendered chat the template's text as it stands, a dataset's prompt as it is."""
    if p[2] is not None:
        return p[2]
    return tok(text, add_special_tokens=p[1] is None)["input_ids"]


def parse(argv):
    ap = argparse.ArgumentParser(prog="kdgen", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("weights", help="kdtrain weights file or checkpoint (with /tokenizer, "
                    "or give --tokenizer)")
    ap.add_argument("--prompt", action="append", help="a prompt (may be given again)")
    ap.add_argument("--prompts", help="prompt file: one per line, or JSONL with \"prompt\" "
                    "or \"messages\", or a kdprep masked dataset PREFIX")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    ap.add_argument("--top-k", type=int, default=0, help="0 (default): no top-k filter")
    ap.add_argument("--top-p", type=float, default=1.0, help="1 (default): no top-p filter")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jsonl", help="write JSONL (prompt, text, ids) here instead of text")
    ap.add_argument("--tokenizer", metavar="DIR|FILE.h5",
                    help="the tokenizer to use instead of the weights file's: a Hugging Face "
                    "tokenizer directory or a kdtrain weights file with /tokenizer")
    ap.add_argument("--tp", type=int, help="tensor-parallel ranks (default: the ranks left)")
    ap.add_argument("--pp", type=int, help="pipeline stages (default 1)")
    ap.add_argument("--dp", type=int, help="data-parallel replicas (default 1)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto (default): CUDA where every rank has a device, else the CPU")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--finish", help=argparse.SUPPRESS)  # the engine's ids: write the text
    # the engine hands back a tokenizer it cannot read as transformers does: tokenise here
    ap.add_argument("--python-tokenizer", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.prompt and not args.prompts:
        ap.error("give --prompt TEXT or --prompts FILE")
    if args.max_new_tokens < 1:
        ap.error(f"--max-new-tokens {args.max_new_tokens}: expected at least 1")
    if not 0 < args.top_p <= 1 or args.temperature < 0 or args.top_k < 0:
        ap.error("expected --temperature >= 0, --top-k >= 0 and 0 < --top-p <= 1")
    return args


def engine_path():
    here = os.path.dirname(os.path.realpath(__file__))
    return os.environ.get("KDGEN_ENGINE") or os.path.join(here, "kdgen-ids")


def engine_opts(args):
    """The engine's options of generation and layout."""
    cmd = ["--max-new-tokens", str(args.max_new_tokens), "--temperature", repr(args.temperature),
           "--top-k", str(args.top_k), "--top-p", repr(args.top_p), "--seed", str(args.seed),
           "--device", args.device, "--precision", args.precision]
    for k in ("tp", "pp", "dp"):
        if getattr(args, k):
            cmd += ["--" + k, str(getattr(args, k))]
    return cmd


def become(engine, cmd, tmp):
    """exec the engine (removing the temporary prompt file tmp if that fails)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(engine, cmd)
    except OSError as e:
        if tmp:
            os.unlink(tmp)
        fail(EXIT_IO, f"cannot run the engine {engine} ({e})")


def c_tokenizer_serves(args, prompts):
    """Whether kdgen-ids --text can take the prompts as they are: text of one non-blank line
    each (as a text prompt file holds them), the weights file's own tokenizer, and no
    transformers older than 5 installed (the engine reads the tokenizer files as
    transformers 5 does)."""
    if args.tokenizer or args.python_tokenizer or os.environ.get("KDGEN_PYTHON_TOKENIZER"):
        return False
    for text, _, _ in prompts:
        if text is None or not text.strip() or "\n" in text or "\r" in text:
            return False
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate of a JSON escape
            return False
    try:
        from importlib.metadata import PackageNotFoundError, version
        return int(version("transformers").split(".")[0]) >= 5
    except PackageNotFoundError:
        return True
    except ValueError:
        return False


def start_text(args, argv, prompts):
    """Become the engine on the text of the prompts (kdgen-ids --text): the --prompts file as
    it stands, or a temporary file of the prompts, one per line (--prompt, JSONL, a pipe)."""
    engine, tmp = engine_path(), None
    if not args.prompt and getattr(args, "text_file", False) and os.path.isfile(args.prompts):
        src = ["--text", args.prompts]  # a regular file: read again, as it stands
    else:
        fd, tmp = tempfile.mkstemp(prefix="kdgen_", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(text + "\n" for text, _, _ in prompts)
        src = ["--text", tmp, "--remove-ids", "--name", args.prompts or "--prompt"]
    cmd = [engine, args.weights] + src + engine_opts(args)
    if args.jsonl:
        cmd += ["--jsonl", args.jsonl]
    cmd += ["--or-else", sys.executable, os.path.realpath(__file__)] + argv + ["--python-tokenizer"]
    become(engine, cmd, tmp)


def start(args, argv):
    """Tokenise, then become the engine (whose rank 0 comes back as finish()); or become the
    engine on the prompts' text, which it tokenises and writes itself."""
    prompts = read_prompts(args)
    if args.jsonl and not os.access(os.path.dirname(os.path.abspath(args.jsonl)), os.W_OK):
        fail(EXIT_IO, f"cannot write {args.jsonl}: its directory is not writable")
    if prompts and c_tokenizer_serves(args, prompts):
        start_text(args, argv, prompts)
    tok, npos = load_tokenizer(args.weights, args.tokenizer)
    where = args.prompts or "--prompt"
    ids = []
    for i, p in enumerate(prompts):
        x = encode(tok, p, prompt_text(tok, p, where))
        if not x:
            fail(EXIT_INPUT, f"{where}: prompt {i + 1} has no tokens")
        if npos is not None and len(x) + args.max_new_tokens > npos:
            fail(EXIT_INPUT, f"{where}: prompt {i + 1} of {len(x)} tokens and --max-new-tokens "
                 f"{args.max_new_tokens} exceed max_position_embeddings = {npos} of "
                 f"{args.weights}")
        ids.append(x)
    if not ids:
        fail(EXIT_INPUT, f"{where} holds no prompt")
    fd, path = tempfile.mkstemp(prefix="kdgen_", suffix=".ids")
    with os.fdopen(fd, "w") as f:
        f.writelines(" ".join(map(str, x)) + "\n" for x in ids)
    engine = engine_path()
    cmd = [engine, args.weights, "--ids", path, "--remove-ids", "--out", path + ".out"]
    cmd += engine_opts(args)
    if tok.eos_token_id is not None:
        cmd += ["--eos", str(tok.eos_token_id)]
    cmd += ["--then", sys.executable, os.path.realpath(__file__)] + argv + ["--finish", path + ".out"]
    become(engine, cmd, path)


def finish(args):
    """The engine's ids (one line per prompt) -> text, or JSONL with prompt, text and ids."""
    prompts = read_prompts(args)
    try:
        with open(args.finish) as f:
            made = [[int(v) for v in ln.split()] for ln in f.read().split("\n")[:len(prompts)]]
        os.unlink(args.finish)
        if len(made) != len(prompts) or not all(made):
            raise ValueError(f"{len(made)} lines of ids for {len(prompts)} prompts")
    except (OSError, ValueError) as e:
        fail(EXIT_IO, f"cannot read the engine's ids {args.finish} ({e})")
    tok = load_tokenizer(args.weights, args.tokenizer)[0]
    where = args.prompts or "--prompt"
    rows = []
    for p, ids in zip(prompts, made):
        text = prompt_text(tok, p, where)
        rows.append((text, tok.decode(ids, skip_special_tokens=True), ids))
    try:
        if args.jsonl:
            with open(args.jsonl, "w", encoding="utf-8") as f:
                for text, gen, ids in rows:
                    f.write(json.dumps({"prompt": text, "text": gen, "ids": ids},
                                       ensure_ascii=False) + "\n")
        else:
            sys.stdout.write("\n\n".join(text + gen for text, gen, _ in rows) + "\n")
            sys.stdout.flush()
    except OSError as e:
        fail(EXIT_IO, f"writing {args.jsonl or 'the text'} failed ({e})")


def main():
    argv = sys.argv[1:]
    args = parse(argv)
    if args.finish:
        finish(args)
    else:
        start(args, argv)


if __name__ == "__main__":
    main()
