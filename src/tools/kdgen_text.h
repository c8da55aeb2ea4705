/* kdgen_text.h: kdgen's text in C (kdgen-ids --text): the tokenizer the weights file
 * carries, a prompt file read and encoded as kdgen.py reads and encodes a text --prompts
 * file, and each prompt with its continuation written byte for byte as kdgen.py writes it
 * (text, or JSONL as Python's json.dumps(..., ensure_ascii=False) spells it). */
#ifndef KD_KDGEN_TEXT_H
#define KD_KDGEN_TEXT_H

#include <stddef.h>

#include "config.h"
#include "tokenizer.h"

/* The prompts of a file: prompt i is the len[i] bytes at buf + start[i]. */
struct gentext {
  char *buf;
  size_t *start, *len;
  int n;
};

void gentext_free(struct gentext *p);

/* --text's tokenizer: the one the weights file carries, where kdgen's Python path reads it as
 * the C tokenizer reads its tokenizer.json (hftok.h; its end id in *eos). Where it cannot
 * serve, every rank alike (before MPI starts, from the same file) becomes the or_else
 * program (execvp), its own prompt file `remove` (may be NULL) removed first, or, without
 * one, exits 2 naming the file. Not collective. */
struct tokenizer *gentext_tokenizer(const char *weights, int *eos, char **or_else,
                                    const char *remove);

/* Read the prompt file `path` (named `where` in messages) into *gt as kdgen.py reads a text
 * prompt file (open(path, encoding="utf-8"): lines end at \n, \r\n or \r; strict UTF-8;
 * a line of Python's whitespace alone is no prompt; every line is text, the JSONL kdgen.py
 * tells apart by its first '{' is its own) and encode every prompt as kdgen.py does
 * (tokenizer(text), special tokens added): *rows[b] (malloc'ed) of (*len)[b] ids, *ntok of
 * them in all; checked as kdgen.py checks them (no prompt, a prompt of no tokens, one that
 * with max_new new ids exceeds the model's positions, ids beyond its vocabulary). 0, or
 * KD_EXIT_INPUT with the message. Not collective. */
int gentext_encode(const char *path, const char *where, struct tokenizer *tk,
                   const struct kd_card *card, const char *weights, int max_new, struct gentext *gt,
                   int ***rows, int **len, size_t *ntok, char *err, size_t errlen);

/* Each prompt of gt with its continuation (the nout[b] ids at out + b * max_new, decoded as
 * kdgen.py's tok.decode(ids, skip_special_tokens=True)) written as kdgen.py writes them: as
 * text to out_path (NULL: standard output), a blank line between prompts, or with `jsonl`
 * one object {"prompt": ..., "text": ..., "ids": [...]} per line to that file, as Python's
 * json.dumps(..., ensure_ascii=False) spells it. Exit 3 when it cannot be written. */
void gentext_write(const struct tokenizer *tk, const struct gentext *gt, const int *out,
                   const int *nout, int max_new, const char *out_path, const char *jsonl);

#endif
