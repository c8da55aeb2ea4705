#!/usr/bin/env python3
"""Test tokenizers of every kind the C tokenizer implements, trained here by Hugging Face
`tokenizers` on a small multilingual corpus and configured as the real families' files are
(Qwen2/Qwen3, Llama 3, GPT-2: byte-level BPE with their split expressions; Llama 2 (legacy
and Metaspace), Mistral, Gemma: SentencePiece-style BPE with byte fallback), and what
`tokenizers` gives for them: ids and offsets (in bytes) of the corpus, of adversarial strings,
of seeded random strings and of byte strings that are not UTF-8 (read as
bytes.decode("utf-8", "replace")), with and without the template's special tokens; the text
of the encoded ids and of random id lists, with and without the special tokens. The Check
program validation/unit/test_tokenizer reads them (validation/unit/test_tokenizer.sh).

  tokenizer_ref.py DIR [--perf TEXT...]

writes DIR/kinds.txt (one kind per line), DIR/KIND.json (tokenizer.json) and DIR/KIND.expect:
  V <vocab size: largest id + 1>
  T <token hex> <id>                       token_to_id
  E <add_special> <text hex> <n> (<id> <start> <end>)*n <decode hex> <decode skip hex>
  D <n> <id>*n <decode hex> <decode skip hex>
With --perf: the encoding time of `tokenizers` (one thread) on each TEXT, whole and line by
line, per kind, in DIR/perf_hf.txt (validation/perf/tokenizer.sh).
"""
import json
import os
import random
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers  # noqa: E402
from tokenizers import pre_tokenizers, processors, trainers  # noqa: E402

GPT2_RE = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
QWEN2_RE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"""
            r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
LLAMA3_RE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"""
             r"""\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

CORPUS = """The quick brown fox jumps over the lazy dog. It's 3:45 pm; we'll see, they're here, I'M sure she'd know.
Don't panic!  Two spaces,   three spaces,\tone tab,\t\ttwo tabs.
Line one
Line two\r\nWindows line\r\n\r\nAfter a blank line.


Three newlines above and trailing spaces here   
Numbers: 0 7 42 123 1234 12345 1234567890 3.14159 -2.5e10 1,000,000 0x1F 007 2024-05-17 ٣٤٥ １２３ ² ½ Ⅻ
Prices: $5.99, €12,50, £3, ¥1000, ₹250 — 50% off!!!
Die Straße ist naß, aber die Bäume blühen. Größe, Übermaß, Öl, Äpfel; ich weiß es nicht.
Füße und Schlüssel: „Anführungszeichen“ und »Guillemets«.
Le cœur a ses raisons que la raison ne connaît point. L'été, où est-il ? À bientôt, garçon !
C'est l'hôpital de Noël : ça coûte 15 € (déjà payé).
¿Dónde está la biblioteca? ¡Mañana será otro día! El niño comió piña.
中文分词是一个难题。我们今天去北京大学吃饭，好吗？
人工智能正在改变世界，机器学习和深度学习是其核心技术。
日本語の文章です。東京は大きな都市で、カタカナとひらがなを混ぜます。コンピューター
한국어 문장입니다. 서울은 아름다운 도시입니다. 안녕하세요!
العربية لغة جميلة. مرحبا بالعالم! هذا نص عربي مع أرقام ١٢٣ وتشكيل: كَتَبَ
עברית היא שפה שמית. שָׁלוֹם
Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю.
Ελληνικά: Το γρήγορο καφέ αλεπού πηδάει πάνω από το τεμπέλικο σκυλί.
हिन्दी भाषा में लिखा गया वाक्य। नमस्ते दुनिया!
ภาษาไทยเขียนติดกันไม่มีช่องว่าง
Tiếng Việt có nhiều dấu: Người ta nói rằng đường đi khó.
Emoji: 😀 😃 😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷 🇯🇵 ❤️ ✨🎉 🤖🚀 1️⃣ 🏳️‍🌈
def tokenize(text: str) -> list[int]:
    return [ord(c) for c in text if c != "\\n"]  # comment
int main(void) { printf("%d\\n", a[i] + b->c); return 0; }
{"key": "value", "list": [1, 2, 3], "nested": {"a": null, "b": true}}
    indented with four spaces
