/* cpu_gemm16.h: a BF16 matrix product for the CPU backend's bf16 runs: BF16 operands,
 * FP32 accumulation, on the AVX512-BF16 dot-product instruction (vdpbf16ps: two BF16
 * products and an FP32 sum per lane, twice the FP32 FMA rate).
 *
 * The CPU backend emulates BF16 storage with FP32 arrays whose values are BF16 numbers;
 * where both operands of a product are such arrays (or a weight held in packed BF16),
 * this product gives the FP32 GEMM's result up to summation order: a product of two
 * BF16 numbers is exact in FP32. One difference: the instruction treats subnormal
 * inputs and results as zero (|x| < 1.2e-38). */
#ifndef KD_CPU_GEMM16_H
#define KD_CPU_GEMM16_H

#include <stddef.h>
#include <stdint.h>

/* Register tile of the AVX512-BF16 kernel: MR rows of C by NR columns (three 16-lane
 * vectors; 24 accumulators). MR 8 divides the row counts of experts' blocks and
 * micro-batches (a 14-row tile left 12 of 14 rows idle on 128). */
#define G16_MR 8
#define G16_NR 48

/* The kernels, slowest first: the portable scalar one (tests; much slower than sgemm),
 * AVX512-BF16 (vdpbf16ps, 2x the FP32 FMA rate), AMX (tiles, 16x). */
enum { G16_PORTABLE = 0, G16_AVX512 = 1, G16_AMX = 2 };
/* The fastest kernel this CPU runs (cpuid, the OS's vector state and, for AMX, the OS's
 * grant of the tile state to this process, asked for here). */
int gemm16_best(void);
/* 1 if a kernel faster than sgemm runs here (gemm16_best() >= G16_AVX512). */
int gemm16_available(void);
/* The kernel to run when `kernel` is asked for: it, or the best one available if that is
 * slower. Keeps nothing: the caller holds the choice (the CPU backend in its state). */
int gemm16_choose(int kernel);

/* How gemm16 runs a product (the caller's, passed to every call: this file keeps no
 * choice of its own). kernel: G16_*, one this CPU runs (gemm16_choose). order: how the
 * operands are packed: 0 the cheaper one (the backend's); tests force 1, op(A) packed
 * with all of K once and B per block of A's rows (but for K past 21,845 on the AVX512-BF16
 * and portable kernels: 2 then), or 2, GotoBLAS order. */
struct gemm16_how {
  int kernel;
  int order;
};

/* 1 if every element of the rows x cols matrix X (leading dim ld) is a BF16 number
 * (the low 16 bits of its FP32 pattern are zero): such operands lose nothing. */
int gemm16_exact(const float *X, int rows, int cols, int ld);

/* Bytes of work space gemm16 needs for an M x N x K product (one thread): about 6 MiB
 * at most. */
size_t gemm16_work_bytes(int M, int N, int K);

/* Make sure the calling thread's own work space holds an M x N x K product (gemm16 with
 * work NULL then cannot fail for lack of memory): 0, or -1 if it cannot be allocated. */
int gemm16_reserve(int M, int N, int K);

/* Row-major C (M x N, ldc) = alpha op(A) op(B) + beta C on the calling thread (the kernel
 * and packing order of `how`), op(A)
 * M x K (A is K x M when transa), op(B) K x N (N x K when transb). B is FP32 (B) or
 * packed BF16 (B16, the upper halves of FP32 patterns; only with transb = 1). beta 0
 * never reads C. work: gemm16_work_bytes, or NULL for the calling thread's own work space
 * (allocated on first use, grown when a product needs more, kept for the thread's life,
 * outside the arena's counts as the BLAS's own buffers are). Returns 0, or -1 when A or an FP32 B
 * holds a value that is not a BF16 number: then C is as it was when beta != 0 (checked before any
 * write) and partly written when beta == 0 (found while packing); either way the caller computes
 * the product another way. rnd = 1: the FP32 operands are rounded to BF16 (nearest even,
 * as the CUDA path converts them; values below 2^-126 count as zero) as they are packed,
 * and never refused: -1 then only when the work space cannot be allocated. */
int gemm16(const struct gemm16_how *how, int transa, int transb, int M, int N, int K, float alpha,
           const float *A, int lda, const float *B, const uint16_t *B16, int ldb, float beta,
           float *C, int ldc, void *work, int rnd);

#endif
