#!/usr/bin/env python3
"""The Unicode tables of the C tokenizer (src/tokenizer.c), printed as the C source
src/tokenizer_ucd.c. They are what Hugging Face `tokenizers` (the version of
validation/requirements.txt) uses, read from `tokenizers` itself and from Python's
`unicodedata`:

* the classes of the pre-tokenizer regular expressions, \\p{L}, \\p{N} and \\s, are those of
  the Oniguruma inside `tokenizers` (Unicode 16.0 in tokenizers 0.23.3): every code point
  is put through a Split pre-tokenizer with the class as its pattern. Python's own
  unicodedata (14.0 in Python 3.11) gives a subset of them: the script checks that every
  difference is a code point unassigned in Python's version;
* the NFC normalizer (Qwen2's, Qwen3's) is `tokenizers`' unicode-normalization-alignments
  crate, whose tables are Unicode 9.0: canonical combining classes, full canonical
  decompositions and primary composites come from Python's unicodedata, kept where that
  NFC knows them (a character assigned after 9.0 has class 0 and no decomposition there):
  each is probed through `tokenizers.normalizers`;
* TOK_UCD_NFC marks the characters NFC may change alone or combine with what precedes
  them (a non-zero class, a decomposition NFC does not give back, the second of a
  composite, Hangul V and T jamo); NFC leaves any other character as it is unless one
  of these follows it.

Run it again (with the Python of validation/requirements.txt) when `tokenizers` changes:

  python3 validation/ref/tokenizer_ucd.py > src/tokenizer_ucd.c
  python3 validation/ref/tokenizer_ucd.py --check src/tokenizer_ucd.c   # what the test runs
"""
import sys
import unicodedata

import tokenizers
from tokenizers import Regex, normalizers, pre_tokenizers

L, N, WS, NFC = 1, 2, 4, 8
CPS = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
ALL = "".join(map(chr, CPS))


def onig_class(pattern):
    """The code points `tokenizers`' regex engine matches with `pattern` (one char)."""
    rest = set()
    for piece, _ in pre_tokenizers.Split(Regex(pattern), "removed").pre_tokenize_str(ALL):
        rest.update(piece)
    return {c for c in CPS if chr(c) not in rest}


def full_decomposition(c):
    """The full canonical decomposition of c by unicodedata, recursively, not reordered
    (as the crate's table), or None."""
    d = unicodedata.decomposition(chr(c))
    if not d or d.startswith("<"):
        return None
    out = []
    for part in d.split():
        p = int(part, 16)
        sub = full_decomposition(p)
        out += sub if sub else [p]
    return out


