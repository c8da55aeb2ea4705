/* tokfiles.c: the /tokenizer group of a weights file (tokfiles.h, doc/format.md). A set of
 * files travels as one `struct tokset` in memory: read from a directory or a weights file
 * on rank 0, broadcast, written collectively, or written out to a directory. */
#include "tokfiles.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "agree.h"
#include "checksum.h"
#include <cjson/cJSON.h>

#include "h5attr.h"
#include "util.h"
#include "util_mpi.h"

const char *const tokfiles_names[] = {"tokenizer.json",
                                      "tokenizer_config.json",
                                      "special_tokens_map.json",
                                      "generation_config.json",
                                      "chat_template.jinja",
                                      "chat_template.json",
                                      "vocab.json",
                                      "merges.txt",
                                      "tokenizer.model",
                                      "added_tokens.json"};
#define NNAMES ((int)(sizeof tokfiles_names / sizeof tokfiles_names[0]))
const int tokfiles_nnames = NNAMES;

/* The files that define the token ids (what tokfiles_equal compares). */
static int defines_ids(const char *name) {
  return !strcmp(name, "tokenizer.json") || !strcmp(name, "vocab.json") ||
         !strcmp(name, "merges.txt") || !strcmp(name, "tokenizer.model") ||
         !strcmp(name, "added_tokens.json");
}

/* Largest file kept: one MPI-IO transfer, far above any tokenizer. */
#define TOKFILE_MAX ((size_t)1 << 30)

/* A set of files: present[i] says whether tokfiles_names[i] is there. */
struct tokset {
  int present[NNAMES];
  unsigned char *data[NNAMES];
  size_t len[NNAMES];
};

static int tokset_count(const struct tokset *t) {
  int n = 0;
  for (int i = 0; i < NNAMES; i++)
    n += t->present[i];
  return n;
}

static void tokset_free(struct tokset *t) {
  for (int i = 0; i < NNAMES; i++)
    free(t->data[i]);
  memset(t, 0, sizeof *t);
}

/* Read the files of `dir` that exist (each must be a regular file). 0 or KD_EXIT_INPUT. */
static int read_dir(struct tokset *t, const char *dir, char *err, size_t errlen) {
  memset(t, 0, sizeof *t);
  for (int i = 0; i < NNAMES; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, tokfiles_names[i]);
    struct stat sb;
    if (stat(path, &sb) != 0) continue;
    if (!S_ISREG(sb.st_mode)) { /* a FIFO would block the read, a device never end */
      kd_seterr(err, errlen, "%s is not a regular file (%s); expected a tokenizer file", path,
                kd_file_kind(sb.st_mode));
      return KD_EXIT_INPUT;
    }
    if ((size_t)sb.st_size > TOKFILE_MAX) {
      kd_seterr(err, errlen, "%s: %lld bytes; tokenizer files above %zu bytes are not kept", path,
                (long long)sb.st_size, TOKFILE_MAX);
      return KD_EXIT_INPUT;
    }
    FILE *f = fopen(path, "rb");
    size_t n = (size_t)sb.st_size;
    t->data[i] = kd_malloc(n + 1);
    int ok = f && fread(t->data[i], 1, n, f) == n && fgetc(f) == EOF;
    if (f) fclose(f);
    if (!ok) {
      kd_seterr(err, errlen, "%s: cannot read the tokenizer file (%s)", path,
                f ? "it changed while being read" : strerror(errno));
      return KD_EXIT_INPUT;
    }
    t->len[i] = n;
    t->present[i] = 1;
  }
  return 0;
}

/* The bound checksum of /tokenizer/<name> holding `n` bytes at `data`. */
static uint64_t file_sum(const char *name, const unsigned char *data, size_t n) {
  char dpath[256];
  snprintf(dpath, sizeof dpath, "/" TOKFILES_GROUP "/%s", name);
  const int64_t len = (int64_t)n;
  return checksum_bytes(data, n) + checksum_bind(dpath, "u8", 1, &len);
}

