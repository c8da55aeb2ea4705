/* cuda.h: the CUDA backend (built with configure --with-cuda) and its host-side
 * helpers: device selection, description, teardown, and whether MPI accepts device
 * buffers.
 *
 * The op table's pointers are device pointers on this backend (be->device = 1;
 * allocations of category KD_MEM_HOST are pinned host memory): the host reaches
 * them only through the ops, be->upload and be->download; be->sync waits for the
 * compute and copy streams. Plain C header; the .cu files include it inside extern "C". */
#ifndef KD_CUDA_H
#define KD_CUDA_H

#include <stddef.h>

#include "backend.h"

/* The functions below up to backend_cuda_init exist only in builds configured with
 * --with-cuda (KD_HAVE_CUDA defined in kdtrain_config.h). */

/* Number of CUDA devices visible to this process (0 without a driver or a device);
 * never fails. When 0 and `why` is not NULL, a one-line reason is written there. */
int backend_cuda_device_count(char *why, size_t whylen);

/* Fill `be` with the CUDA ops on device local_rank % device_count: cuBLAS handle,
 * a compute stream and a copy stream; be->mpi_device = cuda_mpi_aware() (call after
 * MPI_Init). bf16: GEMMs take BF16 inputs (FP32 accumulate) and forward ops round
 * what they store, as the CPU backend emulates. Fails (kd_fail) when no device is
 * usable. be->describe names the device ("device N: NAME (sm_XY, G GiB)");
 * be->peak_flops gives its datasheet peak (dense BF16 tensor cores with bf16 = 1, FP32
 * CUDA cores otherwise: kdtrain's FP32 GEMMs do not use TF32), 0 for a device not in
 * the table (then log%peak_tflops gives it); be->release frees the handle, streams and
 * workspaces. Called by backend_select (select.c). */
void backend_cuda_init(struct kd_backend *be, int bf16, int local_rank);

/* 1 when the MPI library reports that it accepts CUDA device buffers
 * (MPIX_Query_cuda_support), 0 otherwise: then device data must be staged through
 * pinned host buffers for MPI. Call after MPI_Init. Available in every build. */
int cuda_mpi_aware(void);

#endif