\t\tindented with tabs
https://example.com/path?query=1&x=y#frag mail@example.org
<|im_start|>user
Hello, who are you?<|im_end|>
<|im_start|>assistant
<think>
Reasoning here.
</think>
I am a model.<|im_end|><|endoftext|>
<s>[INST] What is 2+2? [/INST] 4</s>
<start_of_turn>user
hi<end_of_turn>
<|begin_of_text|><|start_header_id|>system<|end_header_id|>

You are helpful.<|eot_id|>
say hello world to the <mask> please
aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
ababababababababababababab xyzxyzxyz
Dec\u006fmposed: e\u0301 a\u0300 o\u0308 n\u0303 A\u030a \u212b \u2126 ệ e\u0323\u0302 e\u0302\u0323 \u1100\u1161\u11a8 \uac00\u11a8 \u0f73
"""

ADVERSARIAL = [
    "", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n\n", " \n ", "\t \n\t ", "a", " a", "  a", "a ",
    "a  ", " a ", "'s", "'S", "'ll", "'LL", "'Ll", "'re", "'RE", "'ve", "'d", "'m", "'t", "'x",
    "'ſ", "ſ", "it's", "IT'S", "we'RE", "x'Ve", "''s", "'''", "\"'s\"", " 's", "a's b'S",
    "123", "1234567", " 12", "12 34", "١٢٣٤", "１２３４５", "x²³", "½¾", "ⅫⅣ", "3.14", "1e-5",
    "don't", "Don’t", "l'homme", "hello\u00a0world", "a\u3000b", "a\u2028b", "a\u0085b",
    "a\x0bb", "a\x0cb", "\x00", "\x7f", "\x1f\x1e", "\ufeffBOM", "\u200bzero\u200dwidth",
    "\u00e9", "e\u0301", "e\u0301\u0301", "\u0301", "\u0301e", "a\u0323\u0301", "a\u0301\u0323",
    "\u212b", "\u2126", "\u1e9b\u0323", "\u0344", "\u0f73", "\u0f75", "\uf900", "\u2000",
    "\u1100", "\u1100\u1161", "\u1100\u1161\u11a8", "\uac00\u11a8", "\uac01\u11a8", "\u11a8",
    "\U00011935\U00011930", "\u0898\u0301", "q\u0334\u0301",
    "\U000105c0\U000105c1", "\ufffd", "\uffff", "\U0010ffff", "\ue000", "\U0001f600" * 3,
    "👨‍👩‍👧", "🇫🇷🇯🇵", "a👍🏽b", "<|im_start|>", "<|im_start|><|im_end|>", "<|im_",
    "<|im_start|", "x<|endoftext|>y", " <|endoftext|> ", "<s>", " <s> ", "</s></s>", "<s><s>",
    "<mask>", "  <mask>  x", "x<mask>", "<mask><mask>", "hello world", "say hello world",
    "<think>", " <think> ", "<start_of_turn>", "▁", "▁▁", " ▁ ", "▁a", "a▁", "<0x41>",
    "--", "a-b-c", "a,b,,c", "...", "a.b..c", "-,.", "\r", "\r\r\n\n", " \r\n", "x\r\ny",
    "((([[[", ")\n", "!!\n\n", " !\n", "?\n ", "a\n\n b", "a \n\nb", "  \n\n  ",
    " space token", "a space token b", "  space token  ", "<mask> space token<mask>",
]


def rand_strings(rng, n):
    atoms = (list("abcdefgzAZ") + ["the", "The", "ing", "tion", "straße", "naïve", "coöp"] +
             list("0123456789") + ["٣", "٤", "１", "²", "½", "Ⅻ", "⓵"] +
             [" ", " ", " ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028",
              "\u0085", "\x0b", "\x0c", "\u2009"] +
             list(".,;:!?-_'\"()[]{}<>/\\@#$%^&*+=~`|") + ["'s", "'S", "'ll", "'Re", "'ſ", "’"] +
             ["\u0301", "\u0323", "\u0308", "\u0334", "\u0345", "\u05b0", "\u064b", "\u093f",
              "\u094d", "\u0e31", "\u1dfa", "\u0898"] +
             ["\u1100", "\u1161", "\u11a8", "\uac00", "한", "글"] +
             ["中", "文", "日", "本", "語", "カ", "ひ", "ك", "ت", "ب", "ש", "ж", "λ", "न", "ก"] +
             ["😀", "👍", "🏽", "\u200d", "\ufe0f", "🇫", "🇷", "\U000105c0", "\ufffd", "\ue000",
              "\x00", "\x7f", "\ufeff", "\u200b"] +
             ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<mask>", "<think>",
              "<|im_", "<", "|", "hello world", "▁", "<0x41>", "e\u0301", "\u212b"])
    out = []
    for _ in range(n):
        k = rng.randint(1, 30)
        out.append("".join(rng.choice(atoms) for _ in range(k)))
    return out


def invalid_bytes(rng):
    fixed = [b"\xff", b"\x80", b"abc\xffdef", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82(",
             b"\xf0\x9f\x98", b"\xf0\x9f\x98 x", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe0\x80\xaf",
             b"\xf4\x90\x80\x80", b"\xf5\x80", b"\xfe\xff", b"a\x80\x80\x80b", b" \xff \xfe ",
             b"<|im_start|>\xff<|im_end|>", b"\xe4\xb8\xad\xe6\x96", b"x\xcc e\xcc\x81",
             b"'\xc5 's", b"12\xff34", b"\xc3\xa9\xc3"]
    out = list(fixed)
    pool = [b"a", b" ", b"\n", b"\xc3\xa9", b"\xe4\xb8\xad", b"\xf0\x9f\x98\x80", b"\x80",
            b"\xbf", b"\xc3", b"\xe4\xb8", b"\xf0", b"\xff", b"\xed\xa0\x80", b"1", b"'s"]
    for _ in range(60):
        out.append(b"".join(rng.choice(pool) for _ in range(rng.randint(1, 12))))
    return out


def char_byte_starts(raw):
    """The original byte start of each character of raw.decode("utf-8", "replace") (and the
    length at the end): a valid character is its bytes, an invalid stretch is cut at its
    maximal subparts (the Unicode Standard, Table 3-7: the longest start of a well-formed
    sequence, one byte at least); checked against Python's own decoding."""
    def second(b0):
        return {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF),
                0xF4: (0x80, 0x8F)}.get(b0, (0x80, 0xBF))
    starts, text, i = [], [], 0
    while i < len(raw):
        b0 = raw[i]
        need = 0 if b0 < 0x80 else 1 if 0xC2 <= b0 <= 0xDF else 2 if 0xE0 <= b0 <= 0xEF \
            else 3 if 0xF0 <= b0 <= 0xF4 else -1
        k, ok = 1, need >= 0
        lo, hi = second(b0)
        while ok and k <= need:
            if i + k >= len(raw) or not lo <= raw[i + k] <= hi:
                ok = False
                break
            lo, hi = 0x80, 0xBF
            k += 1
        starts.append(i)
        text.append(raw[i:i + k].decode("utf-8") if ok else "\ufffd")
        i += k
    starts.append(len(raw))
    assert "".join(text) == raw.decode("utf-8", "replace"), raw
    return starts