/* Verify the bound checksum of dataset `d` (tokfiles_names[i] of `t`): required when `all`
 * (a format 1.2 file), checked when present. 0 or KD_EXIT_INPUT. */
static int sum_check(hid_t d, const struct tokset *t, int i, int all, const char *path, char *err,
                     size_t errlen) {
  if (!all && !h5attr_exists(d, CHECKSUM_BOUND)) return 0;
  uint64_t stored = 0;
  char why[1200];
  if (h5attr_get_u64(d, CHECKSUM_BOUND, &stored, why, sizeof why) != 0) {
    kd_seterr(err, errlen, "%s: the file is damaged", why);
    return KD_EXIT_INPUT;
  }
  const uint64_t got = file_sum(tokfiles_names[i], t->data[i], t->len[i]);
  char object[128];
  snprintf(object, sizeof object, "/%s/%s", TOKFILES_GROUP, tokfiles_names[i]);
  return checksum_verify(stored, got, path, object, "the tokenizer file stored there was changed",
                         err, errlen);
}

/* Read /tokenizer of an open file (absent: an empty set), checking each file's checksum.
 * 0 or KD_EXIT_INPUT. */
static int read_h5(struct tokset *t, hid_t file, const char *path, char *err, size_t errlen) {
  memset(t, 0, sizeof *t);
  if (H5Lexists(file, TOKFILES_GROUP, H5P_DEFAULT) <= 0) return 0;
  hid_t g = H5Gopen2(file, TOKFILES_GROUP, H5P_DEFAULT);
  const int all = checksum_required(file);
  int st = g < 0 ? KD_EXIT_INPUT : 0;
  if (st) kd_seterr(err, errlen, "%s: /%s cannot be opened", path, TOKFILES_GROUP);
  for (int i = 0; i < NNAMES && !st; i++) {
    if (H5Lexists(g, tokfiles_names[i], H5P_DEFAULT) <= 0) continue;
    hid_t d = H5Dopen2(g, tokfiles_names[i], H5P_DEFAULT);
    hid_t s = d < 0 ? -1 : H5Dget_space(d), ty = d < 0 ? -1 : H5Dget_type(d);
    hsize_t n = 0;
    int ok = s >= 0 && ty >= 0 && H5Sget_simple_extent_ndims(s) == 1 &&
             H5Tget_class(ty) == H5T_INTEGER && H5Tget_size(ty) == 1 &&
             H5Sget_simple_extent_dims(s, &n, NULL) == 1 && n <= TOKFILE_MAX;
    if (ok) {
      t->data[i] = kd_malloc((size_t)n + 1);
      t->len[i] = (size_t)n;
      ok = n == 0 || H5Dread(d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, t->data[i]) >= 0;
      t->present[i] = ok;
    }
    if (!ok) {
      kd_seterr(err, errlen, "%s: /%s/%s is not a readable 1-D uint8 dataset", path, TOKFILES_GROUP,
                tokfiles_names[i]);
      st = KD_EXIT_INPUT;
    }
    if (!st) st = sum_check(d, t, i, all, path, err, errlen);
    if (ty >= 0) H5Tclose(ty);
    if (s >= 0) H5Sclose(s);
    if (d >= 0) H5Dclose(d);
  }
  if (g >= 0) H5Gclose(g);
  return st;
}

/* Read /tokenizer of the weights file `path`, opened serially. 0 or KD_EXIT_INPUT. */
static int read_path(struct tokset *t, const char *path, char *err, size_t errlen) {
  H5E_auto2_t efunc;
  void *edata;
  H5Eget_auto2(H5E_DEFAULT, &efunc, &edata);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  memset(t, 0, sizeof *t);
  hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  int st = 0;
  if (file < 0) {
    kd_seterr(err, errlen, "%s cannot be opened as HDF5 (expected a kdtrain weights file)", path);
    st = KD_EXIT_INPUT;
  }
  if (!st) st = read_h5(t, file, path, err, errlen);
  if (file >= 0) H5Fclose(file);
  H5Eset_auto2(H5E_DEFAULT, efunc, edata);
  return st;
}

