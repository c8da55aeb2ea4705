/* weights.h: the HDF5 weights file (doc/format.md): every tensor of the parameter
 * table at its global shape under /params/<Hugging Face name>, the model card in
 * /config, written and read collectively by hyperslab so that any tensor-parallel
 * layout shares one file. */
#ifndef KD_WEIGHTS_H
#define KD_WEIGHTS_H

#include <hdf5.h>
#include <mpi.h>
#include <stddef.h>

#include "config.h"
#include "model.h"

#define WEIGHTS_FORMAT "kdtrain"
#define WEIGHTS_VERSION_MAJOR 1
#define WEIGHTS_VERSION_MINOR 2 /* 1.2: every attribute and dataset inside a checksum */

/* Write `buf` (parameter-sized, indexed by each entry's offset: mdl->master or mdl->w)
 * to a new file `path`. Collective over `comm`; every rank has the same table apart
 * from split_off/split_len. Ranks holding identical slices of a split tensor write it
 * once (the lowest rank); replicated tensors are written by the one rank passing
 * write_replicated = 1. `namelist_text` (rank 0's value; may be NULL) is stored as
 * /config/namelist. The file is written as `path`.tmp and renamed to `path` once every
 * rank agrees that it is complete; on failure the .tmp is removed and a previous `path`
 * stays. Returns 0 or KD_EXIT_IO with a message in `err`; every rank returns the same
 * status and message; after a failure the caller must end the process (kd_exit_agreed). */
int weights_save(const char *path, const struct kd_model *mdl, const float *buf,
                 const char *namelist_text, int write_replicated, MPI_Comm comm, char *err,
                 size_t errlen);

/* Read this rank's slice of every table entry from `path` into `buf`, after checking
 * the format, its version, the model card and every shape, and verifying every
 * tensor's checksum. buf NULL: into a MODEL_FROZEN16 model's packed storage, each
 * tensor rounded to BF16 on the host as it arrives. Collective over `comm`. Returns 0,
 * KD_EXIT_INPUT (missing, foreign, damaged or mismatching file) or KD_EXIT_IO, the same on every
 * rank, with the message in `err`. */
int weights_load(const char *path, const struct kd_model *mdl, float *buf, MPI_Comm comm, char *err,
                 size_t errlen);

/* A weights file open for collective writing (weights_create) or reading (weights_open):
 * a checkpoint adds parameter-sized groups (/optim/...) and its own datasets through it. */
struct weights_io {
  hid_t file;
  const struct kd_model *mdl;
  const char *path;
  MPI_Comm comm;
  int rank;
  int *own;          /* own[p]: this rank writes / checksums its slice of entry p */
  int nshare;        /* ranks holding the same slices share the work (weights_plan.c): */
  MPI_Comm *share;   /* one communicator per distinct holder set (MPI_COMM_NULL: not in it) */
  int *via, *gown;   /* via[p]: entry p's share[] (-1: not shared); gown[p]: its part counts */
  int writing;       /* created by weights_create: a failed write abandons the file */
  int all_sums;      /* opened file of format >= 1.2: every checksum attribute is required */
  H5E_auto2_t efunc; /* HDF5 error printing, off while the handle is open */
  void *edata;
};

/* Create `path` with the root attributes and /config (weights_save's first half).
 * Collective; every rank returns the same status. Call weights_close in every case. */
int weights_create(struct weights_io *io, const char *path, const struct kd_model *mdl,
                   const char *namelist_text, int write_replicated, MPI_Comm comm, char *err,
                   size_t errlen);
/* Write the parameter-sized `buf` as /<group>/<name> for every table entry (intermediate
 * groups created), each dataset with its checksum. Collective. */
int weights_write_group(struct weights_io *io, const char *group, const float *buf, char *err,
                        size_t errlen);
/* Streaming one tensor at a time (kdconvert): write entry `p` of the table as
 * /<group>/<name> with its checksum, from `x` in host memory holding this rank's slice
 * (params[p].numel floats); /<group> is created on first use. The datasets come out as
 * weights_write_group writes them. Collective; 0 or KD_EXIT_IO. */
int weights_write_tensor(struct weights_io *io, const char *group, int p, const float *x, char *err,
                         size_t errlen);
/* Read this rank's slice of entry `p` from /<group>/<name> into host memory `x`
 * (params[p].numel floats), checking shape and checksum. Collective; 0 or KD_EXIT_INPUT /
 * KD_EXIT_IO. */
int weights_read_tensor(struct weights_io *io, const char *group, int p, float *x, char *err,
                        size_t errlen);
/* Open `path` and check format, version and model card (weights_load's first half).
 * Collective. Call weights_close in every case. */
int weights_open(struct weights_io *io, const char *path, const struct kd_model *mdl, MPI_Comm comm,
                 char *err, size_t errlen);
/* Read this rank's slices of /<group>/<name> into the parameter-sized `buf` (NULL: the
 * packed storage of a MODEL_FROZEN16 model), checking shapes and checksums. Collective. 0 or
 * KD_EXIT_INPUT / KD_EXIT_IO. */
int weights_read_group(struct weights_io *io, const char *group, float *buf, char *err,
                       size_t errlen);
/* Close the file; returns `st`, or KD_EXIT_IO when st == 0 and closing failed. Collective.
 * A file being written with st != 0 (an agreed failure) is not closed but abandoned: parallel
 * HDF5 would flush it collectively and can hang when a rank's writes fail; the caller then
 * removes the file and ends the process (kd_exit_agreed). */
int weights_close(struct weights_io *io, int st, char *err, size_t errlen);
/* Read the model card stored in a weights file (/config attributes) into `card`
 * (card->path is set to `path`). Not collective. 0 or KD_EXIT_INPUT. */
int weights_read_card(const char *path, struct kd_card *card, char *err, size_t errlen);
/* weights_read_card, and the run's namelist stored in the file (/config/namelist: a
 * checkpoint's or final.h5's configuration) into *namelist, which the caller frees (NULL when
 * the file has none). Not collective. 0 or KD_EXIT_INPUT. */
int weights_read_config(const char *path, struct kd_card *card, char **namelist, char *err,
                        size_t errlen);

/* Rank 0 after a complete write: fsync `tmp`, rename it to `path`, fsync the directory.
 * 0, or KD_EXIT_IO with a message (the .tmp removed). Not collective. */
int weights_publish(const char *tmp, const char *path, char *err, size_t errlen);

/* Largest transfer per H5Dread/H5Dwrite call in bytes (default 1 GiB, below MPI-IO's
 * 2 GiB limit); tests lower it to exercise the split transfers. */
void weights_set_piece_bytes(size_t bytes);

#endif