def bpe_json(tok):
    return json.loads(tok.to_str())


def train(lines, normalizer, pre, vocab_size, specials, alphabet=None, limit=None):
    t = Tokenizer(models.BPE())
    t.normalizer = normalizer
    t.pre_tokenizer = pre
    kw = {"vocab_size": vocab_size, "special_tokens": specials, "show_progress": False}
    if alphabet is not None:
        kw["initial_alphabet"] = alphabet
    if limit is not None:
        kw["limit_alphabet"] = limit
    t.train_from_iterator(lines, trainers.BpeTrainer(**kw))
    return bpe_json(t)["model"]


def bytelevel_kind(lines, name, vocab_size=None):
    """Qwen2/Qwen3 (and one with a larger vocabulary trained on more text), Llama 3, GPT-2
    and a GPT-2 with a prefix space; vocab_size: the tokens BPE learns (default 1,200,
    qwen2_big 6,000)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    big = name == "qwen2_big"
    if big:
        name = "qwen2"
    if name in ("qwen2", "llama3"):
        expr = QWEN2_RE if name == "qwen2" else LLAMA3_RE
        pre = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(expr), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=(name == "llama3"),
                                     use_regex=False)])
    else:
        pre = pre_tokenizers.ByteLevel(add_prefix_space=(name == "gpt2_prefix"), use_regex=True)
    norm = normalizers.NFC() if name == "qwen2" else None
    model = train(lines + (kjv_lines(None) if big else []), norm, pre,
                  vocab_size or (6000 if big else 1200), [], alphabet=alphabet)
    bpe = models.BPE(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]],
                     ignore_merges=(name == "llama3"), fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.normalizer = norm
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    if name == "qwen2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.add_tokens([AddedToken(s, special=True, normalized=False)
                        for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
        tok.add_tokens([AddedToken(s, special=False, normalized=False)
                        for s in ["<think>", "</think>"]])
    elif name == "llama3":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                    "<|end_header_id|>", "<|eot_id|>"] + \
                   ["<|reserved_special_token_%d|>" % i for i in range(6)]
        tok.add_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])])
    else:
        tok.post_processor = processors.ByteLevel(add_prefix_space=(name == "gpt2_prefix"),
                                                  trim_offsets=True)
        tok.add_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
        tok.add_tokens([AddedToken("<mask>", special=True, lstrip=True, rstrip=True,
                                   normalized=False)])
        tok.add_tokens([AddedToken(" space token", special=False, normalized=False)])
    return tok


def sp_kind(lines, name):
    """SentencePiece-style BPE: Llama 2 (legacy normalizer), Mistral (Metaspace), Gemma, and
    two with unknown tokens."""
    meta = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    model = train([" " + l for l in lines], normalizers.Replace(" ", "▁"), meta, 1000, [],
                  limit=150)
    first = {"gemma": ["<pad>", "<eos>", "<bos>", "<unk>"]}.get(name, ["<unk>", "<s>", "</s>"])
    nbytes = 128 if name == "sp_unk" else (0 if name == "sp_nofuse" else 256)
    vocab = {}
    for s in first + ["<0x%02X>" % b for b in range(nbytes)]:
        vocab[s] = len(vocab)
    if name == "gemma":
        for s in ["\t", "\n", "\n\n", "▁▁", "▁▁▁", "▁▁▁▁"]:
            vocab.setdefault(s, len(vocab))
    for s, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(s, len(vocab))
    merges = [tuple(m) for m in model["merges"]]
    bpe = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>",
                     fuse_unk=(name != "sp_nofuse"), byte_fallback=(name != "sp_nofuse"))
    tok = Tokenizer(bpe)
    strip = [decoders.Strip(content=" ", left=1, right=0)]
    seq = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if name in ("llama2", "sp_unk", "sp_nofuse"):
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                               normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence(seq + strip)
    elif name == "mistral":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                     split=False)
        tok.decoder = decoders.Sequence(seq + strip)
    else:  # gemma: its template puts <bos> first
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous",
                                                 invert=False)
        tok.decoder = decoders.Sequence(seq)
    tok.add_tokens([AddedToken(s, special=True, normalized=False) for s in first])
    if name == "gemma":
        tok.add_tokens([AddedToken(s, special=True, normalized=False)
                        for s in ["<start_of_turn>", "<end_of_turn>"]])
        tok.add_tokens([AddedToken("<mask>", special=False, normalized=False)])
        tok.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 2)])
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A </s> <s> $B", special_tokens=[("<s>", 1), ("</s>", 2)])
    if name == "llama2":
        tok.add_tokens([AddedToken("hello world", special=False, normalized=True)])
    return tok


def misc_kind(lines):
    """Split's other behaviors and invert, Metaspace splitting, a prefix space."""
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split("-", behavior="removed"),
        pre_tokenizers.Split(",", behavior="merged_with_next"),
        pre_tokenizers.Split(".", behavior="contiguous"),
        pre_tokenizers.Split(";", behavior="merged_with_previous", invert=True),
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)])
    model = train(lines, None, pre, 800, [], alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]]))
    tok.pre_tokenizer = pre
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def meta_kind(lines):
    """Metaspace splitting on ▁, prepended always, its own decoder."""
    pre = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    model = train(lines, None, pre, 700, [], limit=120)
    vocab = {"<unk>": 0}
    for s, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(s, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in model["merges"]],
                               unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.add_tokens([AddedToken("<unk>", special=True, normalized=False)])
    return tok


