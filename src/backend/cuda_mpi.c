/* cuda_mpi.c: the CUDA question asked of MPI: does the MPI library take device buffers?
 * Compiled in every build; it calls no backend (cuda.cu calls it), so that the CUDA backend
 * and this file are not a circle. How many devices every rank sees is backend_select's
 * question (select.c). */
#include "kdtrain_config.h"

#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h> /* Open MPI declares MPIX_Query_cuda_support here */
#endif

#include "backend/cuda.h"

int cuda_mpi_aware(void) {
#if defined(KD_HAVE_CUDA) && defined(HAVE_MPIX_QUERY_CUDA_SUPPORT)
  return MPIX_Query_cuda_support() ? 1 : 0;
#else
  return 0;
#endif
}
