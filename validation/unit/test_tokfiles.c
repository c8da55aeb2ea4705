/* test_tokfiles.c: the /tokenizer group (src/tokfiles.h). Files of a directory (one empty,
 * one binary, one not a tokenizer file) are stored byte for byte in a weights file written
 * collectively, extracted again, copied into a second file, compared; a file without the
 * group counts as none; a held set gives each file's bytes (tokfiles_file); a changed
 * tokenizer.json makes two files differ, a changed generation_config.json does not. Runs on
 * 1 rank and on 2 (mpiexec -n 2). */
#include <check.h>
#include <hdf5.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_run.h"
#include "tokfiles.h"
#include "util.h"

static char tmpdir[256];
static int rank;

static void put_file(const char *dir, const char *name, const void *data, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(data, 1, n, f), n);
  fclose(f);
}

/* The file `name` of `dir` equals data[0, n). */
static int same_file(const char *dir, const char *name, const void *data, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  unsigned char *buf = kd_malloc(n + 1);
  size_t got = fread(buf, 1, n + 1, f);
  fclose(f);
  int same = got == n && !memcmp(buf, data, n);
  free(buf);
  return same;
}

/* A new file `name` in tmpdir, created collectively (MPI-IO), holding dir's tokenizer. */
static void make_h5(const char *name, const char *dir, int want) {
  char path[512], err[512];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, MPI_COMM_WORLD, MPI_INFO_NULL);
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  ck_assert(f >= 0);
  int n = -1;
  int st = dir ? tokfiles_write_dir(f, dir, MPI_COMM_WORLD, &n, err, sizeof err) : 0;
  ck_assert_msg(st == 0, "%s", err);
  if (dir) ck_assert_int_eq(n, want);
  ck_assert(H5Fclose(f) >= 0);
}

static const unsigned char binary[] = {0, 1, 2, 255, 0, 10, 13, 0x80};
static const char json[] = "{\"model\": {\"type\": \"BPE\"}}\n";

