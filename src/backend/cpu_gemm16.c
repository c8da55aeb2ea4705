/* cpu_gemm16.c: the BF16 matrix product of the CPU backend (see cpu_gemm16.h).
 *
 * Blocked as GotoBLAS/BLIS do, in KC-deep slices of K: the kernel computes MR x NR tiles
 * of C in registers from an A micro-panel (MR rows x KC, in L2) and a B micro-panel (KC x
 * NR, in L1). op(A) is packed once, with all of K, in blocks of up to 4 MiB (a micro-batch's
 * activations: usually one block), not again for every column block: a wide product (N >>
 * NC, the logits) would otherwise pack it N / NC times. op(B) is packed with all of K too,
 * in blocks of columns of up to 2 MiB, and for each MC rows of A and NR columns of B the
 * kernel runs through every K slice in turn, so that those MC x NR elements of C stay in the
 * cache from slice to slice. B's micro-panels are packed as the first MC rows reach them,
 * and the kernel calls on one panel prefetch what the next one is packed from (into L2), so
 * that reading a weight from memory overlaps the products rather than preceding them. Where
 * op(A) takes several blocks and B is the wider operand, or where K is too long for NR
 * columns with all of K in 2 MiB, the GotoBLAS order instead: per column block and K slice,
 * B's slice packed once, A's per slice and block of MC rows.
 *
 * The result of each element of C does not depend on the blocking: per KC slice of K (the
 * same slices whatever the shape, the kernel or the thread split) an FP32 sum from zero
 * over the slice's pairs in order, then C = alpha sum + beta C (beta 1 after the first
 * slice). MR, NR, MC, NC and the packing order may change; KC and that order of sums may
 * not without changing results bit for bit.
 *
 * Packed layout (both operands): a micro-panel of S rows (S = MR for A, NR for B) is
 * KC/2 groups of S 32-bit words, word s of group p holding the BF16 pair
 * (x[s][2p], x[s][2p + 1]), low half first, where x[s][k] is op(A)(i0 + s, k0 + k) or
 * op(B)(k0 + k, j0 + s). vdpbf16ps multiplies such words lane by lane and adds both
 * products to an FP32 lane: with A's word broadcast and NR of B's words in three
 * vectors, one instruction updates 16 columns of a row of C with two steps of K.
 * Rows past the matrix and a K past an odd end are packed as zeros.
 *
 * Operands arrive as FP32 arrays holding BF16 numbers; packing keeps the upper halves
 * and ORs the lower ones together, so a value that is not a BF16 number is noticed as
 * it is packed. */
#include "cpu_gemm16.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_gemm16_amx.h"
#include "cpu_gemm16_pack.h"
#include "cpu_hw.h"
#include "util.h"

#define KC 256           /* K depth of a packed slice (even: pairs never straddle two slices) */
#define MC (42 * G16_MR) /* 336: the experts' blocks (up to 256 rows) in one block */
#define NC 2016          /* multiple of G16_NR and AMX_NR */

int gemm16_best(void) {
  struct kd_cpu c;
  kd_cpu_detect(&c);
  if (c.isa < KD_ISA_AVX512BF16) return G16_PORTABLE;
  return amx_enable() ? G16_AMX : G16_AVX512;
}

int gemm16_available(void) {
  return gemm16_best() >= G16_AVX512;
}

int gemm16_choose(int kernel) {
  const int best = gemm16_best();
  return kernel < best ? kernel : best;
}

int gemm16_exact(const float *X, int rows, int cols, int ld) {
  uint32_t low = 0;
  for (int r = 0; r < rows && !low; r++) {
    const float *x = X + (size_t)r * ld;
#pragma omp simd reduction(| : low)
    for (int c = 0; c < cols; c++) {
      uint32_t u;
      memcpy(&u, x + c, 4);
      low |= u & 0xffffu;
    }
  }
  return low == 0;
}

/* Rows of op(A) packed at once, all of K: as many as fit in A_CAP bytes (at least MR). */
#define A_CAP ((size_t)4 << 20)
static int a_rows(int M, int K, int mr) {
  const int k2 = round_up(K > 0 ? K : 1, 2), Mr = round_up(M > 0 ? M : 1, mr);
  int ma = (int)(A_CAP / ((size_t)k2 * 2)) / mr * mr;
  if (ma < mr) ma = mr;
  return ma < Mr ? ma : Mr;
}

