/* h5attr.h: every HDF5 attribute kdtrain reads or writes (weights files, checkpoints, the
 * teacher cache, the tokenizer group) goes through this module. A getter checks the
 * attribute before reading anything: one value (a scalar dataspace, or a simple one of
 * one element), the expected type class, for an integer a value that fits, for a string
 * a length that fits the caller's buffer. A refusal names the file, the object and the
 * attribute ("w.h5: /config attribute 'vocab_size' is an array of 64 values, expected
 * one integer") and returns KD_EXIT_INPUT: no file can make a read overflow. */
#ifndef KD_H5ATTR_H
#define KD_H5ATTR_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

/* Longest string attribute read (the model card text, the longest kdtrain writes, is
 * about 1 KiB). */
#define H5ATTR_STR_MAX (64 * 1024)

/* 1 when object `obj` has attribute `name`, else 0 (an unreadable object counts as 0). */
int h5attr_exists(hid_t obj, const char *name);

/* Read one integer value (any stored integer size and sign that fits a long long).
 * 0 or KD_EXIT_INPUT (missing, an array, another class, out of range) with the message. */
int h5attr_get_int(hid_t obj, const char *name, long long *v, char *err, size_t errlen);
/* Read one unsigned 64-bit value (checksums); a negative stored value is refused. */
int h5attr_get_u64(hid_t obj, const char *name, uint64_t *v, char *err, size_t errlen);
/* Read one real value (a stored integer is converted). 0 or KD_EXIT_INPUT. */
int h5attr_get_double(hid_t obj, const char *name, double *v, char *err, size_t errlen);
/* Read one string into `out` when it fits (outlen - 1 bytes at most): fixed length
 * (NUL-padded, no NUL inside) or variable length (h5py's default for a Python str), ASCII
 * or UTF-8, the bytes as stored. 0 or KD_EXIT_INPUT. */
int h5attr_get_string(hid_t obj, const char *name, char *out, size_t outlen, char *err,
                      size_t errlen);
/* The same for the one string of dataset `d` (a scalar string dataset, e.g.
 * /config/namelist) of at most `max` bytes: a new NUL-terminated buffer in *text (free it).
 * 0, or KD_EXIT_INPUT with `why`, to follow the dataset's name ("is not a scalar string
 * dataset"). */
int h5attr_read_text(hid_t d, size_t max, char **text, char *why, size_t whylen);

/* Write (or replace) a scalar attribute: an integer as H5T_STD_I64LE, an unsigned 64-bit
 * value as H5T_STD_U64LE, a real as H5T_IEEE_F64LE, a string as a fixed-length
 * NUL-terminated string of strlen(s) + 1 bytes. In a file open over MPI-IO these are
 * collective metadata calls: every rank makes the same ones. 0 or KD_EXIT_IO. */
int h5attr_set_int(hid_t obj, const char *name, long long v);
int h5attr_set_u64(hid_t obj, const char *name, uint64_t v);
int h5attr_set_double(hid_t obj, const char *name, double v);
int h5attr_set_string(hid_t obj, const char *name, const char *s);
/* Write (or replace) a scalar attribute of file type `ftype` from `*v` of memory type
 * `mtype` (a file that keeps a narrower type, e.g. an int8 flag). 0 or KD_EXIT_IO. */
int h5attr_set_typed(hid_t obj, const char *name, hid_t ftype, hid_t mtype, const void *v);

/* "FILE: OBJECT attribute 'NAME'" for messages about an attribute whose value was read but
 * is wrong (FILE from H5Fget_name, OBJECT from H5Iget_name; placeholders when unknown). */
void h5attr_where(hid_t obj, const char *name, char *out, size_t outlen);

#endif
