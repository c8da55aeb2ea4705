/* cpu_peak.h: the CPU's peak rate measured, not looked up: register-resident chains of
 * the vector FMA (FP32) and of the BF16 dot product, timed on the calling thread. */
#ifndef KD_CPU_PEAK_H
#define KD_CPU_PEAK_H

#include <stddef.h>

#include "cpu_hw.h"

/* FLOP/s of one core running the CPU's widest FP32 FMA (bf16 = 0) or its BF16 dot product
 * (bf16 = 1: AVX512-BF16's vdpbf16ps, two products per FP32 lane) back to back, from
 * independent accumulators enough to cover the instruction's latency: the best of eight
 * timings of about `seconds` each. `how` says what ran. 0 when the CPU has no such
 * instruction the probe knows (`how` says why). */
double kd_peak_probe(const struct kd_cpu *c, int bf16, double seconds, char *how, size_t n);

#endif