/* Columns of op(B) packed at once with all of K (gemm16_tiles): as many as fit in B_CAP bytes,
 * a multiple of NR, at most N rounded up; 0 when not even NR columns fit (a K past 21,845:
 * the GotoBLAS order then). */
#define B_CAP ((size_t)2 << 20)
static int b_cols(int N, int K) {
  const int k2 = round_up(K > 0 ? K : 1, 2), Nr = round_up(N > 0 ? N : 1, G16_NR);
  const int nb = (int)(B_CAP / ((size_t)k2 * 2)) / G16_NR * G16_NR;
  return nb < Nr ? nb : Nr;
}

size_t gemm16_work_bytes(int M, int N, int K) {
  /* the larger of the layouts: B by K slice (GotoBLAS order, AMX) or with all of K
   * (gemm16_tiles); the AMX one pads K to 2 AMX_KG and rows to AMX_MR */
  const int k2 = round_up(K > 0 ? K : 1, 2), kx = round_up(K > 0 ? K : 1, 2 * AMX_KG);
  const int kc = kx < KC ? kx : KC;
  const int nc = N < NC ? round_up(N > 0 ? N : 1, 96) : NC; /* 96: G16_NR and AMX_NR */
  size_t b = (size_t)nc * (kc / 2);                         /* at most B_CAP bytes either way */
  if ((size_t)b_cols(N, K) * (k2 / 2) > b) b = (size_t)b_cols(N, K) * (k2 / 2);
  size_t a16 = (size_t)a_rows(M, K, G16_MR) * (k2 / 2);
  if (a16 < (size_t)MC * (KC / 2)) a16 = (size_t)MC * (KC / 2); /* GotoBLAS order */
  size_t ax = (size_t)a_rows(M, kx, AMX_MR) * (kx / 2);
  if (ax < (size_t)6 * AMX_MR * (KC / 2)) ax = (size_t)6 * AMX_MR * (KC / 2); /* goto orders */
  return (b + (a16 > ax ? a16 : ax)) * sizeof(uint32_t) + 64;
}

/* This thread's work space of at least `bytes`, kept for the next product (as a BLAS
 * keeps its packing buffers): a product's work is then never allocated, zeroed or
 * faulted in again. NULL if out of memory.
 *
 * An exception to "backend state lives in be->priv", on purpose: tl_work and tl_bytes are
 * the calling thread's packing scratch, like the BLAS's own buffers. What they hold is
 * overwritten before it is read by every product, so no result and no choice depends on
 * them or on which backend last used the thread; only their size grows. */
static _Thread_local void *tl_work;
static _Thread_local size_t tl_bytes;
static void *thread_work(size_t bytes) {
  if (bytes > tl_bytes) {
    free(tl_work);
    tl_bytes = 0;
    if (posix_memalign(&tl_work, 64, bytes) != 0) return tl_work = NULL;
    /* every page now: a later, smaller product packs at other offsets (op(A)'s panels
     * follow B's), and its first touch would fault in a later step */
    memset(tl_work, 0, bytes);
    tl_bytes = bytes;
  }
  return tl_work;
}

int gemm16_reserve(int M, int N, int K) {
  return thread_work(gemm16_work_bytes(M, N, K)) ? 0 : -1;
}

