/* selftest.h: `kdtrain --selftest`: every op of the CUDA backend against the CPU
 * backend on the same random inputs, then two training steps of a small model on
 * both backends (doc/cuda.md). */
#ifndef KD_SELFTEST_H
#define KD_SELFTEST_H

#include "config.h"

/* Run the self-test as selected by cfg (run%device, precision%compute). Collective
 * over MPI_COMM_WORLD (each rank tests the device it would use). Returns 0 when every
 * comparison passes, 1 when one fails, KD_EXIT_INPUT (2) when there is no CUDA
 * device to test (no CUDA support built in, no device, or run%device='cpu'). */
int selftest_run(const struct kd_config *cfg);

#endif
