#!/usr/bin/env python3
"""Build the embedded KJV corpus (kjv-train.txt, kjv-valid.txt) from the output of

    bible -f -l 1000 "Gen1:1-Rev22:21" > kjv.txt     # Debian package bible-kjv

whose lines read "Ge1:1 In the beginning God created ...". Each chapter becomes one
paragraph (verse references stripped, wrapped at 79 columns); chapters are
separated by a blank line. Train: books in canonical order from Genesis, cut at
the last chapter boundary that keeps it within TRAIN_BYTES. Valid: the Gospel of
John, which train does not contain.

usage: make_corpus.py KJV_TXT [OUT_DIR]   (OUT_DIR defaults to this script's folder;
KJV_TXT may be '-' for standard input)
"""
import os
import re
import sys
import textwrap

TRAIN_BYTES = 1_500_000
VALID_BOOKS = ["John"]
WIDTH = 79
VERSE = re.compile(r"^([0-9]?[A-Za-z]+)([0-9]+):([0-9]+) (.*)$")


def read_chapters(lines):
    """[(book, chapter, [verse text, ...]), ...] in file order."""
    chapters = []
    for n, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        m = VERSE.match(line)
        if not m:
            sys.exit("line %d is not 'BookC:V text': %r" % (n, line[:60]))
        book, chap, text = m.group(1), int(m.group(2)), m.group(4).strip()
        if not chapters or chapters[-1][:2] != (book, chap):
            chapters.append((book, chap, []))
        chapters[-1][2].append(text)
    return chapters


def render(chapter):
    """One chapter as a wrapped paragraph followed by a blank line."""
    text = " ".join(chapter[2])
    return textwrap.fill(text, width=WIDTH, break_long_words=False) + "\n\n"


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    src = sys.stdin if sys.argv[1] == "-" else open(sys.argv[1], encoding="ascii")
    out_dir = sys.argv[2] if len(sys.argv) == 3 else os.path.dirname(os.path.abspath(__file__))
    chapters = read_chapters(src)

    train, size = [], 0
    for ch in chapters:
        if ch[0] in VALID_BOOKS:
            break
        block = render(ch)
        if size + len(block) > TRAIN_BYTES:
            break
        train.append(block)
        size += len(block)
    valid = [render(ch) for ch in chapters if ch[0] in VALID_BOOKS]

    for name, blocks in (("kjv-train.txt", train), ("kjv-valid.txt", valid)):
        text = "".join(blocks).rstrip("\n") + "\n"
        text.encode("ascii")  # raises on anything outside ASCII
        with open(os.path.join(out_dir, name), "w", encoding="ascii", newline="\n") as f:
            f.write(text)
        print("%s: %d bytes" % (name, len(text)))

    last = chapters[len(train) - 1]
    books = []
    for ch in chapters[: len(train)]:
        if not books or books[-1] != ch[0]:
            books.append(ch[0])
    print("train: %s (through %s %d)" % (" ".join(books), last[0], last[1]))
    print("valid: %s" % " ".join(VALID_BOOKS))


if __name__ == "__main__":
    main()
