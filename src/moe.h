/* moe.h: the order in which a mixture-of-experts layer runs its tokens. From the router's
 * choices idx (N tokens x k experts), a counting sort stable in (token, slot) order gives
 * each expert one contiguous block of rows: the experts' products are then one GEMM per
 * expert over its block (grouped GEMMs, no per-token loop), and moe_combine brings every
 * (token, slot) row back through `pos`. Host memory; the caller uploads rows and pos. */
#ifndef KD_MOE_H
#define KD_MOE_H

#include <stddef.h>

struct moe_plan {
  size_t N;    /* tokens */
  int E, k;    /* experts, experts per token */
  int *count;  /* (E) rows of each expert */
  int *offset; /* (E + 1) first row of each expert's block; offset[E] = N * k */
  int *rows;   /* (N * k) the token of each row, experts' blocks in expert order */
  int *pos;    /* (N, k) the row of token t's j-th expert */
};

/* Plan the rows of idx (N, k: expert ids in [0, E)). */
void moe_plan_make(struct moe_plan *p, const int *idx, size_t N, int E, int k);
void moe_plan_free(struct moe_plan *p);

#endif
