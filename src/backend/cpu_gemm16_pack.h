/* cpu_gemm16_pack.h: the operands of the BF16 product (cpu_gemm16.c) packed into its
 * kernels' layout, micro-panel by micro-panel, with FP32 values checked or rounded to BF16
 * as they go; internal to the CPU backend. */
#ifndef KD_CPU_GEMM16_PACK_H
#define KD_CPU_GEMM16_PACK_H

#include <stddef.h>
#include <stdint.h>

/* The AVX512-BF16 instructions, for the functions that use them. */
#define KTARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

static inline int round_up(int x, int m) {
  return (x + m - 1) / m * m;
}

/* One operand as the packer sees it: element (r, k) of a matrix whose rows r are the
 * micro-panel's rows (op(A)'s rows, op(B)'s columns). `kcontig`: k runs along storage
 * rows (A not transposed, B transposed); else k indexes storage rows. */
struct src {
  const float *f;
  const uint16_t *h; /* packed BF16 (kcontig only), instead of f */
  int ld, kcontig;
  int rnd; /* f's values rounded to BF16 (nearest even) as they are packed, never refused */
};

/* A region of cache lines that kernel calls prefetch, a share each (lines [l0, l1), one per
 * group of K pairs): `lines` lines from each row, rows `ld` bytes apart from `base`, `total`
 * lines counted row by row. Zero: nothing. */
struct pf {
  const char *base;
  size_t ld;
  int lines, total;
};

/* Pack rows [r0, r0 + nr) and K range [k0, k0 + kc) of s into a micro-panel of S rows (a
 * multiple of 8; dst: (kc + 1) / 2 groups of S words), rows nr..S zero; vectorised when
 * `simd` (only on a CPU with AVX512-BF16), else portable C. Returns the OR of the dropped low
 * halves (non-zero: an FP32 value that is not a BF16 number; never with s->rnd). */
uint32_t pack16_panel(int simd, uint32_t *restrict dst, int S, const struct src *s, int r0, int nr,
                      int k0, int kc);

/* Rows [r0, r0 + nr) into ceil(nr / S) consecutive panels of S rows (pack16_panel each, a
 * panel (kc + 1) / 2 groups of S words): a transposed operand in one pass over its storage
 * rows. */
uint32_t pack16_panels(int simd, uint32_t *restrict dst, int S, const struct src *s, int r0, int nr,
                       int k0, int kc);

/* The lines pack16_panel reads for rows [r0, r0 + nr) and K range [k0, k0 + kc) of s: so that
 * kernel calls can fetch the next panel's operand from memory while they compute, and
 * packing finds it in the cache. */
struct pf pack16_lines(const struct src *s, int r0, int nr, int k0, int kc);

#endif
