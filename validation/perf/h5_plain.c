/* h5_plain: the baseline of validation/perf/ckpt_io. Writes, then reads, BYTES of float32
 * split into NSETS one-dimensional datasets with plain parallel HDF5 (MPI-IO driver, each
 * dataset created by all ranks, each rank's contiguous 1/N of it in one collective
 * H5Dwrite/H5Dread, from / into a buffer of this rank's whole share: distinct data, as a
 * checkpoint's), and prints the GB/s of each (1 GB = 1e9 bytes). Times include
 * create/open and close and, for the write, an fsync of the file: a checkpoint is only a
 * checkpoint once it is on the disk (kdtrain fsyncs before it publishes one), and without
 * it the figure is the page cache's, which depends on what was written before.
 *   mpiexec -n N validation/perf/h5_plain BYTES NSETS FILE [COLD]
 * With COLD given (a command), the page cache is emptied between the write and the read:
 * rank 0 runs it (ckpt_io passes a drop_caches command when it may), so the read comes
 * from the disk, as after a restart on another node.
 * On more than one rank it then reads the file a second time as data-parallel replicas
 * need it, every rank ending with all of it: each rank's 1/N by the collective read
 * above, then one MPI_Allgatherv per dataset (the "replicated read"; the cache emptied
 * before it too with COLD). */
#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int io(const char *path, long long per_set, int nsets, int writing, float *buf0, int rank,
              int size, int replicate) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, MPI_COMM_WORLD, MPI_INFO_NULL);
  hid_t f = writing ? H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl)
                    : H5Fopen(path, H5F_ACC_RDONLY, fapl);
  H5Pclose(fapl);
  if (f < 0) return 1;
  hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
  /* rank r's contiguous share of every dataset: cnt[r] elements from at[r] */
  const long long base = per_set / size, extra = per_set % size;
  int bad = 0, *cnt = malloc(2 * (size_t)size * sizeof *cnt), *at = cnt + size;
  for (int r = 0; r < size; r++) {
    at[r] = (int)(r * base + (r < extra ? r : extra));
    cnt[r] = (int)(base + (r < extra ? 1 : 0));
  }
  const hsize_t start = (hsize_t)at[rank], count = (hsize_t)cnt[rank], total = (hsize_t)per_set;
  for (int d = 0; d < nsets; d++) {
    float *buf =
        replicate ? buf0 + (size_t)d * (size_t)per_set + start : buf0 + (size_t)d * (size_t)count;
    char name[32];
    snprintf(name, sizeof name, "t%05d", d);
    hid_t fs = H5Screate_simple(1, &total, NULL), ms = H5Screate_simple(1, &count, NULL);
    hid_t ds =
        writing ? H5Dcreate2(f, name, H5T_NATIVE_FLOAT, fs, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)
                : H5Dopen2(f, name, H5P_DEFAULT);
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, NULL, &count, NULL);
    if (count == 0) H5Sselect_none(ms);
    bad |= (writing ? H5Dwrite(ds, H5T_NATIVE_FLOAT, ms, fs, dxpl, buf)
                    : H5Dread(ds, H5T_NATIVE_FLOAT, ms, fs, dxpl, buf)) < 0;
    if (replicate)
      bad |= MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf0 + (size_t)d * (size_t)per_set,
                            cnt, at, MPI_FLOAT, MPI_COMM_WORLD) != MPI_SUCCESS;
    H5Dclose(ds);
    H5Sclose(fs);
    H5Sclose(ms);
  }
  free(cnt);
  H5Pclose(dxpl);
  bad |= H5Fclose(f) < 0;
  if (writing && rank == 0) { /* durable, as kdtrain's checkpoint */
    const int fd = open(path, O_RDONLY);
    bad |= fd < 0 || fsync(fd) != 0;
    if (fd >= 0) close(fd);
  }
  return bad;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc != 4 && argc != 5) {
    if (rank == 0) fprintf(stderr, "usage: h5_plain BYTES NSETS FILE [COLD]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const long long bytes = atoll(argv[1]);
  const int nsets = atoi(argv[2]);
  const long long per_set = bytes / 4 / nsets;
  const size_t share = (size_t)(per_set / size + 1) * (size_t)nsets;
  float *buf = malloc(share * sizeof(float));
  for (size_t i = 0; i < share; i++)
    buf[i] = (float)(i % 1000) * 1e-3f;
  double t[3] = {0, 0, 0}; /* read, write, replicated read */
  /* touched before the clock starts, as kdtrain's model buffer is when it reads */
  float *all = size > 1 ? calloc((size_t)per_set * (size_t)nsets, sizeof(float)) : NULL;
  for (size_t i = 0; all && i < (size_t)per_set * (size_t)nsets; i += 1024)
    all[i] = 1.0f;
  for (int w = 1; w >= (size > 1 ? -1 : 0); w--) {
    if (w <= 0 && argc == 5 && rank == 0 && system(argv[4]) != 0) {
      fprintf(stderr, "h5_plain: '%s' failed\n", argv[4]);
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    if (io(argv[3], per_set, nsets, w == 1, w < 0 ? all : buf, rank, size, w < 0)) {
      fprintf(stderr, "h5_plain: %s of %s failed\n",
              w > 0    ? "write"
              : w == 0 ? "read"
                       : "replicated read",
              argv[3]);
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    t[w < 0 ? 2 : w] = MPI_Wtime() - t0;
  }
  const double gb = (double)per_set * nsets * 4 / 1e9;
  if (rank == 0) {
    printf("h5_plain: %d rank(s), %.3f GB in %d datasets: write %.2f s = %.2f GB/s, read %.2f s "
           "= %.2f GB/s",
           size, gb, nsets, t[1], gb / t[1], t[0], gb / t[0]);
    if (size > 1) printf(", replicated read %.2f s = %.2f GB/s", t[2], gb / t[2]);
    printf("\n");
  }
  free(all);
  free(buf);
  MPI_Finalize();
  return 0;
}