static inline float bf16_lo(uint32_t w) {
  const uint32_t u = w << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline float bf16_hi(uint32_t w) {
  const uint32_t u = w & 0xffff0000u;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The portable kernel: the same tile from the same packed panels, in scalar FP32. */
static void kernel_scalar(int groups, const uint32_t *restrict a, const uint32_t *restrict b,
                          float *C, int ldc, int m, int n, float alpha, float beta,
                          const struct pf *pf, int l0, int l1) {
  (void)pf, (void)l0, (void)l1;
  float acc[G16_MR][G16_NR];
  memset(acc, 0, sizeof acc);
  for (int p = 0; p < groups; p++, a += G16_MR, b += G16_NR)
    for (int i = 0; i < G16_MR; i++) {
      const float a0 = bf16_lo(a[i]), a1 = bf16_hi(a[i]);
      for (int j = 0; j < G16_NR; j++)
        acc[i][j] += a0 * bf16_lo(b[j]) + a1 * bf16_hi(b[j]);
    }
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      float *c = C + (size_t)i * ldc + j;
      *c = alpha * acc[i][j] + (beta != 0.0f ? beta * *c : 0.0f);
    }
}

#define G16_NV (G16_NR / 16) /* vectors of 16 FP32 lanes across the tile */

/* The AVX512-BF16 kernel on the first R rows and V vectors of a tile (R <= G16_MR, V <=
 * G16_NV; n columns of C kept, n > 16 (V - 1)): R x V accumulators (24 of the 32 vector
 * registers for a whole tile), A's word broadcast, B's words in V vectors. Every C lane
 * sums its K slice pair by pair from zero, whatever R and V are. */
KTARGET static inline __attribute__((always_inline)) void
tile_rv(const int R, const int V, int groups, const uint32_t *restrict a,
        const uint32_t *restrict b, float *C, int ldc, int n, float alpha, float beta,
        const struct pf *pf, int l0, int l1) {
  const char *pb = pf->base;
  const size_t pld = pf->ld;
  const int plines = pf->lines > 0 ? pf->lines : 1;
  int pr = l0 / plines, pl = l0 % plines, pn = l1 - l0;
  __m512 c[G16_MR][G16_NV];
#pragma GCC unroll 8
  for (int i = 0; i < R; i++) {
#pragma GCC unroll 3
    for (int v = 0; v < V; v++)
      c[i][v] = _mm512_setzero_ps();
    /* C's lines now, so that they arrive while the products run (C is read-modify-written
     * once per K slice; from memory that would stall the end of every call) */
    _mm_prefetch((const char *)(C + (size_t)i * ldc), _MM_HINT_T0);
    _mm_prefetch((const char *)(C + (size_t)i * ldc + n - 1), _MM_HINT_T0);
    if (V == 3) _mm_prefetch((const char *)(C + (size_t)i * ldc + 16), _MM_HINT_T0);
  }
  for (int p = 0; p < groups; p++, a += G16_MR, b += G16_NR) {
    if (pn > 0) { /* a line of what is packed next */
      _mm_prefetch(pb + (size_t)pr * pld + 64 * pl, _MM_HINT_T1);
      pn--;
      if (++pl == plines) pl = 0, pr++;
    }
    __m512bh bv[G16_NV];
#pragma GCC unroll 3
    for (int v = 0; v < V; v++)
      bv[v] = (__m512bh)_mm512_loadu_si512(b + 16 * v);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
      const __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i]);
#pragma GCC unroll 3
      for (int v = 0; v < V; v++)
        c[i][v] = _mm512_dpbf16_ps(c[i][v], ai, bv[v]);
    }
  }
  __mmask16 k[G16_NV];
#pragma GCC unroll 3
  for (int v = 0; v < V; v++) {
    const int left = n - 16 * v;
    k[v] = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int i = 0; i < R; i++) {
    float *r = C + (size_t)i * ldc;
#pragma GCC unroll 3
    for (int v = 0; v < V; v++) {
      __m512 x = _mm512_mul_ps(va, c[i][v]);
      if (beta != 0.0f) x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(k[v], r + 16 * v), x);
      _mm512_mask_storeu_ps(r + 16 * v, k[v], x);
    }
  }
}

/* tile_rv for every R and V (tile_R_V), and the table of them */
typedef void tile_fn(int groups, const uint32_t *restrict a, const uint32_t *restrict b, float *C,
                     int ldc, int n, float alpha, float beta, const struct pf *pf, int l0, int l1);
#define TILE_RV(R, V)                                                                              \
  KTARGET static void tile_##R##_##V(                                                              \
      int groups, const uint32_t *restrict a, const uint32_t *restrict b, float *C, int ldc,       \
      int n, float alpha, float beta, const struct pf *pf, int l0, int l1) {                       \
    tile_rv(R, V, groups, a, b, C, ldc, n, alpha, beta, pf, l0, l1);                               \
  }
