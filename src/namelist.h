/* namelist.h: a table-driven Fortran namelist reader and writer. A table of
 * struct namelist_key describes the groups and keys of a C struct (type, field,
 * default, bounds, allowed words); the reader parses `&group key = value, ... /`
 * text (comments, quoted strings, logicals, Fortran reals, r* repeat counts, &end)
 * and command-line `group%key=value` words into that struct, validating each value
 * against its key and writing one "file:line: &group key: message" on bad input.
 * Cross-key checks and what the keys mean belong to the caller (config.c). */
#ifndef KD_NAMELIST_H
#define KD_NAMELIST_H

#include <stddef.h>
#include <stdio.h>

#define NAMELIST_STR_MAX 512  /* longest string field a table may describe (with its NUL) */
#define NAMELIST_MAXKEYS 96   /* most keys in one table */
#define NAMELIST_MAXLIST 1024 /* most values of a list key */

/* NL_INT: int or int64_t by field size. NL_WORD: one word of `choices` (quoted as a string in
 * the file), stored as its index in that list in an int (enum) field: the enums of words.h. */
enum namelist_type { NL_STR, NL_INT, NL_REAL, NL_BOOL, NL_WORD };
#define NL_TEXT(t) ((t) == NL_STR || (t) == NL_WORD) /* written as a quoted string */
enum {
  NL_GE = 1,
  NL_GT = 2,
  NL_LE = 4,
  NL_LT = 8,    /* bounds lo <=/< value <=/< hi */
  NL_PATH = 16, /* a file path (resolved against the cwd); `choices` are words kept as is */
  NL_REQ = 32   /* required: no default */
};

/* One key of a table. The keys of a group are adjacent; the table order is the printing order. */
struct namelist_key {
  const char *group, *key;
  enum namelist_type type;
  size_t off, size; /* field in the struct the table describes */
  const char *def;  /* default in namelist syntax; NULL: none */
  unsigned flags;
  double lo, hi;
  const char *choices; /* "a|b|c": allowed words (NL_PATH: words that are not paths) */
  size_t maxn;         /* list keys: the field is an array of maxn elements of `size` bytes */
  size_t count_off;    /* list keys: offset of the int that receives the number of values */
};

/* A table entry for field `f` of `struct st` as key `k` of group `g`. */
#define NAMELIST_KEY(st, g, k, t, f, d, fl, lo, hi, ch)                                            \
  { #g, #k, t, offsetof(struct st, f), sizeof(((struct st *)0)->f), d, fl, lo, hi, ch, 0, 0 }

/* A list key (`key = v1, v2, ...`, at most N values) for array field `f[N]` of `struct st`,
 * with the number of values given stored in the int field `nf`. */
/* clang-format off */
#define NAMELIST_LIST(st, g, k, t, f, nf, d, fl, lo, hi, ch)                                       \
  { #g,                                                                                          \
    #k,                                                                                          \
    t,                                                                                           \
    offsetof(struct st, f),                                                                      \
    sizeof(((struct st *)0)->f[0]),                                                              \
    d,                                                                                           \
    fl,                                                                                          \
    lo,                                                                                          \
    hi,                                                                                          \
    ch,                                                                                          \
    sizeof(((struct st *)0)->f) / sizeof(((struct st *)0)->f[0]),                                \
    offsetof(struct st, nf) }
/* clang-format on */

/* Reading state: the caller fills keys, n, base, file, err, errlen (the rest zero) and
 * may then read line/setby/gline to say where a key came from. */
struct namelist_ctx {
  const struct namelist_key *keys;
  size_t n;                            /* keys in the table, at most NAMELIST_MAXKEYS */
  void *base;                          /* struct the table describes */
  const char *file;                    /* source named in messages */
  const char *word;                    /* override being applied (messages say "command line") */
  int line[NAMELIST_MAXKEYS];          /* where each key was set in the file (0: not) */
  const char *setby[NAMELIST_MAXKEYS]; /* ... or the override word that set it */
  int gline[NAMELIST_MAXKEYS];         /* line of '&group', at the group's first key */
  char *err;                           /* the message of the first error ("" while none) */
  size_t errlen;
};

/* Zero the `size` bytes at `base` and set every key of the table that has a default. */
void namelist_defaults(const struct namelist_key *keys, size_t n, void *base, size_t size);

/* Parse the namelist file `path` into c->base: each group at most once, each key at most
 * once, unknown groups and keys are errors. 0 or KD_EXIT_INPUT with the message in c->err. */
int namelist_read_file(struct namelist_ctx *c, const char *path);

/* Parse a whole namelist text (NUL-terminated; c->file names it in messages) as
 * namelist_read_file parses a file. 0 or KD_EXIT_INPUT with the message in c->err. */
int namelist_read_text(struct namelist_ctx *c, const char *text);

/* Apply one command-line word `group%key=value` (strings may be unquoted). 0 or
 * KD_EXIT_INPUT; `word` must outlive c (c->setby keeps it). */
int namelist_override(struct namelist_ctx *c, const char *word);

/* Index of key `k` of group `g` (case-insensitive), -1 if the table has none. */
long namelist_find_key(const struct namelist_ctx *c, const char *g, const char *k);

/* Write "WHERE: &group key: message" into c->err (group, key may be NULL; line 0: no
 * line); only the first error is kept. Returns KD_EXIT_INPUT. */
int namelist_err(struct namelist_ctx *c, int line, const char *group, const char *key,
                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Error about key i, reported where it was set, else where key `alt` (-1: none) was set,
 * else at its group's line, else at the file. Returns KD_EXIT_INPUT. */
int namelist_key_err(struct namelist_ctx *c, size_t i, long alt, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* "; did you mean 'PREx'?" for the word of the '|' list `list` closest to `word`, or ""
 * when none is close. */
void namelist_suggest(char *out, size_t outlen, const char *word, const char *list,
                      const char *pre);

/* What a value of type t looks like, for messages ("an integer", ...). */
const char *namelist_type_words(enum namelist_type t);

/* Check the values of an already filled struct against the table (bounds, finiteness, allowed
 * words), as the reader would have: -1 when all hold, else the index of the first key that
 * does not, with "VALUE: expected ..." in `why`. For structs not read from a namelist (a
 * model card stored in a weights file). */
long namelist_check_values(const struct namelist_key *keys, size_t n, const void *base, char *why,
                           size_t whylen);

/* Element e of key i's field in the struct at base (e = 0 for scalar keys). */
char *namelist_field(const struct namelist_key *k, void *base, size_t e);

/* Number of values of key k in the struct at base (1 for scalar keys). */
size_t namelist_count(const struct namelist_key *k, const void *base);

/* Key k's value(s) in the struct at base as namelist_print writes them ("'fkl'", "1.0, 2.0"),
 * cut to n - 1 characters. */
void namelist_value_text(const struct namelist_key *k, const void *base, char *out, size_t n);

/* Print the table's struct at `base` as namelist groups that read back to the same values. */
void namelist_print(FILE *f, const struct namelist_key *keys, size_t n, const void *base);

#endif
