/* cpu_gemm16_amx.h: the AMX tile kernel of the BF16 product (cpu_gemm16.c drives it):
 * a 32 x 32 block of C per call from four 16 x 16 FP32 tiles. Internal to the CPU
 * backend; every function but amx_enable needs amx_enable() == 1. */
#ifndef KD_CPU_GEMM16_AMX_H
#define KD_CPU_GEMM16_AMX_H

#include <stdint.h>

#define AMX_MR 32 /* rows of C per kernel call (two A tiles) */
#define AMX_NR 32 /* columns of C per kernel call: B micro-panels of 32 columns */
#define AMX_KG 16 /* BF16 pairs of K per tile step: packed K is a multiple of 2 x AMX_KG */

/* 1 if AMX BF16 tiles run here: the CPU has them, the OS saves their state and gave
 * this process the tile data (asked once, thread-safe). */
int amx_enable(void);

/* Load the tile configuration on the calling thread / release it (before and after a
 * product's kernel calls). */
void amx_begin(void);
void amx_end(void);

/* Rows [r0, r0 + nr) of op(A) (row-major M x K with leading dim lda when kcontig, else A
 * is K x M) as BF16 pair words, row r at dst + r * kpw (kpw >= K / 2 rounded up, the
 * words past K zero), and rows [nr, rows) zero; rnd: values rounded to BF16 (nearest
 * even), else truncated. Returns the OR of the dropped low halves
 * (non-zero: a value that is not a BF16 number). */
uint32_t amx_pack_rows(uint32_t *restrict dst, int kpw, const float *A, int lda, int kcontig,
                       int rnd, int r0, int nr, int rows, int K);

/* C (m x n, m <= 32, n <= 32) = alpha a b + beta C (beta 0: C not read) over `groups`
 * pairs of K (a multiple of AMX_KG): a 32 rows of packed A, kpw words apart; b a packed
 * B micro-panel of 32 columns (cpu_gemm16.c's layout). */
void amx_kernel(int groups, const uint32_t *a, int kpw, const uint32_t *b, float *C, int ldc, int m,
                int n, float alpha, float beta);

#endif
