/* tokfiles.h: a model's tokenizer files inside its HDF5 weights file (doc/format.md):
 * group /tokenizer, one 1-D uint8 dataset per file, named by the file's base name
 * (/tokenizer/tokenizer.json), holding the file's exact bytes. kdconvert from-hf stores
 * them, checkpoints carry them, kdconvert to-hf writes them back out. */
#ifndef KD_TOKFILES_H
#define KD_TOKFILES_H

#include <hdf5.h>
#include <mpi.h>
#include <stddef.h>

#define TOKFILES_GROUP "tokenizer"

/* The file names kept, in storing order (those present in a directory are stored). */
extern const char *const tokfiles_names[];
extern const int tokfiles_nnames;

/* Store the tokenizer files present in directory `dir` as /tokenizer of `file` (open for
 * writing, collectively over `comm` when it uses MPI-IO): rank 0 reads them, every rank
 * creates the datasets, rank 0 writes the bytes. No file present: no group. *nfiles (may
 * be NULL) receives the count. Collective; 0, KD_EXIT_INPUT (unreadable or oversized
 * file, named) or KD_EXIT_IO, the same on every rank. */
int tokfiles_write_dir(hid_t file, const char *dir, MPI_Comm comm, int *nfiles, char *err,
                       size_t errlen);

/* Copy /tokenizer of the weights file `src_path` (not open elsewhere in this process) into
 * `dst` (open for writing over `comm`): rank 0 reads, broadcasts, every rank creates the
 * datasets. A source without the group copies nothing. Collective; 0, KD_EXIT_INPUT or
 * KD_EXIT_IO, the same on every rank. */
int tokfiles_copy(const char *src_path, hid_t dst, MPI_Comm comm, int *nfiles, char *err,
                  size_t errlen);

/* Write the files stored in `path` into directory `dir` (which must exist). Not
 * collective. 0, KD_EXIT_INPUT (unreadable weights file) or KD_EXIT_IO. */
int tokfiles_extract(const char *path, const char *dir, int *nfiles, char *err, size_t errlen);

/* Compare the tokenizers of two weights files by the files that define the token ids
 * (tokenizer.json, vocab.json, merges.txt, tokenizer.model, added_tokens.json): *equal = 1
 * when each is absent from both or byte-identical in both (two files without tokenizer
 * count as equal), else 0 and `which` names the first that differs. Not collective. 0 or
 * KD_EXIT_INPUT. */
int tokfiles_equal(const char *path_a, const char *path_b, int *equal, char *which, size_t whichlen,
                   char *err, size_t errlen);

/* A tokenizer held in memory by a run (every rank holds the same bytes). */
struct tokset;

/* Read /tokenizer of the weights file `path` on rank 0 and give every rank of `comm` a copy
 * in *out (NULL when the file has none). Collective; 0 or KD_EXIT_INPUT, the same on every
 * rank. */
int tokfiles_load(const char *path, MPI_Comm comm, struct tokset **out, char *err, size_t errlen);

/* tokfiles_load in one process, without MPI (--dry-run): *out is NULL when the file has no
 * tokenizer. Not collective; 0 or KD_EXIT_INPUT. */
int tokfiles_read(const char *path, struct tokset **out, char *err, size_t errlen);

/* Write a held tokenizer as /tokenizer of `dst` (open for writing over `comm`); NULL writes
 * nothing. Collective (every rank passes the same set or NULL); 0 or KD_EXIT_IO. */
int tokfiles_put(const struct tokset *t, hid_t dst, MPI_Comm comm, char *err, size_t errlen);

void tokfiles_free(struct tokset *t);

/* The first file defining the token ids (as tokfiles_equal compares) in which two held
 * tokenizers differ, or NULL when they agree (NULL sets hold no files). Not collective. */
const char *tokfiles_differ(const struct tokset *a, const struct tokset *b);

/* The end-of-sequence ids a held tokenizer's files give (at most max into eos): the
 * generation_config.json eos_token_id (a number or a list), else tokenizer_config.json's
 * eos_token looked up in tokenizer.json; *from names the source (NULL when none). The count,
 * 0 when the files say nothing. Not collective. */
int tokfiles_eos(const struct tokset *t, int *eos, int max, const char **from);

/* The bytes of the file `name` (a name of tokfiles_names, "tokenizer.json") of a held
 * tokenizer, *len of them, owned by t (not NUL-terminated); NULL when t is NULL or does not
 * hold that file. For tokenizer_load (tokenizer.h) of a model's tokenizer. Not collective. */
const char *tokfiles_file(const struct tokset *t, const char *name, size_t *len);

/* The largest id tokenizer.json of a held tokenizer gives (its vocabulary and added tokens),
 * -1 when it has no readable tokenizer.json. Not collective. */
int tokfiles_max_id(const struct tokset *t);

/* Number of tokenizer files stored in the weights file `path` (0: none), or -1 with a
 * message when it cannot be read. Not collective. */
int tokfiles_count(const char *path, char *err, size_t errlen);

#endif
