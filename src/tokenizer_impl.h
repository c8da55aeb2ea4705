/* tokenizer_impl.h: what the files of the C tokenizer share (tokenizer.c: loading, added
 * tokens' ids and tries; tokenizer_encode.c: the encoding pipeline, post-processing,
 * decoding; tokenizer_norm.c: normalized text, the normalizers; tokenizer_pre.c: the
 * pre-tokenizers; tokenizer_bpe.c: the BPE model; tokenizer_decode.c: the decoders). Not for
 * other modules. Names follow Hugging Face `tokenizers`, whose
 * behaviour each piece reproduces (the Rust file it follows is named beside it). */
#ifndef KD_TOKENIZER_IMPL_H
#define KD_TOKENIZER_IMPL_H

#include "tokenizer.h"

#include <stddef.h>
#include <stdint.h>

/* --- text with alignments (tokenizer/normalizer.rs, NormalizedString) ---------------- */

/* The original bytes [s, e) a byte of normalized text comes from (absolute offsets). */
struct tok_align {
  uint32_t s, e;
};

/* Normalized text: n bytes, each with its alignment. */
struct tok_nstr {
  char *b;
  struct tok_align *a;
  size_t n, cap;
};

int tok_nstr_reserve(struct tok_nstr *x, size_t n);
/* Append n bytes all aligned to `al`. 0 or -1 (memory). */
int tok_nstr_put(struct tok_nstr *x, const char *b, size_t n, struct tok_align al);
/* Append bytes [off, off + n) of y with their alignments. */
int tok_nstr_copy(struct tok_nstr *x, const struct tok_nstr *y, size_t off, size_t n);
void tok_nstr_free(struct tok_nstr *x);

/* y = x with every non-overlapping occurrence of pat (leftmost first) replaced by content,
 * each of whose bytes takes the alignment of the occurrence's last byte (normalizer.rs
 * replace). 0 or -1 (memory). */
int tok_replace(struct tok_nstr *y, const struct tok_nstr *x, const char *pat, size_t npat,
                const char *content, size_t ncontent);
/* y = s then x (not empty): s's first character takes the alignment of x's first byte, the
 * rest of s and x's first character that of x's first character's last byte (normalizer.rs
 * prepend). 0 or -1 (memory). */
int tok_prepend(struct tok_nstr *y, const struct tok_nstr *x, const char *s, size_t ns);

/* UTF-8 of code point cp into out (4 bytes room); its length. */
int tok_utf8_put(uint32_t cp, char *out);
/* The code point at s[i] of valid UTF-8 (n bytes) into *cp; its length in bytes. */
int tok_utf8_get(const char *s, size_t n, size_t i, uint32_t *cp);
/* The length of the well-formed character at s[i] (n bytes), or 0 when it is not; *sub
 * receives the length of its maximal invalid subpart then (at least 1). */
int tok_utf8_valid_at(const unsigned char *s, size_t n, size_t i, int *sub);

/* --- components read from tokenizer.json -------------------------------------------- */

enum tok_norm_kind { TOK_NORM_NFC, TOK_NORM_REPLACE, TOK_NORM_PREPEND };
struct tok_norm {
  int kind;
  char *pat, *content; /* Replace: a string and its replacement; Prepend: content */
  size_t npat, ncontent;
};

enum tok_pre_kind { TOK_PRE_SPLIT, TOK_PRE_METASPACE, TOK_PRE_BYTELEVEL };
enum tok_expr { TOK_EXPR_STRING, TOK_EXPR_GPT2, TOK_EXPR_QWEN2, TOK_EXPR_LLAMA3 };
enum tok_behavior {
  TOK_SPLIT_REMOVED,
  TOK_SPLIT_ISOLATED,
  TOK_SPLIT_MERGED_PREV,
  TOK_SPLIT_MERGED_NEXT,
  TOK_SPLIT_CONTIGUOUS
};
enum tok_prepend { TOK_PREPEND_NEVER, TOK_PREPEND_FIRST, TOK_PREPEND_ALWAYS };
struct tok_pre {
  int kind;
  /* Split: a string, or one of the known expressions */
  int expr, behavior, invert;
  char *pat;
  size_t npat;
  /* Metaspace */
  char rep[4];
  int nrep, prepend, split;
  /* ByteLevel */
  int add_prefix_space, use_regex;
};

enum tok_dec_kind {
  TOK_DEC_BYTELEVEL,
  TOK_DEC_METASPACE,
  TOK_DEC_REPLACE,
  TOK_DEC_BYTEFALLBACK,
  TOK_DEC_FUSE,
  TOK_DEC_STRIP
};
struct tok_dec {
  int kind;
  char *pat, *content; /* Replace */
  size_t npat, ncontent;
  char rep[4]; /* Metaspace: the replacement; Strip: the character */
  int nrep, prepend;
  size_t start, stop; /* Strip */
};