#define TILE_R(R) TILE_RV(R, 1) TILE_RV(R, 2) TILE_RV(R, 3)
#define TILE_ROW(R)                                                                                \
  { tile_##R##_1, tile_##R##_2, tile_##R##_3 }
/* clang-format off */
TILE_R(1) TILE_R(2) TILE_R(3) TILE_R(4) TILE_R(5) TILE_R(6) TILE_R(7) TILE_R(8)
static tile_fn *const tiles[G16_MR][G16_NV] = {TILE_ROW(1), TILE_ROW(2), TILE_ROW(3), TILE_ROW(4),
                                               TILE_ROW(5), TILE_ROW(6), TILE_ROW(7), TILE_ROW(8)};
/* clang-format on */
_Static_assert(G16_MR == 8 && G16_NV == 3, "tiles[][] lists every R <= G16_MR and V <= G16_NV");

/* C (m x n, m <= G16_MR, n <= G16_NR) = alpha a b + beta C from an A and a B micro-panel
 * (beta 0: C not read), on the kernel for its rows and columns; prefetching pf's lines. */
static void kernel_simd(int groups, const uint32_t *restrict a, const uint32_t *restrict b,
                        float *C, int ldc, int m, int n, float alpha, float beta,
                        const struct pf *pf, int l0, int l1) {
  tiles[m - 1][(n + 15) / 16 - 1](groups, a, b, C, ldc, n, alpha, beta, pf, l0, l1);
}

/* beta C on an M x N block (beta 0: zeros, C never read). */
static void scale_c(float *C, int ldc, int M, int N, float beta) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float *c = C + (size_t)i * ldc + j;
      *c = beta != 0.0f ? beta * *c : 0.0f;
    }
}

/* gemm16 on AMX tiles: the same blocking with 32-row A blocks, op(A)'s rows packed with
 * their pairs contiguous (amx_pack_rows) and each K slice of B padded with zero pairs to
 * a multiple of AMX_KG. */
