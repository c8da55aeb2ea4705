/* weights_impl.h: what the files of the weights module share (not for other modules):
 * weights.c opens, creates, validates and closes a file; weights_card.c writes and checks
 * /config and the root attributes; weights_plan.c decides which rank writes and checksums
 * which rows; weights_tensor.c moves the tensors. */
#ifndef KD_WEIGHTS_IMPL_H
#define KD_WEIGHTS_IMPL_H

#include <hdf5.h>
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "weights.h"

/* --- weights_card.c: the root attributes and /config ------------------------------------ */

/* Write format, format_version and (format 1.2) the root's bound checksum on `file`.
 * Collective metadata. 0 or KD_EXIT_IO. */
int weights_card_write_root(hid_t file);
/* Check the root attributes of an open file: format, format_version (a newer major is
 * refused) and the root's bound checksum (required from format 1.2, checked wherever it
 * is present). *minor: the file's minor version. 0 or KD_EXIT_INPUT with the message. */
int weights_card_check_root(hid_t file, const char *path, int *minor, char *err, size_t errlen);
/* Write the card keys, the card text, /config's bound checksum and, when `namelist` is not
 * NULL, the dataset /config/namelist with its own (collective; every rank passes the same
 * values). 0 or -1. */
int weights_card_write(hid_t cfg, const struct kd_card *card, const char *namelist, int rank,
                       MPI_Comm comm);
/* Read the card keys of group `cfg` into `card` and verify /config's checksums (keys, card
 * text) and /config/namelist (a scalar string dataset), each checksum required when the
 * file carries all (format 1.2), checked when present; the namelist's text into *namelist
 * when it is not NULL (the caller frees it; NULL when the file has none): 0 or
 * KD_EXIT_INPUT. */
int weights_card_read(hid_t cfg, const char *path, struct kd_card *card, char **namelist, char *err,
                      size_t errlen);
/* Refuse a file whose card differs from the model's in any key that changes the
 * computation (every key but the name), naming the key and both values. */
int weights_card_compare(const struct kd_card *file, const struct kd_card *model, const char *path,
                         char *err, size_t errlen);

/* --- weights_plan.c: who writes, reads and checksums what ------------------------------- */

/* This rank's part of a tensor as a (rows, cols) block at (row0, col0) of the global
 * (grows, gcols) matrix; a 1-D tensor is a column (n, 1). */
struct block {
  int64_t rows, cols, row0, col0, gcols, grows;
};

/* This rank's slice of entry p as a block (rows 0 when another pipeline stage holds it). */
struct block weights_plan_block(const struct kd_param *p);
/* Decide io->own (doc/checkpoint.md, "Throughput") and the groups of ranks holding the same
 * slices (io->share, io->via, io->gown). Collective over io->comm; every rank returns the
 * same status. `rep_owner`: this rank may write replicated tensors. */
int weights_plan(struct weights_io *io, int rep_owner, char *err, size_t errlen);
/* This rank's part of entry p: its rows of the slice's block; *first: the part's first
 * element in the block; *counted: whether it is written and checksummed. */
struct block weights_plan_part(const struct weights_io *io, int p, int64_t *first, int *counted);
/* Free the communicators and tables of weights_plan. */
void weights_plan_free(struct weights_io *io);

#endif