def kjv_lines(n):
    """Lines of the English text of input/corpus (the valid part when n is given)."""
    here = os.path.dirname(os.path.abspath(__file__))
    name = "kjv-valid.txt" if n else "kjv-train.txt"
    with open(os.path.join(here, "..", "..", "input", "corpus", name), encoding="utf-8") as f:
        lines = f.read().split("\n")
    return lines[:n] if n else lines


KINDS = ["qwen2", "qwen2_big", "llama3", "gpt2", "gpt2_prefix", "llama2", "mistral", "gemma", "sp_unk",
         "sp_nofuse", "misc", "meta"]


def build(name, lines):
    if name in ("qwen2", "qwen2_big", "llama3", "gpt2", "gpt2_prefix"):
        return bytelevel_kind(lines, name)
    if name == "misc":
        return misc_kind(lines)
    if name == "meta":
        return meta_kind(lines)
    return sp_kind(lines, name)


def fnv(h, ids):
    for i in ids:
        for b in range(4):
            h = ((h ^ ((i >> (8 * b)) & 255)) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def rates(out, files):
    """The encoding time of tokenizers (one thread, best of 5 after a warm-up) on each file,
    whole and line by line (encode_batch), with the FNV-1a hash of the ids as
    validation/perf/tok_rate prints it: DIR/perf_hf.txt rows KIND FILE MODE TOKENS SECONDS
    HASH."""
    rows = []
    for name in KINDS:
        tok = Tokenizer.from_file(os.path.join(out, name + ".json"))
        for path in files:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8")
            lines = text.split("\n")
            for mode in ("whole", "lines"):
                def run():
                    if mode == "whole":
                        return [tok.encode(text, add_special_tokens=False).ids]
                    return [e.ids for e in tok.encode_batch(lines, add_special_tokens=False)]
                got = run()
                best = None
                for _ in range(5):
                    t0 = time.perf_counter()
                    run()
                    dt = time.perf_counter() - t0
                    best = dt if best is None or dt < best else best
                h = 0xCBF29CE484222325
                for ids in got:
                    h = fnv(h, ids)
                rows.append("%s %s %s %d %.6f %016x" % (name, os.path.basename(path), mode,
                                                       sum(map(len, got)), best, h))
    with open(os.path.join(out, "perf_hf.txt"), "w") as f:
        f.write("\n".join(rows) + "\n")


def hexs(b):
    return b.hex() if b else "-"


def main():
    out = sys.argv[1]
    perf = "--perf" in sys.argv
    os.makedirs(out, exist_ok=True)
    lines = CORPUS.split("\n")
    rng = random.Random(39)
    texts = [l.encode() for l in lines] + [CORPUS.encode()] + [a.encode() for a in ADVERSARIAL]
    texts += [s.encode() for s in rand_strings(rng, 400)] + invalid_bytes(rng)
    texts += [l.encode() for l in kjv_lines(100)]
    with open(os.path.join(out, "kinds.txt"), "w") as f:
        f.write("\n".join(KINDS) + "\n")
    for name in KINDS:
        tok = build(name, lines)
        js = tok.to_str()
        if name == "gpt2":  # merges as the older files spell them: "a b"
            d = json.loads(js)
            d["model"]["merges"] = [" ".join(m) for m in d["model"]["merges"]]
            js = json.dumps(d, ensure_ascii=False, indent=2)
        tok = Tokenizer.from_str(js)  # what a reader of the file gets
        with open(os.path.join(out, name + ".json"), "w", encoding="utf-8") as f:
            f.write(js)
        vocab = tok.get_vocab(with_added_tokens=True)
        rows = ["V %d" % (max(vocab.values()) + 1)]
        for s in sorted(vocab)[:: max(1, len(vocab) // 50)] + ["<|im_start|>", "not a token"]:
            rows.append("T %s %d" % (hexs(s.encode()), vocab.get(s, -1)))
        for raw in texts:
            text = raw.decode("utf-8", "replace")
            starts = char_byte_starts(raw)
            for special in (0, 1):
                enc = tok.encode(text, add_special_tokens=bool(special))
                parts = []
                for i, (s, e) in zip(enc.ids, enc.offsets):
                    parts.append("%d %d %d" % (i, starts[s], starts[e]))
                d0 = tok.decode(enc.ids, skip_special_tokens=False).encode()
                d1 = tok.decode(enc.ids, skip_special_tokens=True).encode()
                rows.append("E %d %s %d %s %s %s" % (special, hexs(raw), len(enc.ids),
                                                     " ".join(parts), hexs(d0), hexs(d1)))
        nid = max(vocab.values()) + 1
        for _ in range(200):
            ids = [rng.randrange(nid + 3) for _ in range(rng.randint(1, 12))]
            d0 = tok.decode(ids, skip_special_tokens=False).encode()
            d1 = tok.decode(ids, skip_special_tokens=True).encode()
            rows.append("D %d %s %s %s" % (len(ids), " ".join(map(str, ids)), hexs(d0), hexs(d1)))
        with open(os.path.join(out, name + ".expect"), "w") as f:
            f.write("\n".join(rows) + "\n")
    if perf:
        rates(out, sys.argv[sys.argv.index("--perf") + 1:])

if __name__ == "__main__":
    main()
