/* grid.h: the rank layout, and every communicator of the program (as Megatron-LM's
 * parallel_state: no other file splits a communicator). MPI_COMM_WORLD is split into
 * tensor- (tp), data- (dp) and pipeline-parallel (pp) groups; tp varies fastest, then dp,
 * then pp (as in Megatron-LM): world rank = tp_rank + tp * (dp_rank + dp * pp_rank).
 * The node group (ranks sharing memory) comes with the grid; the groups that depend on a
 * model (kv heads replicated over tp ranks, tied embeddings on the first and last stage)
 * and the I/O groups of a file's tensors are made here on request, held by their user. */
#ifndef KD_GRID_H
#define KD_GRID_H

#include <mpi.h>
#include <stddef.h>

struct kd_grid {
  int world, rank;
  int tp, pp, dp;
  int tp_rank, pp_rank, dp_rank;
  MPI_Comm tp_comm;   /* ranks of my (pp, dp) that split tensors */
  MPI_Comm dp_comm;   /* ranks of my (pp, tp) that hold the same shard of the model */
  MPI_Comm pp_comm;   /* ranks of my (tp, dp) that form one pipeline */
  MPI_Comm node_comm; /* ranks on my node (sharing memory) */
  int node_rank, node_size;
  /* expert parallelism (grid_ep_init; grid_init leaves ep 1): my dp group's ep ranks
   * exchange tokens, and the edp = dp / ep ranks holding my experts sum their gradients */
  int ep, ep_rank;   /* ep_rank = dp_rank % ep */
  int edp, edp_rank; /* edp_rank = dp_rank / ep */
  MPI_Comm ep_comm;  /* my ep group (MPI_COMM_NULL when ep == 1) */
  MPI_Comm edp_comm; /* the ranks holding my experts (dp_comm itself when ep == 1) */
};

/* The data-parallel size of tp x pp (x dp; 0: world / (tp * pp)) on `world` ranks into
 * *dp_out, or KD_EXIT_INPUT with a message in err when the layout does not fit. No MPI
 * call: --dry-run --ranks N checks with it what grid_init refuses. */
int grid_layout(int world, int tp, int pp, int dp, int *dp_out, char *err, size_t errlen);

/* Build the layout for the world size (dp = 0: world / (tp * pp)). Collective over
 * MPI_COMM_WORLD. Returns KD_EXIT_INPUT with a message in err when it does not fit. */
int grid_init(struct kd_grid *g, int tp, int pp, int dp, char *err, size_t errlen);
void grid_free(struct kd_grid *g);

/* This rank's index among the ranks of its node (selects its GPU), before a grid exists
 * (grid->node_rank after). Collective over MPI_COMM_WORLD. */
int grid_node_rank(void);

/* CPUs per rank on this node: the union of the affinity masks of the node's ranks,
 * capped by the cgroup's CPU limit, over their number (ranks bound to one core each, or
 * all unbound, both count right). Collective over g->node_comm. */
double grid_node_cores_per_rank(const struct kd_grid *g);

/* First thing after MPI_Init in every program that computes: this rank's compute threads
 * set to its share of its node's CPUs (kd_threads_init: the node's ranks, the union of
 * their affinity masks, the cgroup limit; a user's OMP_NUM_THREADS wins), a warning from
 * the node's first rank when the node is oversubscribed; returns this rank's index on
 * its node. Collective over MPI_COMM_WORLD. */
int grid_node_setup(void);

/* "threads per rank N (why)": the compute threads grid_node_setup chose, for start lines. */
void grid_threads_describe(char *buf, size_t n);

/* The group of the tp ranks holding the same replicated kv heads (tp rank r in group
 * r / kv_rep): their kv gradients are partial sums. MPI_COMM_NULL when tp == 1 or the kv
 * heads are split. Collective over g->tp_comm. The caller frees it (grid_comm_free). */
MPI_Comm grid_kv_comm(const struct kd_grid *g, int kv_split, int kv_rep);

/* The group of the first and last pipeline stage, which both hold a tied embedding
 * (MPI_COMM_NULL on the other stages, or when pp == 1 or the embedding is untied).
 * Collective over g->pp_comm. */
MPI_Comm grid_embedding_comm(const struct kd_grid *g, int tied);

/* Expert parallelism: the dp ranks of a (tp rank, stage) split into dp / ep groups of ep
 * consecutive dp ranks; each group holds every expert once (expert e on its rank
 * e / (E / ep)) and exchanges tokens inside (*ep_comm, ranked by dp_rank % ep); the ranks
 * of the other groups at the same place hold the same experts and sum their gradients
 * (*edp_comm, dp / ep ranks). 0, or KD_EXIT_INPUT with a message in err when ep does not
 * divide dp or the E experts (no MPI call: --dry-run checks with it). */
int grid_ep_layout(int dp, int ep, int experts, char *err, size_t errlen);
/* The two groups of grid_ep_layout. Collective over g->dp_comm; the caller frees them. */
void grid_ep_comms(const struct kd_grid *g, int ep, MPI_Comm *ep_comm, MPI_Comm *edp_comm);
/* Give the grid ep expert-parallel ranks (g->ep .. g->edp_comm; grid_free frees them).
 * Collective over g->dp_comm when ep > 1. KD_EXIT_INPUT with a message in err when ep does
 * not divide dp (experts: 0, or the experts ep must divide too). */
int grid_ep_init(struct kd_grid *g, int ep, int experts, char *err, size_t errlen);

/* An I/O sharing group: the ranks of `comm` that pass the same `color` (MPI_UNDEFINED:
 * none, MPI_COMM_NULL returned), ordered by `key`. Collective over comm. */
MPI_Comm grid_io_comm(MPI_Comm comm, int color, int key);

/* Free a communicator made here (MPI_COMM_NULL: nothing). */
void grid_comm_free(MPI_Comm *c);

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
