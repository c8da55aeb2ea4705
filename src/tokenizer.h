/* tokenizer.h: a model's tokenizer from its Hugging Face tokenizer.json, in C: the ids and
 * byte offsets Hugging Face `tokenizers` gives (Tokenizer.encode), and the text of ids
 * (Tokenizer.decode). What it implements (doc/tokenizer.md): the BPE model (vocabulary,
 * merges by rank, ignore_merges, byte_fallback, unk_token and fuse_unk), the normalizers
 * NFC, Replace (a string), Prepend and Sequence, the pre-tokenizers ByteLevel (GPT-2's
 * expression), Split (a string, or the expressions of Qwen2/Qwen3 and Llama 3), Metaspace
 * and Sequence, added and special tokens (lstrip, rstrip, normalized), the post-processors
 * ByteLevel, TemplateProcessing and Sequence, the decoders ByteLevel, Metaspace, Replace,
 * ByteFallback, Fuse, Strip and Sequence. Anything else in the file is refused by name at
 * load: never a different encoding.
 *
 * Text is UTF-8. Bytes that are not UTF-8 are read as Python's
 * bytes.decode("utf-8", "replace") reads them: each maximal invalid subpart is one U+FFFD,
 * whose offsets are the invalid bytes. A tokenizer is not thread-safe (its word cache). */
#ifndef KD_TOKENIZER_H
#define KD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer;

/* Ids and offsets of an encoding: token i covers bytes [start[i], end[i]) of the text
 * (a token made of part of a character covers the character; the special tokens of a
 * template cover [0, 0)). The arrays grow as needed and are reused across calls. */
struct tok_encoding {
  int32_t *ids;   /* (n) */
  int64_t *start; /* (n) */
  int64_t *end;   /* (n) */
  size_t n, cap;
};

/* The tokenizer of the tokenizer.json text `json` (len bytes). NULL with the reason in err
 * (a component the C tokenizer does not implement is named: the caller's exit 2). */
struct tokenizer *tokenizer_load(const char *json, size_t len, char *err, size_t errlen);

/* tokenizer_load of the file at `path`. */
struct tokenizer *tokenizer_load_file(const char *path, char *err, size_t errlen);

/* Encode `len` bytes of `text` into *out (replacing its content), as Hugging Face's
 * Tokenizer.encode(text, add_special_tokens=add_special) with offsets in bytes. 0, or -1
 * with a message (out of memory; a text of 2^32 bytes or more). */
int tokenizer_encode(struct tokenizer *t, const char *text, size_t len, int add_special,
                     struct tok_encoding *out, char *err, size_t errlen);

/* The text of n ids as Tokenizer.decode(ids, skip_special_tokens=skip_special): a
 * malloc'ed NUL-terminated UTF-8 string of *len bytes; ids the tokenizer does not know are
 * skipped, as there. NULL when out of memory. */
char *tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                       size_t *len);

/* The number of ids: the largest id of the vocabulary and the added tokens, plus 1. */
int64_t tokenizer_vocab_size(const struct tokenizer *t);

/* The id of the token spelt `tok` (len bytes) as tokenizer.json spells it (an added token's
 * content, or a vocabulary entry), -1 when there is none. */
int32_t tokenizer_token_id(const struct tokenizer *t, const char *tok, size_t len);

/* The string of id `id` as tokenizer.json spells it (an added token's content, else its
 * vocabulary entry): *len bytes, not NUL-terminated, owned by t; NULL when no token has it. */
const char *tokenizer_token_str(const struct tokenizer *t, int32_t id, size_t *len);

/* The (string, id) entries of the vocabulary with the added tokens, as Hugging Face's
 * Tokenizer.get_vocab(with_added_tokens=True) holds them: entries [0, n) of
 * tokenizer_vocab_entries are the model's vocabulary, then the added tokens (an added token
 * that is also a vocabulary entry comes twice, with the same id). Entry k's string
 * (*len bytes, not NUL-terminated, owned by t) is returned and its id put in *id. */
size_t tokenizer_vocab_entries(const struct tokenizer *t);
const char *tokenizer_vocab_entry(const struct tokenizer *t, size_t k, size_t *len, int32_t *id);

void tokenizer_free(struct tokenizer *t);
void tok_encoding_free(struct tok_encoding *e);

#endif