/* Give every rank of `comm` rank 0's set. Collective. */
static void bcast(struct tokset *t, MPI_Comm comm) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  MPI_Bcast(t->present, NNAMES, MPI_INT, 0, comm);
  for (int i = 0; i < NNAMES; i++) {
    if (!t->present[i]) continue;
    uint64_t n = t->len[i];
    MPI_Bcast(&n, 1, MPI_UINT64_T, 0, comm);
    if (rank != 0) {
      t->len[i] = (size_t)n;
      t->data[i] = kd_malloc((size_t)n + 1);
    }
    if (n > 0) MPI_Bcast(t->data[i], (int)n, MPI_UNSIGNED_CHAR, 0, comm); /* n <= 1 GiB */
  }
}

/* Create /tokenizer in `file` and its datasets (every rank), rank 0 writing the bytes with
 * collective transfers. Collective; 0 or KD_EXIT_IO (not yet agreed). */
static int write_h5(const struct tokset *t, hid_t file, MPI_Comm comm, const char *what, char *err,
                    size_t errlen) {
  if (tokset_count(t) == 0) return 0;
  int rank;
  MPI_Comm_rank(comm, &rank);
  hid_t g = H5Gcreate2(file, TOKFILES_GROUP, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  int ok = agree_all(g >= 0, comm); /* each collective step on every rank, or on none */
  hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
  for (int i = 0; i < NNAMES && ok; i++) {
    if (!t->present[i]) continue;
    hsize_t n = t->len[i];
    hid_t fs = H5Screate_simple(1, &n, NULL), ms = H5Screate_simple(1, &n, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_layout(dcpl, H5D_CONTIGUOUS);
    H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
    hid_t d = H5Dcreate2(g, tokfiles_names[i], H5T_STD_U8LE, fs, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ok = agree_all(d >= 0, comm);
    const uint64_t sum = file_sum(tokfiles_names[i], t->data[i], t->len[i]);
    if (ok) ok = agree_all(h5attr_set_u64(d, CHECKSUM_BOUND, sum) == 0, comm);
    if (ok && n > 0) {
      if (rank != 0) {
        H5Sselect_none(fs);
        H5Sselect_none(ms);
      }
      ok = H5Dwrite(d, H5T_NATIVE_UCHAR, ms, fs, dxpl, t->data[i]) >= 0;
    }
    if (d >= 0 && H5Dclose(d) < 0) ok = 0;
    ok = agree_all(ok, comm);
    H5Pclose(dcpl);
    H5Sclose(ms);
    H5Sclose(fs);
    if (!ok)
      kd_seterr(err, errlen, "%s: writing /%s/%s failed (disk full?)", what, TOKFILES_GROUP,
                tokfiles_names[i]);
  }
  H5Pclose(dxpl);
  if (g >= 0 && H5Gclose(g) < 0) ok = 0;
  if (!ok && g < 0) kd_seterr(err, errlen, "%s: creating /%s failed", what, TOKFILES_GROUP);
  return ok ? 0 : KD_EXIT_IO;
}

/* The name of the open file `file`, for messages. */
static void file_name(hid_t file, char *out, size_t len) {
  if (H5Fget_name(file, out, len) < 0) snprintf(out, len, "the weights file");
}

/* Rank 0 has read `t` with status st: agree, broadcast, write into `dst`. Collective. */
static int spread(struct tokset *t, int st, hid_t dst, MPI_Comm comm, int *nfiles, char *err,
                  size_t errlen) {
  if (!(st = kd_agree(st, err, errlen, comm))) {
    bcast(t, comm);
    char name[1024];
    file_name(dst, name, sizeof name);
    st = kd_agree(write_h5(t, dst, comm, name, err, errlen), err, errlen, comm);
  }
  if (nfiles) *nfiles = st ? 0 : tokset_count(t);
  tokset_free(t);
  return st;
}

int tokfiles_write_dir(hid_t file, const char *dir, MPI_Comm comm, int *nfiles, char *err,
                       size_t errlen) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  struct tokset t;
  memset(&t, 0, sizeof t);
  int st = rank == 0 ? read_dir(&t, dir, err, errlen) : 0;
  return spread(&t, st, file, comm, nfiles, err, errlen);
}

int tokfiles_copy(const char *src_path, hid_t dst, MPI_Comm comm, int *nfiles, char *err,
                  size_t errlen) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  struct tokset t;
  memset(&t, 0, sizeof t);
  int st = rank == 0 ? read_path(&t, src_path, err, errlen) : 0;
  return spread(&t, st, dst, comm, nfiles, err, errlen);
}

int tokfiles_extract(const char *path, const char *dir, int *nfiles, char *err, size_t errlen) {
  struct tokset t;
  int st = read_path(&t, path, err, errlen);
  for (int i = 0; i < NNAMES && !st; i++) {
    if (!t.present[i]) continue;
    char out[4096];
    snprintf(out, sizeof out, "%s/%s", dir, tokfiles_names[i]);
    FILE *f = fopen(out, "wb");
    int ok = f && fwrite(t.data[i], 1, t.len[i], f) == t.len[i];
    if (f && fclose(f) != 0) ok = 0;
    if (!ok) {
      kd_seterr(err, errlen, "%s: cannot write the tokenizer file (%s)", out, strerror(errno));
      st = KD_EXIT_IO;
    }
  }
  if (nfiles) *nfiles = st ? 0 : tokset_count(&t);
  tokset_free(&t);
  return st;
}

const char *tokfiles_differ(const struct tokset *a, const struct tokset *b) {
  static const struct tokset none;
  if (!a) a = &none;
  if (!b) b = &none;
  for (int i = 0; i < NNAMES; i++) {
    if (!defines_ids(tokfiles_names[i])) continue;
    int same =
        a->present[i] == b->present[i] &&
        (!a->present[i] || (a->len[i] == b->len[i] && !memcmp(a->data[i], b->data[i], a->len[i])));
    if (!same) return tokfiles_names[i];
  }
  return NULL;
}

int tokfiles_equal(const char *path_a, const char *path_b, int *equal, char *which, size_t whichlen,
                   char *err, size_t errlen) {
  struct tokset a, b;
  memset(&b, 0, sizeof b);
  *equal = 0;
  if (whichlen) which[0] = '\0';
  int st = read_path(&a, path_a, err, errlen);
  if (!st) st = read_path(&b, path_b, err, errlen);
  if (!st) {
    const char *d = tokfiles_differ(&a, &b);
    *equal = d == NULL;
    if (d && whichlen) snprintf(which, whichlen, "%s", d);
  }
  tokset_free(&a);
  tokset_free(&b);
  return st;
}

int tokfiles_count(const char *path, char *err, size_t errlen) {
  struct tokset t;
  int st = read_path(&t, path, err, errlen);
  int n = st ? -1 : tokset_count(&t);
  tokset_free(&t);
  return n;
}

/* A read set handed out: NULL when the read failed (st) or found no file. */
static struct tokset *held(struct tokset *t, int st) {
  if (st || tokset_count(t) == 0) {
    tokset_free(t);
    free(t);
    t = NULL;
  }
  return t;
}

int tokfiles_load(const char *path, MPI_Comm comm, struct tokset **out, char *err, size_t errlen) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  struct tokset *t = kd_calloc(1, sizeof *t);
  int st = kd_agree(rank == 0 ? read_path(t, path, err, errlen) : 0, err, errlen, comm);
  if (!st) bcast(t, comm);
  *out = held(t, st);
  return st;
}

