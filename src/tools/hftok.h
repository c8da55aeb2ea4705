/* hftok.h: what kdgen's Python path (transformers 5's AutoTokenizer, the version
 * src/tools/requirements.txt pins) makes of a model's tokenizer files beyond tokenizer.json,
 * so that kdgen-ids --text encodes, stops and decodes as kdgen.py does: its end-of-sequence
 * id, and whether it reads tokenizer.json as it stands at all (a named tokenizer class such
 * as Qwen2Tokenizer is rebuilt from transformers' own definition; special tokens
 * tokenizer.json lacks are added; a forced clean_up_tokenization_spaces rewrites the text):
 * where it may not, the C tokenizer's answer could differ, and hftok_check says why. */
#ifndef KD_HFTOK_H
#define KD_HFTOK_H

#include <stddef.h>

#include "tokenizer.h"
#include "tokfiles.h"

/* Whether kdgen's Python path reads the held tokenizer `t`, whose tokenizer.json `tk` was
 * loaded from, as the C tokenizer reads that tokenizer.json: then its tokenizer(text) ids are
 * tokenizer_encode's with the special tokens, its decode(ids, skip_special_tokens=True)
 * tokenizer_decode's with skip_special, and *eos gets its tok.eos_token_id (-1: none). 0, or
 * -1 with the reason in `why` (the file and key named). Not collective. */
int hftok_check(const struct tokset *t, const struct tokenizer *tk, int *eos, char *why,
                size_t whylen);

#endif