enum tok_post_kind { TOK_POST_BYTELEVEL, TOK_POST_TEMPLATE };
struct tok_post {
  int kind;
  int trim, add_prefix_space; /* ByteLevel */
  /* TemplateProcessing's single: n items, ids[i] >= 0 a special token's id (its string
   * lead/trail whitespace counts beside), -1 the sequence */
  int32_t *ids;
  int *lead, *trail;
  int n;
};

/* An added token (tokenizer/added_vocabulary.rs). */
struct tok_added {
  int32_t id;
  char *content; /* as tokenizer.json spells it */
  size_t len;
  char *form; /* what is matched and decoded: the content, normalized when normalized */
  size_t nform;
  int special, lstrip, rstrip, normalized;
};

/* A byte trie of added tokens: leftmost-longest matching (the Aho-Corasick of HF). */
struct tok_trie;
/* The leftmost-longest match in s[from, n): 1 with [*ms, *me) and the index of its token in
 * t->added, or 0. */
int tok_trie_find(const struct tok_trie *tr, const char *s, size_t n, size_t from, size_t *ms,
                  size_t *me, int32_t *tok);

/* --- the BPE model (models/bpe/model.rs, word.rs) ----------------------------------- */

struct tok_bpe;
/* The model from tokenizer.json's "model" (a cJSON object). NULL with err. */
struct tok_bpe *tok_bpe_load(const void *model_json, char *err, size_t errlen);
void tok_bpe_free(struct tok_bpe *m);
/* Vocabulary size (entries) and the largest id, -1 when empty. */
size_t tok_bpe_size(const struct tok_bpe *m);
int32_t tok_bpe_max_id(const struct tok_bpe *m);
int32_t tok_bpe_id(const struct tok_bpe *m, const char *s, size_t n);
/* The string of id (NULL when the vocabulary has none) and its length. */
const char *tok_bpe_str(const struct tok_bpe *m, int32_t id, size_t *n);
/* Vocabulary entry k (k < tok_bpe_size): its string (*n bytes) and its id in *id. */
const char *tok_bpe_entry(const struct tok_bpe *m, size_t k, size_t *n, int32_t *id);

/* A token of a word: its id and its bytes [s, e) in the word. */
struct tok_piece {
  int32_t id;
  uint32_t s, e;
};
/* The tokens of a word (n bytes of valid UTF-8): appended to *out (count *nout, capacity
 * *cap, grown). 0 or -1 (memory). */
int tok_bpe_word(struct tok_bpe *m, const char *w, size_t n, struct tok_piece **out, size_t *nout,
                 size_t *cap);

/* --- the tokenizer ------------------------------------------------------------------ */

struct tokenizer {
  struct tok_bpe *bpe;
  struct tok_added *added; /* sorted by id */
  int nadded;
  struct tok_trie *trie_raw, *trie_norm; /* not normalized / normalized added tokens */
  int32_t max_id;
  struct tok_norm *norm;
  int nnorm;
  struct tok_pre *pre;
  int npre;
  int bytelevel; /* the last pre-tokenizer is ByteLevel: words reach the model byte-mapped */
  uint16_t bytechar[256]; /* GPT-2's character of each byte (bytes_to_unicode) */
  int16_t charbyte[512];  /* and back: the byte of a character below 512, or -1 */
  struct tok_post *post;
  int npost;
  int trim; /* a ByteLevel post-processor trims offsets */
  struct tok_dec *dec;
  int ndec, has_decoder;
  /* scratch of encode */
  struct tok_nstr s0, piece, w1, w2, work;
  struct tok_split *splits;
  size_t nsplits, capsplits;
  struct tok_piece *pieces;
  size_t npieces, cappieces;
  int *lead, *trail; /* per output token, when trimming */
  size_t capws;
  char *word;
  uint32_t *wpos; /* the byte of t->work each byte of a byte-mapped word comes from */
  size_t capword;
  unsigned char *cstart; /* the characters' starts in the text, when trimming */
  size_t capcstart;
};

/* Normalize x (the normalizers in order) into the buffers of t; the result is *res (one of
 * t's buffers or x itself). 0 or -1 (memory). */
int tok_normalize(struct tokenizer *t, struct tok_nstr *x, struct tok_nstr **res);
/* Normalize a string (an added token's content) into a malloc'ed copy. NULL on memory. */
char *tok_normalize_str(struct tokenizer *t, const char *s, size_t n, size_t *nout);

/* A split of the pre-tokenized text: bytes [off, off + n) of t->work. */
struct tok_split {
  size_t off, n;
};
/* Pre-tokenize bytes [off, off + n) of t->work (appending what the pre-tokenizers change to
 * it) into splits *out (count *nout, capacity *cap). 0 or -1 (memory). */
int tok_pretokenize(struct tokenizer *t, size_t off, size_t n, struct tok_split **out, size_t *nout,
                    size_t *cap);

/* The bytes of a token string after the decoders (a list of n strings in, one joined
 * string out, malloc'ed). */
char *tok_decode_strings(const struct tokenizer *t, char **s, size_t *len, size_t n,
                         size_t *outlen);

#endif