START_TEST(store_extract_copy_compare) {
  char src[300], out[300], path[512], err[512], which[64];
  snprintf(src, sizeof src, "%s/src", tmpdir);
  snprintf(out, sizeof out, "%s/out", tmpdir);
  if (rank == 0) {
    ck_assert_int_eq(kd_mkdir_p(src), 0);
    ck_assert_int_eq(kd_mkdir_p(out), 0);
    put_file(src, "tokenizer.json", json, strlen(json));
    put_file(src, "tokenizer.model", binary, sizeof binary);
    put_file(src, "chat_template.jinja", "", 0);
    put_file(src, "pytorch_model.bin", "not a tokenizer file", 20);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  make_h5("a.h5", src, 3);
  snprintf(path, sizeof path, "%s/a.h5", tmpdir);
  ck_assert_int_eq(tokfiles_count(path, err, sizeof err), 3);
  { /* a held set gives the bytes of its files; none for a file it lacks or no set */
    struct tokset *t = NULL;
    size_t len = 1;
    ck_assert_msg(tokfiles_read(path, &t, err, sizeof err) == 0, "%s", err);
    const char *j = tokfiles_file(t, "tokenizer.json", &len);
    ck_assert(j && len == strlen(json) && !memcmp(j, json, len));
    j = tokfiles_file(t, "tokenizer.model", &len);
    ck_assert(j && len == sizeof binary && !memcmp(j, binary, len));
    ck_assert_ptr_null(tokfiles_file(t, "vocab.json", &len));
    ck_assert_uint_eq(len, 0);
    ck_assert_ptr_null(tokfiles_file(NULL, "tokenizer.json", &len));
    tokfiles_free(t);
  }

  /* copy into a second file, collectively */
  char b[512];
  snprintf(b, sizeof b, "%s/b.h5", tmpdir);
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, MPI_COMM_WORLD, MPI_INFO_NULL);
  hid_t fb = H5Fcreate(b, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  int n = -1;
  ck_assert_msg(tokfiles_copy(path, fb, MPI_COMM_WORLD, &n, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(n, 3);
  ck_assert(H5Fclose(fb) >= 0);
  MPI_Barrier(MPI_COMM_WORLD);
  int equal = 0;
  ck_assert_int_eq(tokfiles_equal(path, b, &equal, which, sizeof which, err, sizeof err), 0);
  ck_assert_int_eq(equal, 1);

  if (rank == 0) { /* extract the copy: the exact bytes, nothing else */
    ck_assert_int_eq(tokfiles_extract(b, out, &n, err, sizeof err), 0);
    ck_assert_int_eq(n, 3);
    ck_assert(same_file(out, "tokenizer.json", json, strlen(json)));
    ck_assert(same_file(out, "tokenizer.model", binary, sizeof binary));
    ck_assert(same_file(out, "chat_template.jinja", "", 0));
    char stray[512];
    snprintf(stray, sizeof stray, "%s/pytorch_model.bin", out);
    ck_assert_int_ne(access(stray, F_OK), 0);

    /* generation_config.json does not define token ids; tokenizer.json does */
    put_file(src, "generation_config.json", "{}", 2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  make_h5("c.h5", src, 4);
  snprintf(b, sizeof b, "%s/c.h5", tmpdir);
  ck_assert_int_eq(tokfiles_equal(path, b, &equal, which, sizeof which, err, sizeof err), 0);
  ck_assert_int_eq(equal, 1);
  if (rank == 0) put_file(src, "tokenizer.json", "{}", 2);
  MPI_Barrier(MPI_COMM_WORLD);
  make_h5("d.h5", src, 4);
  snprintf(b, sizeof b, "%s/d.h5", tmpdir);
  ck_assert_int_eq(tokfiles_equal(path, b, &equal, which, sizeof which, err, sizeof err), 0);
  ck_assert_int_eq(equal, 0);
  ck_assert_str_eq(which, "tokenizer.json");
}
END_TEST

START_TEST(absent_group_and_bad_file) {
  char path[512], none2[512], err[512], which[64];
  make_h5("none.h5", NULL, 0);
  make_h5("none2.h5", NULL, 0);
  snprintf(path, sizeof path, "%s/none.h5", tmpdir);
  snprintf(none2, sizeof none2, "%s/none2.h5", tmpdir);
  ck_assert_int_eq(tokfiles_count(path, err, sizeof err), 0);
  int equal = 0;
  ck_assert_int_eq(tokfiles_equal(path, none2, &equal, which, sizeof which, err, sizeof err), 0);
  ck_assert_int_eq(equal, 1);
  /* not HDF5: refused with the file named */
  snprintf(none2, sizeof none2, "%s/not.h5", tmpdir);
  if (rank == 0) put_file(tmpdir, "not.h5", "plain text", 10);
  MPI_Barrier(MPI_COMM_WORLD);
  ck_assert_int_eq(tokfiles_count(none2, err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "not.h5"));
  ck_assert_int_eq(tokfiles_equal(path, none2, &equal, which, sizeof which, err, sizeof err),
                   KD_EXIT_INPUT);
  /* a directory without tokenizer files stores no group */
  snprintf(none2, sizeof none2, "%s/empty", tmpdir);
  if (rank == 0) ck_assert_int_eq(kd_mkdir_p(none2), 0);
  MPI_Barrier(MPI_COMM_WORLD);
  make_h5("e.h5", none2, 0);
  snprintf(path, sizeof path, "%s/e.h5", tmpdir);
  ck_assert_int_eq(tokfiles_count(path, err, sizeof err), 0);
}
END_TEST

/* Rank 0 edits `path` with plain HDF5: a byte of tokenizer.json changed (`flip`), its
 * checksum attribute deleted (`unsum`), the root given format_version `version` (NULL: no
 * change). */
static void edit_h5(const char *path, int flip, int unsum, const char *version) {
  if (rank == 0) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert(f >= 0);
    hid_t d = H5Dopen2(f, "tokenizer/tokenizer.json", H5P_DEFAULT);
    ck_assert(d >= 0);
    if (flip) {
      unsigned char buf[sizeof json];
      ck_assert(H5Dread(d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0);
      buf[3] ^= 1;
      ck_assert(H5Dwrite(d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0);
    }
    if (unsum) ck_assert(H5Adelete(d, "checksum_bound64") >= 0);
    H5Dclose(d);
    if (version) {
      hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
      H5Tset_size(t, strlen(version) + 1);
      hid_t a = H5Acreate2(f, "format_version", t, sp, H5P_DEFAULT, H5P_DEFAULT);
      ck_assert(a >= 0 && H5Awrite(a, t, version) >= 0);
      H5Aclose(a), H5Sclose(sp), H5Tclose(t);
    }
    ck_assert(H5Fclose(f) >= 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

/* Each stored file carries a bound checksum (format 1.2): a changed byte or a missing
 * checksum is refused naming the dataset; a format 1.1 file without checksums loads. */
START_TEST(checksums) {
  char src[300], path[512], err[512];
  snprintf(src, sizeof src, "%s/sumsrc", tmpdir);
  if (rank == 0) {
    ck_assert_int_eq(kd_mkdir_p(src), 0);
    put_file(src, "tokenizer.json", json, strlen(json));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  snprintf(path, sizeof path, "%s/sum.h5", tmpdir);
  make_h5("sum.h5", src, 1);
  edit_h5(path, 1, 0, NULL);
  ck_assert_int_eq(tokfiles_count(path, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "/tokenizer/tokenizer.json fails its checksum"), "%s", err);
  struct tokset *t = NULL;
  ck_assert_int_eq(tokfiles_load(path, MPI_COMM_WORLD, &t, err, sizeof err), KD_EXIT_INPUT);
  ck_assert_ptr_null(t);
  make_h5("sum.h5", src, 1);
  edit_h5(path, 0, 1, NULL);
  ck_assert_int_eq(tokfiles_count(path, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "sum.h5: /tokenizer/tokenizer.json attribute 'checksum_bound64' is "
                            "missing"),
                "%s", err);
  make_h5("sum.h5", src, 1);
  edit_h5(path, 0, 1, "1.1"); /* written before format 1.2: no checksum asked for */
  ck_assert_msg(tokfiles_count(path, err, sizeof err) == 1, "%s", err);
  make_h5("sum.h5", src, 1);
  edit_h5(path, 1, 0, "1.1"); /* but one present is checked */
  ck_assert_int_eq(tokfiles_count(path, err, sizeof err), -1);
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kd_tokfiles_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
  }
  MPI_Bcast(tmpdir, sizeof tmpdir, MPI_CHAR, 0, MPI_COMM_WORLD);
  Suite *s = suite_create("tokfiles");
  TCase *tc = tcase_create("tokfiles");
  tcase_add_test(tc, store_extract_copy_compare);
  tcase_add_test(tc, absent_group_and_bad_file);
  tcase_add_test(tc, checksums);
  suite_add_tcase(s, tc);
  int failed = check_run(s);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && !failed) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) failed = 1;
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any ? 1 : 0;
}
