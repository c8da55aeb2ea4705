/* cuda_mpi.c: the CUDA questions asked over MPI: does every rank see a device, and
 * does the MPI library take device buffers? Compiled in every build. */
#include "kdtrain_config.h"

#include <mpi.h>
#include <stdio.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h> /* Open MPI declares MPIX_Query_cuda_support here */
#endif

#include "backend/cuda.h"

int cuda_devices_all_ranks(char *why, size_t whylen) {
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

int cuda_mpi_aware(void) {
#if defined(KD_HAVE_CUDA) && defined(HAVE_MPIX_QUERY_CUDA_SUPPORT)
  return MPIX_Query_cuda_support() ? 1 : 0;
#else
  return 0;
#endif
}
