/* checksum.h: the checksums of kdtrain's HDF5 files (doc/format.md, "Checksums"): the
 * index-mixed sum over float32 tensors (checksum_idxmix64), the same over the bytes of a
 * text or byte dataset, and the binding term that ties a checksum to an object's path,
 * type and shape (checksum_bound64). */
#ifndef KD_CHECKSUM_H
#define KD_CHECKSUM_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

/* The attribute names: the bound checksum (every dataset, /config, /state, the root from
 * format 1.2) and the plain one (tensors and /state). */
#define CHECKSUM_BOUND "checksum_bound64"
#define CHECKSUM_IDXMIX "checksum_idxmix64"
/* /config's bound checksum of its card text (format 1.2). */
#define CHECKSUM_CARD "checksum_card_bound64"

/* From format 1.MINOR on, every attribute and dataset of a file is inside a checksum and
 * every checksum attribute is required (format 1.1 files lack the root's, /config's card
 * text's, /config/namelist's and /tokenizer's). A minor version only adds checksums: an
 * older reader ignores them. */
#define CHECKSUM_ALL_SINCE_MINOR 2

/* The mixing function of doc/format.md: element `i` with bits `bits`. */
static inline uint64_t checksum_mix64(uint64_t i, uint32_t bits) {
  uint64_t z = (i * 0x9E3779B97F4A7C15ull) ^ (uint64_t)bits;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The per-tensor checksum over a part of a float32 tensor: the sum, mod 2^64, of
 * mix(i, bits(x)) over the elements; element (r, c) of the (rows, cols) block `x` has
 * global row-major index (row0 + r) * gcols + col0 + c. Partial sums of disjoint blocks
 * add up to the checksum of the whole tensor. */
uint64_t checksum_f32(const float *x, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                      int64_t gcols);

/* The same sum over `n` bytes taken as little-endian 32-bit words (the last one padded
 * with zero bytes), word k at index k. */
uint64_t checksum_bytes(const void *p, size_t n);

/* The binding term of the bound checksum: a hash of the object's path (e.g.
 * "/params/NAME"), its stored type tag ("f32") and its global shape. The bound checksum is
 * the data's checksum plus this term, so that an object moved to another name, reshaped
 * or retyped fails its check. */
uint64_t checksum_bind(const char *dpath, const char *dtype, int ndim, const int64_t *dims);

/* 1 when the kdtrain file `file` (open) must carry every checksum: its root attribute
 * format_version is 1.CHECKSUM_ALL_SINCE_MINOR or newer, or is missing or unreadable (the
 * format check refuses such a file anyway); 0 for a format 1.0 or 1.1 file. */
int checksum_required(hid_t file);

/* A stored checksum against the one computed: 0 when they agree, else KD_EXIT_INPUT with
 * "FILE: OBJECT fails its checksum (stored X, computed Y): HINT" in err. */
int checksum_verify(uint64_t stored, uint64_t computed, const char *file, const char *object,
                    const char *hint, char *err, size_t errlen);

#endif