def main():
    nfc, nfd = normalizers.NFC(), normalizers.NFD()
    cls = {c: 0 for c in CPS}
    for bit, pattern in ((L, r"\p{L}"), (N, r"\p{N}"), (WS, r"\s")):
        got = onig_class(pattern)
        for c in got:
            cls[c] |= bit
        if bit in (L, N):
            cat = "L" if bit == L else "N"
            py = {c for c in CPS if unicodedata.category(chr(c)).startswith(cat)}
            missing = py - got
            newer = [c for c in got - py if unicodedata.category(chr(c)) != "Cn"]
            if missing or newer:
                sys.exit("tokenizer_ucd.py: \\p{%s} of tokenizers disagrees with unicodedata %s "
                         "on assigned code points: %s %s" % (cat, unicodedata.unidata_version,
                                                             sorted(missing)[:9], newer[:9]))

    # NFC as tokenizers' normalizer knows it
    ccc = {}
    for c in CPS:
        k = unicodedata.combining(chr(c))
        if not k:
            continue
        if full_decomposition(c):
            ccc[c] = k  # decomposed before its class is read; assigned long before 9.0
            continue
        # a non-starter of the same class in tokenizers' NFC moves behind U+0334 (class 1),
        # or in front of U+0301 (class 230) when its class is 1; a starter moves nothing
        if k > 1:
            probe, moved = "q" + chr(c) + "\u0334", "q\u0334" + chr(c)
        else:
            probe, moved = "q\u0301" + chr(c), "q" + chr(c) + "\u0301"
        got = nfc.normalize_str(probe)
        if got == moved:
            ccc[c] = k
        elif got != probe:
            sys.exit("tokenizer_ucd.py: unexpected NFC of U+%04X's probe" % c)
    decomp = {}
    for c in CPS:
        d = full_decomposition(c)
        if d and nfd.normalize_str(chr(c)) != chr(c):
            if nfd.normalize_str(chr(c)) != unicodedata.normalize("NFD", chr(c)):
                sys.exit("tokenizer_ucd.py: tokenizers' NFD of U+%04X is not Python's" % c)
            decomp[c] = d
    comp = {}
    for c, d in decomp.items():
        one = unicodedata.decomposition(chr(c)).split()
        if len(one) == 2 and unicodedata.normalize("NFC", chr(c)) == chr(c):
            a, b = int(one[0], 16), int(one[1], 16)
            if nfc.normalize_str(chr(a) + chr(b)) != chr(c):
                sys.exit("tokenizer_ucd.py: tokenizers does not compose U+%04X" % c)
            comp[(a, b)] = c
    seconds = {b for (_, b) in comp}
    for c in CPS:
        if (c in ccc and c not in decomp) or c in seconds or 0x1161 <= c <= 0x1175 \
                or 0x11A8 <= c <= 0x11C2 or (c in decomp and nfc.normalize_str(chr(c)) != chr(c)):
            cls[c] |= NFC

    # the class table in two stages: a block per 128 code points, identical blocks once
    B = 128
    blocks, index = [], []
    seen = {}
    for start in range(0, 0x110000, B):
        blk = tuple(cls.get(c, 0) for c in range(start, start + B))
        if blk not in seen:
            seen[blk] = len(blocks)
            blocks.append(blk)
        index.append(seen[blk])

    o = []
    o.append("/* tokenizer_ucd.c: the Unicode tables of the C tokenizer. Generated by")
    o.append(" * validation/ref/tokenizer_ucd.py (tokenizers %s, Python unicodedata %s): do not edit."
             % (tokenizers.__version__, unicodedata.unidata_version))
    o.append(" * Classes: Oniguruma's \\p{L}, \\p{N}, \\s inside tokenizers; NFC: Python's data kept where")
    o.append(" * tokenizers' NFC (Unicode 9.0) knows it. */")
    o.append('#include "tokenizer_ucd.h"')
    o.append("")
    o.append("/* clang-format off */")
    o.append("const uint16_t tok_ucd_index[%d] = {" % len(index))
    for i in range(0, len(index), 24):
        o.append("    " + ",".join(str(x) for x in index[i:i + 24]) + ",")
    o.append("};")
    o.append("const uint8_t tok_ucd_blocks[%d][%d] = {" % (len(blocks), B))
    for blk in blocks:
        o.append("    {" + ",".join(str(x) for x in blk) + "},")
    o.append("};")
    # combining classes as ranges of one class
    ranges = []
    for c in sorted(ccc):
        if ranges and ranges[-1][1] == c - 1 and ranges[-1][2] == ccc[c]:
            ranges[-1][1] = c
        else:
            ranges.append([c, c, ccc[c]])
    o.append("const struct tok_ucd_ccc tok_ucd_ccc[%d] = {" % len(ranges))
    for i in range(0, len(ranges), 6):
        o.append("    " + " ".join("{0x%X, 0x%X, %d}," % tuple(r) for r in ranges[i:i + 6]))
    o.append("};")
    o.append("const int tok_ucd_nccc = %d;" % len(ranges))
    pool, rows = [], []
    for c in sorted(decomp):
        rows.append((c, len(pool), len(decomp[c])))
        pool += decomp[c]
    o.append("const uint32_t tok_ucd_decomp_pool[%d] = {" % len(pool))
    for i in range(0, len(pool), 12):
        o.append("    " + ",".join("0x%X" % x for x in pool[i:i + 12]) + ",")
    o.append("};")
    o.append("const struct tok_ucd_decomp tok_ucd_decomp[%d] = {" % len(rows))
    for i in range(0, len(rows), 6):
        o.append("    " + " ".join("{0x%X, %d, %d}," % r for r in rows[i:i + 6]))
    o.append("};")
    o.append("const int tok_ucd_ndecomp = %d;" % len(rows))
    pairs = sorted(comp.items())
    o.append("const struct tok_ucd_comp tok_ucd_comp[%d] = {" % len(pairs))
    for i in range(0, len(pairs), 5):
        o.append("    " + " ".join("{0x%X, 0x%X, 0x%X}," % (a, b, c) for (a, b), c in pairs[i:i + 5]))
    o.append("};")
    o.append("const int tok_ucd_ncomp = %d;" % len(pairs))
    o.append("/* clang-format on */")
    text = "\n".join(o) + "\n"
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        if open(sys.argv[2]).read() != text:
            sys.exit("tokenizer_ucd.py: %s is not what tokenizers %s gives: regenerate it "
                     "(python3 validation/ref/tokenizer_ucd.py > src/tokenizer_ucd.c)"
                     % (sys.argv[2], tokenizers.__version__))
        print("%s: the classes and NFC data of tokenizers %s" % (sys.argv[2], tokenizers.__version__))
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