int tokfiles_read(const char *path, struct tokset **out, char *err, size_t errlen) {
  struct tokset *t = kd_calloc(1, sizeof *t);
  const int st = read_path(t, path, err, errlen);
  *out = held(t, st);
  return st;
}

int tokfiles_put(const struct tokset *t, hid_t dst, MPI_Comm comm, char *err, size_t errlen) {
  if (!t) return 0;
  char name[1024];
  file_name(dst, name, sizeof name);
  return kd_agree(write_h5(t, dst, comm, name, err, errlen), err, errlen, comm);
}

void tokfiles_free(struct tokset *t) {
  if (!t) return;
  tokset_free(t);
  free(t);
}

/* --- what the files say about ids ------------------------------------------------------- */

/* The parsed JSON file `name` of the set (NULL when absent or not JSON). */
static cJSON *json_of(const struct tokset *t, const char *name) {
  for (int i = 0; t && i < NNAMES; i++)
    if (t->present[i] && !strcmp(tokfiles_names[i], name))
      return cJSON_ParseWithLength((const char *)t->data[i], t->len[i]);
  return NULL;
}

/* The id of token text `tok` in tokenizer.json (an added token, else the model's vocabulary);
 * -1 when not found. */
static int token_id(const cJSON *tj, const char *tok) {
  const cJSON *a, *added = cJSON_GetObjectItemCaseSensitive(tj, "added_tokens");
  cJSON_ArrayForEach(a, added) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
    if (cJSON_IsString(c) && cJSON_IsNumber(id) && !strcmp(c->valuestring, tok))
      return (int)id->valuedouble;
  }
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(tj, "model");
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(
      cJSON_GetObjectItemCaseSensitive(model, "vocab"), tok); /* BPE / WordPiece: {token: id} */
  return cJSON_IsNumber(id) ? (int)id->valuedouble : -1;
}