#define MC_AMX (6 * AMX_MR)
static int gemm16_amx(int M, int N, int K, float alpha, const struct src *sa, const struct src *sb,
                      float beta, float *C, int ldc, void *work) {
  const int kx = round_up(K, 2 * AMX_KG), kpw = kx / 2;
  const int kcmax = kx < KC ? kx : KC;
  const int ncmax = N < NC ? round_up(N, AMX_NR) : NC;
  uint32_t *Bp = (uint32_t *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
  uint32_t *Ap = Bp + (size_t)ncmax * (kcmax / 2);
  const int MA = a_rows(M, kx, AMX_MR);
  uint32_t low = 0;
  amx_begin();
  for (int ia = 0; ia < M && !low; ia += MA) {
    const int ma = M - ia < MA ? M - ia : MA;
    low |= amx_pack_rows(Ap, kpw, sa->f, sa->ld, sa->kcontig, sa->rnd, ia, ma, round_up(ma, AMX_MR),
                         K);
    float *Ca = C + (size_t)ia * ldc;
    for (int jc = 0; jc < N && !low; jc += NC) {
      const int nc = N - jc < NC ? N - jc : NC;
      for (int pc = 0; pc < K && !low; pc += KC) {
        const int kc = K - pc < KC ? K - pc : KC, groups = (kc + 1) / 2;
        const int gx = round_up(groups, AMX_KG);
        for (int jr = 0; jr < nc; jr += AMX_NR) {
          uint32_t *panel = Bp + (size_t)(jr / AMX_NR) * gx * AMX_NR;
          low |= pack16_panel(1, panel, AMX_NR, sb, jc + jr, nc - jr < AMX_NR ? nc - jr : AMX_NR,
                              pc, kc);
          memset(panel + (size_t)groups * AMX_NR, 0, (size_t)(gx - groups) * AMX_NR * 4);
        }
        if (low) break; /* beta is 0 here (checked before): the caller redoes the product */
        const float bk = pc ? 1.0f : beta;
        for (int ic = 0; ic < ma; ic += MC_AMX) {
          const int mc = ma - ic < MC_AMX ? ma - ic : MC_AMX;
          for (int jr = 0; jr < nc; jr += AMX_NR)
            for (int ir = ic; ir < ic + mc; ir += AMX_MR)
              amx_kernel(gx, Ap + (size_t)ir * kpw + pc / 2, kpw,
                         Bp + (size_t)(jr / AMX_NR) * gx * AMX_NR, Ca + (size_t)ir * ldc + jc + jr,
                         ldc, ma - ir < AMX_MR ? ma - ir : AMX_MR,
                         nc - jr < AMX_NR ? nc - jr : AMX_NR, alpha, bk);
        }
      }
    }
  }
  amx_end();
  return low ? -1 : 0;
}

/* gemm16_amx in GotoBLAS order: per column block and K slice, B packed once, then A
 * packed slice by slice per row block. gemm16_amx packs op(A) with all of K instead, once,
 * and B again for every block of A's rows; where A needs more than one block (a long K: the
 * logits' gradient over the vocabulary, K = V) and B is the wider operand, this order packs
 * less. */
static int gemm16_amx_goto(int M, int N, int K, float alpha, const struct src *sa,
                           const struct src *sb, float beta, float *C, int ldc, void *work) {
  const int kcmax = K < KC ? round_up(K, 2 * AMX_KG) : KC;
  const int ncmax = N < NC ? round_up(N, AMX_NR) : NC;
  uint32_t *Bp = (uint32_t *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
  uint32_t *Ap = Bp + (size_t)ncmax * (kcmax / 2);
  uint32_t low = 0;
  amx_begin();
  for (int jc = 0; jc < N && !low; jc += NC) {
    const int nc = N - jc < NC ? N - jc : NC;
    for (int pc = 0; pc < K && !low; pc += KC) {
      const int kc = K - pc < KC ? K - pc : KC, groups = (kc + 1) / 2;
      const int gx = round_up(groups, AMX_KG); /* packed pairs per row */
      for (int jr = 0; jr < nc; jr += AMX_NR) {
        uint32_t *panel = Bp + (size_t)(jr / AMX_NR) * gx * AMX_NR;
        low |= pack16_panel(1, panel, AMX_NR, sb, jc + jr, nc - jr < AMX_NR ? nc - jr : AMX_NR, pc,
                            kc);
        memset(panel + (size_t)groups * AMX_NR, 0, (size_t)(gx - groups) * AMX_NR * 4);
      }
      const float bk = pc ? 1.0f : beta;
      for (int ic = 0; ic < M && !low; ic += MC_AMX) {
        const int mc = M - ic < MC_AMX ? M - ic : MC_AMX;
        low |= amx_pack_rows(Ap, gx, sa->kcontig ? sa->f + pc : sa->f + (size_t)pc * sa->ld, sa->ld,
                             sa->kcontig, sa->rnd, ic, mc, round_up(mc, AMX_MR), kc);
        if (low) break; /* beta is 0 here (checked before): the caller redoes the product */
        for (int jr = 0; jr < nc; jr += AMX_NR) {
          const uint32_t *b = Bp + (size_t)(jr / AMX_NR) * gx * AMX_NR;
          for (int ir = 0; ir < mc; ir += AMX_MR)
            amx_kernel(gx, Ap + (size_t)ir * gx, gx, b, C + (size_t)(ic + ir) * ldc + jc + jr, ldc,
                       mc - ir < AMX_MR ? mc - ir : AMX_MR, nc - jr < AMX_NR ? nc - jr : AMX_NR,
                       alpha, bk);
        }
      }
    }
  }
  amx_end();
  return low ? -1 : 0;
}

/* Rows of A per block of the kernel loops: the fewest blocks of at most MC rows, as equal
 * as whole micro-panels make them (512 rows: two of 256, not 336 and 176). */
static int row_block(int M) {
  const int blocks = (M + MC - 1) / MC;
  return round_up((M + blocks - 1) / blocks, G16_MR);
}

typedef void kernel_fn(int groups, const uint32_t *a, const uint32_t *b, float *C, int ldc, int m,
                       int n, float alpha, float beta, const struct pf *pf, int l0, int l1);

/* The kernel calls of one B micro-panel b (n columns, `groups` pairs of K) on rows [0, mc)
 * of a block of A's micro-panels As, into C (leading dim ldc) with beta bk; when `pack`, the
 * panel is packed first (op(B)'s columns [j0, j0 + n), K range [k0, k0 + kc)) and the calls
 * share out the prefetch of `next`'s lines. Returns the packer's OR of dropped low halves. */
static uint32_t panel_calls(int kernel, kernel_fn *tile, uint32_t *b, int pack,
                            const struct src *sb, int j0, int n, int k0, int kc,
                            const struct pf *next, const uint32_t *As, int mc, float *C, int ldc,
                            float alpha, float bk) {
  const int groups = (kc + 1) / 2;
  uint32_t low = 0;
  if (pack) low = pack16_panel(kernel >= G16_AVX512, b, G16_NR, sb, j0, n, k0, kc);
  const int total = pack ? next->total : 0, calls = (mc + G16_MR - 1) / G16_MR;
  const int per = (total + calls - 1) / calls;
  for (int ir = 0, l0 = 0; ir < mc; ir += G16_MR, l0 += per)
    tile(groups, As + (size_t)(ir / G16_MR) * groups * G16_MR, b, C + (size_t)ir * ldc, ldc,
         mc - ir < G16_MR ? mc - ir : G16_MR, n, alpha, bk, next, l0 < total ? l0 : total,
         l0 + per < total ? l0 + per : total);
  return low;
}

/* The product on the AVX512-BF16 (or the portable) kernel. op(A) packed with all of K, in
 * blocks of up to A_CAP bytes; per block, op(B) in blocks of columns with all of K (up to
 * B_CAP bytes), and for each MC rows of A and NR columns of B every K slice in turn: the
 * MC x NR block of C stays in the cache from slice to slice instead of going to memory and
 * back once per slice (15% of a logits product's time). B's panels are packed as the first
 * MC rows reach them, the kernel calls before each prefetching the next one's operand (so
 * that reading a weight from memory overlaps the products: with a few rows of A, as the
 * experts' blocks have, packing would otherwise cost about as much as the products); later
 * rows reuse them. */
static int gemm16_tiles(int kernel, int M, int N, int K, float alpha, const struct src *sa,
                        const struct src *sb, float beta, float *C, int ldc, void *work) {
  kernel_fn *tile = kernel >= G16_AVX512 ? kernel_simd : kernel_scalar;
  const int kw = (K + 1) / 2, NB = b_cols(N, K); /* words per panel row; columns per block */
  uint32_t *Bp = (uint32_t *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
  uint32_t *Ap = Bp + (size_t)NB * kw;
  const int MA = a_rows(M, K, G16_MR);
  uint32_t low = 0;
  for (int ia = 0; ia < M; ia += MA) { /* rows of op(A) packed at once, with all of K */
    const int ma = M - ia < MA ? M - ia : MA, Mr = round_up(ma, G16_MR), mcb = row_block(ma);
    float *Ca = C + (size_t)ia * ldc;
    for (int pc = 0; pc < K; pc += KC)
      low |= pack16_panels(kernel >= G16_AVX512, Ap + (size_t)Mr * (pc / 2), G16_MR, sa, ia, ma, pc,
                           K - pc < KC ? K - pc : KC);
    if (low) return -1; /* with beta != 0 nothing is written yet (checked before) */
    for (int jc = 0; jc < N; jc += NB) {
      const int nb = N - jc < NB ? N - jc : NB;
      for (int ic = 0; ic < ma; ic += mcb) {
        const int mc = ma - ic < mcb ? ma - ic : mcb;
        for (int jr = 0; jr < nb; jr += G16_NR) {
          const int n = nb - jr < G16_NR ? nb - jr : G16_NR, j = jc + jr;
          for (int pc = 0; pc < K; pc += KC) {
            const int kc = K - pc < KC ? K - pc : KC, groups = (kc + 1) / 2;
            struct pf next = {0};
            if (ic == 0 && pc + KC < K) /* what is packed next: this panel's next slice, */
              next = pack16_lines(sb, j, n, pc + KC, K - pc - KC < KC ? K - pc - KC : KC);
            else if (ic == 0 && j + G16_NR < N) /* or the next panel's first */
              next = pack16_lines(sb, j + G16_NR, N - j - G16_NR < G16_NR ? N - j - G16_NR : G16_NR,
                                  0, K < KC ? K : KC);
            /* one block of rows: the panel is used once, packed where the last one was */
            uint32_t *b =
                mcb >= ma ? Bp
                          : Bp + (size_t)(jr / G16_NR) * kw * G16_NR + (size_t)(pc / 2) * G16_NR;
            low |= panel_calls(kernel, tile, b, ic == 0, sb, j, n, pc, kc, &next,
                               Ap + (size_t)Mr * (pc / 2) + (size_t)(ic / G16_MR) * groups * G16_MR,
                               mc, Ca + (size_t)ic * ldc + j, ldc, alpha, pc ? 1.0f : beta);
            if (low) return -1; /* beta is 0 here: what was written is the caller's to redo */
          }
        }
      }
    }
  }
  return 0;
}

/* gemm16_tiles in GotoBLAS order, where op(A) would take several blocks and B is the wider
 * operand (a long K: the logits' gradient over the vocabulary, K = V): per column block and
 * K slice, B packed once (panels as the first rows reach them, as in gemm16_tiles), A per
 * slice and block of MC rows. */
static int gemm16_tiles_goto(int kernel, int M, int N, int K, float alpha, const struct src *sa,
                             const struct src *sb, float beta, float *C, int ldc, void *work) {
  kernel_fn *tile = kernel >= G16_AVX512 ? kernel_simd : kernel_scalar;
  const int kcmax = K < KC ? round_up(K, 2) : KC;
  const int ncmax = N < NC ? round_up(N, G16_NR) : NC;
  uint32_t *Bp = (uint32_t *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
  uint32_t *Ap = Bp + (size_t)ncmax * (kcmax / 2);
  const int mcb = row_block(M);
  uint32_t low = 0;
  for (int jc = 0; jc < N; jc += NC) {
    const int nc = N - jc < NC ? N - jc : NC;
    for (int pc = 0; pc < K; pc += KC) {
      const int kc = K - pc < KC ? K - pc : KC, groups = (kc + 1) / 2;
      for (int ic = 0; ic < M; ic += mcb) {
        const int mc = M - ic < mcb ? M - ic : mcb;
        low |= pack16_panels(kernel >= G16_AVX512, Ap, G16_MR, sa, ic, mc, pc, kc);
        for (int jr = 0; jr < nc && !low; jr += G16_NR) {
          const int n = nc - jr < G16_NR ? nc - jr : G16_NR, j = jc + jr;
          struct pf next = {0}; /* the next panel of this slice, or the next slice's first */
          if (ic == 0 && jr + G16_NR < nc)
            next = pack16_lines(sb, j + G16_NR,
                                nc - jr - G16_NR < G16_NR ? nc - jr - G16_NR : G16_NR, pc, kc);
          else if (ic == 0 && pc + KC < K)
            next = pack16_lines(sb, jc, nc < G16_NR ? nc : G16_NR, pc + KC,
                                K - pc - KC < KC ? K - pc - KC : KC);
          /* one block of rows: the panel is used once, packed where the last one was */
          uint32_t *b = mcb >= M ? Bp : Bp + (size_t)(jr / G16_NR) * groups * G16_NR;
          low |= panel_calls(kernel, tile, b, ic == 0, sb, j, n, pc, kc, &next, Ap, mc,
                             C + (size_t)ic * ldc + j, ldc, alpha, pc ? 1.0f : beta);
        }
        if (low) return -1; /* beta is 0 here (checked before): the caller redoes the product */
      }
    }
  }
  return 0;
}

int gemm16(const struct gemm16_how *how, int transa, int transb, int M, int N, int K, float alpha,
           const float *A, int lda, const float *B, const uint16_t *B16, int ldb, float beta,
           float *C, int ldc, void *work, int rnd) {
  if (M <= 0 || N <= 0) return 0;
  const int kernel = how->kernel, order = how->order;
  const struct src sa = {A, NULL, lda, !transa, rnd};
  const struct src sb = {B16 ? NULL : B, B16, ldb, transb, rnd};
  if (beta != 0.0f && !rnd) { /* C must stay as it is if an operand turns out not to be BF16 */
    if (transa ? !gemm16_exact(A, K, M, lda) : !gemm16_exact(A, M, K, lda)) return -1;
    if (!B16 && (transb ? !gemm16_exact(B, N, K, ldb) : !gemm16_exact(B, K, N, ldb))) return -1;
  }
  if (K <= 0) {
    scale_c(C, ldc, M, N, beta);
    return 0;
  }
  if (!work && !(work = thread_work(gemm16_work_bytes(M, N, K)))) return -1;
  { /* the packing order: the one that packs fewer elements again */
    const int ma =
        kernel == G16_AMX ? a_rows(M, round_up(K, 2 * AMX_KG), AMX_MR) : a_rows(M, K, G16_MR);
    const double na = (M + ma - 1) / ma, nn = (N + NC - 1) / NC;
    const int goto_order = order == 2 || (order == 0 && na > 1 && (na - 1) * N > (nn - 1) * M) ||
                           (kernel != G16_AMX && b_cols(N, K) == 0);
    if (kernel != G16_AMX)
      return goto_order ? gemm16_tiles_goto(kernel, M, N, K, alpha, &sa, &sb, beta, C, ldc, work)
                        : gemm16_tiles(kernel, M, N, K, alpha, &sa, &sb, beta, C, ldc, work);
    if (goto_order) return gemm16_amx_goto(M, N, K, alpha, &sa, &sb, beta, C, ldc, work);
  }
  return gemm16_amx(M, N, K, alpha, &sa, &sb, beta, C, ldc, work);
}
