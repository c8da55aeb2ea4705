/* data_source.h: one token file of any supported format behind one small interface.
 * Everything above (windows, blends, the sampler in data.c) only calls data_source_open,
 * data_source_tokens, data_source_mask and data_source_close, and never knows the format;
 * the readers behind it and the struct they fill: data_reader.h. Byte layouts:
 * doc/format.md, section "Token data". Hosts are little-endian. */
#ifndef KD_DATA_SOURCE_H
#define KD_DATA_SOURCE_H

#include <stddef.h>

#include "data_reader.h"
#include "words.h"

/* Open `path` in `format` ('auto': data_format_detect) and check every token: an id outside [0,
 * vocab_size) (or not an integer) is KD_EXIT_INPUT with file and position in err; so are missing,
 * truncated or foreign files (a message naming the file and what is wrong). Not collective. */
int data_source_open(struct data_source *s, const char *path, enum kd_data_format format,
                     int vocab_size, char *err, size_t errlen);

/* The format of the file at `path` (data%format = 'auto'): 'megatron' (PATH, PATH.bin or
 * PATH.idx beside an index with Megatron's MMIDIDX magic), 'llmc' (an llm.c header's
 * magic), 'rollouts' (HDF5 with the rollouts format attribute), 'h5' (any other HDF5 file).
 * A raw stream is never guessed: KD_EXIT_INPUT with a message asking for data%format =
 * 'bytes', 'u16' or 'u32'. Not collective. */
int data_format_detect(const char *path, enum kd_data_format *format, char *err, size_t errlen);

/* Release everything a reader mapped or allocated. */
void data_source_close(struct data_source *s);

/* out[i] := token k0 + i for i < n (k0 + n <= ntok). */
void data_source_tokens(const struct data_source *s, size_t k0, size_t n, int *out);

/* out[i] := 1 if token k0 + i counts in the loss, else 0 (all 1 without a mask). */
void data_source_mask(const struct data_source *s, size_t k0, size_t n, unsigned char *out);

#endif
