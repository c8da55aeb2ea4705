/* weights_plan.c: which rank writes, reads and checksums which rows of each tensor of a
 * weights file (doc/checkpoint.md, "Throughput"): the owner of each distinct slice, and the
 * groups of ranks holding the same slice that share the work on it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grid.h"
#include "util.h"
#include "util_mpi.h"
#include "weights_impl.h"

struct block weights_plan_block(const struct kd_param *p) {
  int64_t R = p->shape[0], C = p->ndim == 2 ? p->shape[1] : 1;
  struct block b = {R, C, 0, 0, C, R};
  if (p->split_dim == 0) {
    b.rows = p->split_len;
    b.row0 = p->split_off;
  } else if (p->split_dim == 1) {
    b.cols = p->split_len;
    b.col0 = p->split_off;
  }
  if (!p->local) b.rows = 0; /* another pipeline stage holds it */
  return b;
}

static int cmp_i64pair(const void *a, const void *b) {
  const int64_t *x = a, *y = b;
  return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Decide own[p]: whether this rank's slice of entry p is the one that gets written and
 * counted in the checksum (the lowest rank holding each distinct slice of a split tensor;
 * the one rank with rep_owner = 1 for a replicated tensor), and hold[2p], hold[2p + 1]: the
 * lowest rank and the number of ranks that hold the same slice as this rank (-1, 0 when
 * this rank holds none). Checks that every rank has the same table and that the distinct
 * slices tile each split dimension exactly. */
static int plan_owners(const struct kd_model *mdl, int rep_owner, int *own, int *hold,
                       MPI_Comm comm, char *err, size_t errlen) {
  enum { NF = 8 };
  int rank, size, np = mdl->nparams, npmin, npmax;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MPI_Allreduce(&np, &npmin, 1, MPI_INT, MPI_MIN, comm);
  MPI_Allreduce(&np, &npmax, 1, MPI_INT, MPI_MAX, comm);
  if (npmin != npmax) {
    kd_seterr(err, errlen, "weights: ranks disagree on the parameter count (%d vs %d)", npmin,
              npmax);
    return KD_EXIT_IO;
  }
  int64_t *mine = kd_calloc((size_t)np * NF + 1, sizeof *mine);
  int64_t *all = kd_calloc((size_t)np * NF * (size_t)size + 1, sizeof *all);
  int64_t *iv = kd_calloc(2 * (size_t)size, sizeof *iv);
  for (int p = 0; p < np; p++) {
    const struct kd_param *q = &mdl->params[p];
    int64_t f[NF] = {(int64_t)(kd_fnv1a(q->name, 0) >> 1),
                     q->split_dim,
                     q->shape[0],
                     q->ndim == 2 ? q->shape[1] : -1,
                     q->split_off,
                     q->split_len,
                     rep_owner && q->primary,
                     q->local};
    memcpy(&mine[(size_t)p * NF], f, sizeof f);
  }
  MPI_Allgather(mine, np * NF, MPI_INT64_T, all, np * NF, MPI_INT64_T, comm);
  int st = 0;
  for (int p = 0; p < np && !st; p++) {
    const struct kd_param *q = &mdl->params[p];
    int nown = 0;
    own[p] = 0;
    const int64_t *me = &all[((size_t)rank * np + p) * NF];
    hold[2 * p] = -1;
    hold[2 * p + 1] = 0;
    for (int r = 0; r < size && !st; r++) {
      const int64_t *f = &all[((size_t)r * np + p) * NF];
      if (me[7] && f[7] && (q->split_dim < 0 || (f[4] == me[4] && f[5] == me[5]))) {
        if (hold[2 * p + 1]++ == 0) hold[2 * p] = r; /* a holder of this rank's slice */
      }
      if (memcmp(f, &all[(size_t)p * NF], 4 * sizeof *f) != 0) {
        kd_seterr(err, errlen, "weights: rank %d's parameter table differs from rank 0's at %s", r,
                  q->name);
        st = KD_EXIT_IO;
      }
      /* the owner is the lowest rank holding the slice (for a replicated tensor: the
       * lowest holder among the ranks that pass rep_owner and are its primary) */
      const int rep = q->split_dim < 0;
      int first = 1;
      for (int s = 0; s < r; s++) {
        const int64_t *g = &all[((size_t)s * np + p) * NF];
        if (g[7] && (rep ? g[6] != 0 : g[4] == f[4] && g[5] == f[5])) first = 0;
      }
      int owner = f[7] && (!rep || f[6]) && first;
      if (owner) {
        iv[2 * nown] = q->split_dim < 0 ? 0 : f[4];
        iv[2 * nown + 1] = q->split_dim < 0 ? q->shape[0] : f[5];
        nown++;
      }
      if (r == rank) own[p] = owner;
    }
    if (st) break;
    int64_t extent = q->split_dim <= 0 ? q->shape[0] : q->shape[1], at = 0;
    qsort(iv, (size_t)nown, 2 * sizeof *iv, cmp_i64pair);
    for (int k = 0; k < nown && at >= 0; k++)
      at = iv[2 * k] == at ? at + iv[2 * k + 1] : -1;
    if (at != extent || (q->split_dim < 0 && nown != 1)) {
      kd_seterr(err, errlen,
                "weights: the ranks' slices of %s do not cover it exactly once (%d owner(s); one "
                "rank must pass write_replicated = 1)",
                q->name, nown);
      st = KD_EXIT_IO;
    }
  }
  free(mine);
  free(all);
  free(iv);
  return st;
}

/* Share the work on identical slices among the ranks that hold them (doc/checkpoint.md,
 * "Throughput"): data-parallel replicas, or the ranks of a stage for a replicated tensor,
 * each write, read and checksum 1/n of the slice's rows, and a read completes the slice
 * with one all-gather among them, so that the file is read once, not once per replica.
 * One communicator per distinct holder set (io->share); io->via[p] names the one whose
 * members are exactly entry p's holders (-1: not shared, this rank handles its whole
 * slice) and io->gown[p] whether that set's slice is the one counted (plan_owners' own[]
 * of its lowest member). Collective over io->comm; the same verdicts on every holder. */
static void plan_shares(struct weights_io *io, const int *hold) {
  const int np = io->mdl->nparams;
  io->via = kd_malloc(((size_t)np + 1) * sizeof *io->via);
  io->gown = kd_calloc((size_t)np + 1, sizeof *io->gown);
  int *sets = kd_malloc((2 * (size_t)np + 2) * sizeof *sets), nsets = 0, most = 0;
  for (int p = 0; p < np; p++) {
    io->via[p] = -1;
    int k = 0;
    while (k < nsets && (sets[2 * k] != hold[2 * p] || sets[2 * k + 1] != hold[2 * p + 1]))
      k++;
    if (hold[2 * p + 1] > 1 && k == nsets) {
      sets[2 * nsets] = hold[2 * p];
      sets[2 * nsets++ + 1] = hold[2 * p + 1];
    }
  }
  MPI_Allreduce(&nsets, &most, 1, MPI_INT, MPI_MAX, io->comm);
  io->nshare = most;
  io->share = kd_malloc(((size_t)most + 1) * sizeof *io->share);
  int *flag = kd_malloc(2 * ((size_t)np + 1) * sizeof *flag), *owns = flag + np + 1;
  for (int k = 0; k < most; k++) {
    /* the color names the set; a collision only makes the check below fail (not shared) */
    const int color =
        k < nsets
            ? (int)(((uint64_t)sets[2 * k] * 1000003u + (uint64_t)sets[2 * k + 1]) % 2147483647u)
            : MPI_UNDEFINED;
    io->share[k] = grid_io_comm(io->comm, color, io->rank); /* made in grid.c */
    if (io->share[k] == MPI_COMM_NULL) continue;
    int members;
    MPI_Comm_size(io->share[k], &members);
    for (int p = 0; p < np; p++) {
      flag[p] = hold[2 * p] == sets[2 * k] && hold[2 * p + 1] == sets[2 * k + 1] &&
                hold[2 * p + 1] == members;
      owns[p] = io->own[p];
    }
    MPI_Allreduce(MPI_IN_PLACE, flag, np, MPI_INT, MPI_MIN, io->share[k]);
    MPI_Allreduce(MPI_IN_PLACE, owns, np, MPI_INT, MPI_MAX, io->share[k]);
    for (int p = 0; p < np; p++)
      if (flag[p]) {
        io->via[p] = k;
        io->gown[p] = owns[p];
      }
  }
  free(flag);
  free(sets);
}

/* Rows [*lo, *hi) of `rows` that this rank handles of shared entry p (all when not shared). */
static void share_rows(const struct weights_io *io, int p, int64_t rows, int64_t *lo, int64_t *hi) {
  *lo = 0;
  *hi = rows;
  if (!io->via || io->via[p] < 0) return;
  int n, me;
  MPI_Comm_size(io->share[io->via[p]], &n);
  MPI_Comm_rank(io->share[io->via[p]], &me);
  *lo = rows * me / n;
  *hi = rows * (me + 1) / n;
}

/* This rank's part of entry p: its rows of the slice's block (param_block); *first: the
 * part's first element in the block; *counted: whether it is written and checksummed. */
struct block weights_plan_part(const struct weights_io *io, int p, int64_t *first, int *counted) {
  struct block b = weights_plan_block(&io->mdl->params[p]);
  int64_t lo, hi;
  share_rows(io, p, b.rows, &lo, &hi);
  *first = lo * b.cols;
  *counted = io->via && io->via[p] >= 0 ? io->gown[p] : io->own[p];
  b.row0 += lo;
  b.rows = hi - lo;
  return b;
}

/* Completing a shared entry's slice from the rows its holders read: one non-blocking
 * all-gather among them (io->share), started after this rank's own rows were read and
 * finished after the next entry's read, so that the exchange overlaps the file system. */

int weights_plan(struct weights_io *io, int rep_owner, char *err, size_t errlen) {
  const struct kd_model *mdl = io->mdl;
  io->own = kd_calloc((size_t)mdl->nparams + 1, sizeof *io->own);
  int *hold = kd_malloc((2 * (size_t)mdl->nparams + 1) * sizeof *hold);
  int st = kd_agree(plan_owners(mdl, rep_owner, io->own, hold, io->comm, err, errlen), err, errlen,
                    io->comm);
  if (!st) plan_shares(io, hold);
  free(hold);
  return st;
}

void weights_plan_free(struct weights_io *io) {
  free(io->own);
  io->own = NULL;
  for (int k = 0; k < io->nshare; k++)
    grid_comm_free(&io->share[k]);
  free(io->share);
  free(io->via);
  free(io->gown);
  io->share = NULL;
  io->via = io->gown = NULL;
  io->nshare = 0;
}
