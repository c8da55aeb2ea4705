/* select.c: the one place that knows which backends exist: backend_select turns the
 * run%device word into a backend (CPU, CUDA where built and present, the simulated
 * device). The top of src/backend/: it calls the backends' inits, none of them calls
 * back (each checks its table with backend_check, backend.c). */
#include "kdtrain_config.h"

#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "../util.h"
#include "backend.h"
#include "cpu_hw.h"
#include "cuda.h"

void backend_prepare(char **argv) {
  kd_blas_select(argv);
}

/* The smallest CUDA device count over the ranks of MPI_COMM_WORLD (0 in builds without
 * CUDA); collective. When it is 0, `why` says why for this rank. */
static int cuda_devices_all_ranks(char *why, size_t whylen) {
  int mine = 0, least = 0;
#ifdef KD_HAVE_CUDA
  mine = backend_cuda_device_count(why, whylen);
#else
  snprintf(why, whylen, "this kdtrain was built without the CUDA backend (configure --with-cuda)");
#endif
  MPI_Allreduce(&mine, &least, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (mine > 0 && least == 0) snprintf(why, whylen, "not every rank sees a CUDA device");
  return least;
}

int backend_select(struct kd_backend *be, enum kd_device device, int bf16, int node_rank,
                   char *note, size_t notelen, char *err, size_t errlen) {
  char why[256] = "";
  const int want_cuda = device == KD_DEV_CUDA || device == KD_DEV_AUTO;
  const int ncuda = want_cuda ? cuda_devices_all_ranks(why, sizeof why) : 0; /* collective */
  if (notelen) note[0] = '\0';
  if (device == KD_DEV_CUDA && ncuda == 0) {
    snprintf(err, errlen, "no CUDA device: %s", why);
    return KD_EXIT_INPUT;
  }
#ifdef KD_HAVE_CUDA
  if (ncuda > 0) {
    backend_cuda_init(be, bf16, node_rank);
    return 0;
  }
#endif
  (void)node_rank; /* no device to pick in a build without CUDA */
  if (device == KD_DEV_DEVSIM)
    backend_devsim_init(be, bf16);
  else
    backend_cpu_init(be, bf16);
  if (device == KD_DEV_AUTO) snprintf(note, notelen, "run%%device='auto', no CUDA device: %s", why);
  return 0;
}
