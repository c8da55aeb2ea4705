/* grid.h: the rank layout. MPI_COMM_WORLD is split into tensor- (tp), data- (dp)
 * and pipeline-parallel (pp) groups; tp varies fastest, then dp, then pp (as in
 * Megatron-LM): world rank = tp_rank + tp * (dp_rank + dp * pp_rank). */
#ifndef KD_GRID_H
#define KD_GRID_H

#include <mpi.h>
#include <stddef.h>

struct kd_grid {
  int world, rank;
  int tp, pp, dp;
  int tp_rank, pp_rank, dp_rank;
  MPI_Comm tp_comm; /* ranks of my (pp, dp) that split tensors */
  MPI_Comm dp_comm; /* ranks of my (pp, tp) that hold the same shard of the model */
  MPI_Comm pp_comm; /* ranks of my (tp, dp) that form one pipeline */
};

/* The data-parallel size of tp x pp (x dp; 0: world / (tp * pp)) on `world` ranks into
 * *dp_out, or KD_EXIT_INPUT with a message in err when the layout does not fit. No MPI
 * call: --dry-run --ranks N checks with it what grid_init refuses. */
int grid_layout(int world, int tp, int pp, int dp, int *dp_out, char *err, size_t errlen);

/* Build the layout for the world size (dp = 0: world / (tp * pp)). Collective over
 * MPI_COMM_WORLD. Returns KD_EXIT_INPUT with a message in err when it does not fit. */
int grid_init(struct kd_grid *g, int tp, int pp, int dp, char *err, size_t errlen);
void grid_free(struct kd_grid *g);

/* This rank's index among the ranks of its node (selects its GPU). Collective over
 * MPI_COMM_WORLD. */
int grid_node_rank(void);

/* World rank of the pipeline neighbour at stage pp_rank + delta (MPI_PROC_NULL
 * outside the pipeline). */
int grid_pp_peer(const struct kd_grid *g, int delta);

/* First layer and layer count of pipeline stage `stage` for a model of `layers`
 * layers: the first (layers % pp) stages hold one layer more. */
void grid_stage_layers(int layers, int pp, int stage, int *first, int *count);

/* Start and length of block `r` of `n` items split over `parts` (the first n % parts
 * blocks hold one more). */
void grid_block(long long n, int parts, int r, long long *start, long long *len);

/* Start and length of TP rank r's slice of a vocabulary of V ids of which the first Vc
 * (the ids teacher and student share) are split by grid_block(Vc, tp, r) and the
 * padding ids [Vc, V) go to the last rank: both models' slices then begin with the
 * same common ids. Vc == V is plain grid_block. */
void grid_vocab_block(long long V, long long Vc, int tp, int r, long long *start, long long *len);

#endif
