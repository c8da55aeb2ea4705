#!/usr/bin/env python3
"""The files of the cross-tokenizer distillation example (validation/xtok_demo/run.sh).

  xtok_demo.py prepare WORK TEACHER_TOKENS STUDENT_TOKENS
      WORK/train.txt, WORK/valid.txt: input/corpus/kjv-train.txt and kjv-valid.txt as
      paragraphs of whole sentences of at most PARAGRAPH_BYTES bytes (a chapter of the corpus
      is one paragraph of 4,500 bytes on average: cut to seq_len tokens, most of it would
      never be seen); WORK/hf_teacher: a Qwen2/Qwen3-style byte-level BPE tokenizer of
      TEACHER_TOKENS tokens and a random Qwen3 model (4 layers, hidden 256); WORK/hf_student:
      a Llama-3-style tokenizer of STUDENT_TOKENS tokens and a random Llama model (2 layers,
      hidden 128), both tokenizers trained by Hugging Face `tokenizers` on WORK/train.txt and
      saved by transformers (PreTrainedTokenizerFast, eos token set), both models by
      transformers (save_pretrained)
  xtok_demo.py head TEXT SHARE OUT
      the first SHARE (0 < SHARE <= 1) of the paragraphs of TEXT into OUT; their count
  xtok_demo.py labels PREFIX SEQ_LEN
      the labels a run counts on the kdprep dataset PREFIX with data%seq_len SEQ_LEN (each
      document is a sample of its first SEQ_LEN + 1 tokens: its length - 1) and the number of
      documents cut, one line: LABELS DOCUMENTS CUT
  xtok_demo.py bytes TEXT
      the UTF-8 bytes of the paragraphs of TEXT (kdprep's documents: blank-line separated,
      stripped)
"""
import os
import re
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
PARAGRAPH_BYTES = 600


def fail(msg):
    print("xtok_demo.py: " + msg, file=sys.stderr)
    sys.exit(1)


def paragraphs(path):
    """kdprep's documents of a plain text file (--doc-per paragraph)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


def resplit(path, out):
    """Each paragraph (a chapter) as paragraphs of whole sentences of at most
    PARAGRAPH_BYTES bytes (a longer sentence is cut at its clause marks ';' and ':')."""
    pieces = []
    for chapter in paragraphs(path):
        flat = " ".join(chapter.split())
        units = []
        for s in re.split(r"(?<=[.?!])\s+", flat):
            while len(s.encode()) > PARAGRAPH_BYTES:  # a long sentence: at a clause mark
                cut = max(s.rfind("; ", 0, PARAGRAPH_BYTES), s.rfind(": ", 0, PARAGRAPH_BYTES))
                if cut <= 0:
                    cut = s.rfind(" ", 0, PARAGRAPH_BYTES)
                units.append(s[:cut + 1])
                s = s[cut + 2:]
            units.append(s)
        cur = ""
        for u in units:
            if cur and len((cur + " " + u).encode()) > PARAGRAPH_BYTES:
                pieces.append(cur)
                cur = u
            else:
                cur = cur + " " + u if cur else u
        if cur:
            pieces.append(cur)
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n\n".join(pieces) + "\n")
    return len(pieces)


def tokenizer_dir(tok, eos, path):
    from transformers import PreTrainedTokenizerFast
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=eos)
    fast.save_pretrained(path)
    return len(fast)


def prepare(work, nt_want, ns_want):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging
    import tokenizer_ref  # validation/ref: the byte-level BPE kinds of the C tokenizer's tests
    hf_logging.disable_progress_bar()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    corpus = os.path.join(HERE, "..", "..", "input", "corpus")
    for name in ("train", "valid"):
        n = resplit(os.path.join(corpus, f"kjv-{name}.txt"), os.path.join(work, f"{name}.txt"))
        print(f"{name}.txt: {n} paragraphs of at most {PARAGRAPH_BYTES} bytes")
    lines = paragraphs(os.path.join(work, "train.txt"))
    teacher_tok = tokenizer_ref.bytelevel_kind(lines, "qwen2", nt_want)
    student_tok = tokenizer_ref.bytelevel_kind(lines, "llama3", ns_want)
    nt = tokenizer_dir(teacher_tok, "<|endoftext|>", os.path.join(work, "hf_teacher"))
    ns = tokenizer_dir(student_tok, "<|end_of_text|>", os.path.join(work, "hf_student"))
    torch.manual_seed(1)
    teacher = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=(nt + 63) // 64 * 64, hidden_size=256, intermediate_size=768,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        max_position_embeddings=1024, tie_word_embeddings=False, rope_theta=10000.0))
    student = LlamaForCausalLM(LlamaConfig(
        vocab_size=(ns + 63) // 64 * 64, hidden_size=128, intermediate_size=384,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, tie_word_embeddings=False, rope_theta=10000.0))
    for model, role in ((teacher, "teacher"), (student, "student")):
        model.save_pretrained(os.path.join(work, f"hf_{role}"))
        n = sum(p.numel() for p in model.parameters())
        print(f"{role}: {type(model).__name__}, {model.config.num_hidden_layers} layers, hidden "
              f"{model.config.hidden_size}, {nt if role == 'teacher' else ns} tokens (vocab_size "
              f"{model.config.vocab_size}), {n / 1e6:.2f}M parameters")


def read_sizes(prefix):
    """The sequence lengths of a Megatron-LM index (doc/format.md, "Token data")."""
    try:
        with open(prefix + ".idx", "rb") as f:
            head = f.read(9 + 8 + 1 + 8 + 8)
            if head[:9] != b"MMIDIDX\x00\x00":
                fail(f"{prefix}.idx: not a Megatron-LM index")
            n = struct.unpack("<Q", head[18:26])[0]
            return struct.unpack(f"<{n}i", f.read(4 * n))
    except OSError as e:
        fail(f"{prefix}.idx: {e.strerror}")


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "prepare":
        prepare(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) == 5 and sys.argv[1] == "head":
        share = float(sys.argv[3])
        if not 0 < share <= 1:
            fail(f"head: SHARE {sys.argv[3]} is not in (0, 1]")
        docs = paragraphs(sys.argv[2])
        docs = docs[:max(1, round(share * len(docs)))]
        with open(sys.argv[4], "w", encoding="utf-8") as f:
            f.write("\n\n".join(docs) + "\n")
        print(len(docs))
    elif len(sys.argv) == 4 and sys.argv[1] == "labels":
        window = int(sys.argv[3]) + 1
        sizes = read_sizes(sys.argv[2])
        print(sum(min(n, window) - 1 for n in sizes), len(sizes),
              sum(1 for n in sizes if n > window))
    elif len(sys.argv) == 3 and sys.argv[1] == "bytes":
        print(sum(len(p.encode("utf-8")) for p in paragraphs(sys.argv[2])))
    else:
        fail("usage: xtok_demo.py prepare WORK TEACHER_TOKENS STUDENT_TOKENS | head TEXT SHARE "
             "OUT | labels PREFIX SEQ_LEN | bytes TEXT")


if __name__ == "__main__":
    main()