int tokfiles_eos(const struct tokset *t, int *eos, int max, const char **from) {
  int n = 0;
  *from = NULL;
  cJSON *gc = json_of(t, "generation_config.json");
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(gc, "eos_token_id"), *x;
  if (cJSON_IsNumber(e) && e->valuedouble >= 0) {
    eos[n++] = (int)e->valuedouble;
  } else if (cJSON_IsArray(e)) {
    cJSON_ArrayForEach(x, e) {
      if (n < max && cJSON_IsNumber(x) && x->valuedouble >= 0) eos[n++] = (int)x->valuedouble;
    }
  }
  cJSON_Delete(gc);
  if (n) {
    *from = "generation_config.json eos_token_id";
    return n;
  }
  /* the tokenizer's: tokenizer_config.json's eos_token (a string, or {"content": ...}) looked
   * up in tokenizer.json */
  cJSON *tc = json_of(t, "tokenizer_config.json"), *tj = json_of(t, "tokenizer.json");
  const cJSON *tok = cJSON_GetObjectItemCaseSensitive(tc, "eos_token");
  if (cJSON_IsObject(tok)) tok = cJSON_GetObjectItemCaseSensitive(tok, "content");
  const int id = cJSON_IsString(tok) && tj ? token_id(tj, tok->valuestring) : -1;
  if (id >= 0 && max > 0) {
    eos[n++] = id;
    *from = "tokenizer_config.json eos_token";
  }
  cJSON_Delete(tc);
  cJSON_Delete(tj);
  return n;
}

const char *tokfiles_file(const struct tokset *t, const char *name, size_t *len) {
  for (int i = 0; t && i < NNAMES; i++) {
    if (t->present[i] && !strcmp(tokfiles_names[i], name)) {
      *len = t->len[i];
      return (const char *)t->data[i];
    }
  }
  *len = 0;
  return NULL;
}

int tokfiles_max_id(const struct tokset *t) {
  cJSON *tj = json_of(t, "tokenizer.json");
  if (!tj) return -1;
  int top = -1;
  const cJSON *x,
      *vocab =
          cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tj, "model"), "vocab");
  if (cJSON_IsObject(vocab)) {
    cJSON_ArrayForEach(x, vocab) {
      if (cJSON_IsNumber(x) && x->valuedouble > top) top = (int)x->valuedouble;
    }
  } else if (cJSON_IsArray(vocab)) { /* Unigram: [[piece, score], ...], ids by position */
    top = cJSON_GetArraySize(vocab) - 1;
  }
  cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(tj, "added_tokens")) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(x, "id");
    if (cJSON_IsNumber(id) && id->valuedouble > top) top = (int)id->valuedouble;
  }
  cJSON_Delete(tj);
  return top;
}
