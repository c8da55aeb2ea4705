/* convert.h: kdconvert's two directions (convert_hf.c), each streaming one tensor at a
 * time between safetensors and the HDF5 weights file. Single rank. */
#ifndef KD_CONVERT_H
#define KD_CONVERT_H

#include <stdint.h>

/* HF directory -> weights file `out` (written as out.tmp, renamed when complete) and the
 * card file `card_out`. Returns 0; bad input ends the program with KD_EXIT_INPUT before
 * anything is written, I/O failures with KD_EXIT_IO. */
int convert_from_hf(const char *dir, const char *out, const char *card_out);

/* Weights file or checkpoint `in` -> HF directory `dir` (created if needed), safetensors
 * shards of at most `max_shard` bytes (a larger tensor gets a shard of its own). */
int convert_to_hf(const char *in, const char *dir, int64_t max_shard);

/* "2GB", "500MB", "1GiB", "12345": bytes, or -1 when unreadable. */
int64_t convert_parse_size(const char *s);

#endif
