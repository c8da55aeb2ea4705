/* loss.c: chunked fused distillation / cross-entropy loss (orchestration only:
 * the elementwise math lives in the backend's loss-chunk ops).
 *
 * Per chunk of n rows: student logits zs = hs ws^T (and teacher zt = ht wt^T)
 * in two KD_MEM_LOSS buffers; per-row softmax stats; with tensor parallelism one
 * all-reduce of the (max, sum) pairs (user-defined op) and one all-reduce (SUM)
 * of the per-row partial sums; then the gradient is written over zs and pushed
 * into dhs and dws by two gemms. The full (N x V) logits never exist. When the
 * student has ids the teacher lacks (or the reverse), zt covers only the common ids:
 * the first voc->common columns of the slice (grid_vocab_block puts them first). */
#include "loss.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#include "comm.h"
#include "grid.h"
#include "tcache.h"
#include "util.h"

/* Partial sums per row (see loss_partials): KD, sum p_s g (jsd), CE. */
#define PART_W 3

/* --- the (max, sum of exponentials) reduction ------------------------------------- */

static MPI_Datatype stats_type = MPI_DATATYPE_NULL; /* a (max, sum) float pair */
static MPI_Op stats_op = MPI_OP_NULL;

/* inout := combine(in, inout) on float pairs (m, s): rescale both sums to the
 * larger max. A pair with s == 0 (empty slice) is the identity. */
static void stats_combine(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  const float *a = in;
  float *b = inout;
  for (int i = 0; i < *len; i++) {
    float m1 = a[2 * i], s1 = a[2 * i + 1], m2 = b[2 * i], s2 = b[2 * i + 1];
    if (s1 == 0.0f) continue;
    if (s2 == 0.0f) {
      b[2 * i] = m1;
      b[2 * i + 1] = s1;
      continue;
    }
    float m = m1 > m2 ? m1 : m2;
    b[2 * i] = m;
    b[2 * i + 1] = (float)((double)s1 * exp((double)m1 - m) + (double)s2 * exp((double)m2 - m));
  }
}

/* Attribute-delete callback on MPI_COMM_SELF: runs inside MPI_Finalize. */
static int stats_op_free(MPI_Comm comm, int key, void *val, void *extra) {
  (void)comm, (void)key, (void)val, (void)extra;
  MPI_Op_free(&stats_op);
  MPI_Type_free(&stats_type);
  return MPI_SUCCESS;
}

/* Create the pair type and the reduction once; freed at MPI_Finalize. */
static void stats_op_init(void) {
  if (stats_op != MPI_OP_NULL) return;
  int key;
  MPI_Type_contiguous(2, MPI_FLOAT, &stats_type);
  MPI_Type_commit(&stats_type);
  MPI_Op_create(stats_combine, 1, &stats_op);
  MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, stats_op_free, &key, NULL);
  MPI_Comm_set_attr(MPI_COMM_SELF, key, NULL);
  MPI_Comm_free_keyval(&key);
}

/* --- public ------------------------------------------------------------------------- */

void loss_vocab_slice(struct loss_vocab *v, int V, int vocab_common, int tp, int r) {
  long long lo, n, clo, cn;
  grid_vocab_block(V, vocab_common, tp, r, &lo, &n);
  grid_block(vocab_common, tp, r, &clo, &cn);
  v->lo = (int)lo;
  v->n = (int)n;
  v->common = (int)cn;
  v->split = vocab_common < V;
}

/* Stats blocks of a chunk: student at tau over the KD columns, teacher at tau, student
 * at 1 over all its columns (CE; shared with the first when tau is 1 and the two
 * column ranges are the same on every rank). */
static int loss_nstats(int distill, float temperature, int split) {
  return (distill ? 2 : 0) + (!distill || temperature != 1.0f || split);
}

/* Bytes of loss buffers per chunk row (the most stats blocks a run can need). */
static size_t loss_row_bytes(int V, int distill, int capped) {
  return (size_t)V * sizeof(float) * ((distill ? 2 : 1) + (capped ? 1 : 0)) +
         3 * 2 * sizeof(float) + PART_W * sizeof(double);
}

/* Bytes of loss buffers that do not depend on the chunk: the labels of all N rows
 * (uploaded once per call) and the two totals. */
static size_t loss_fixed_bytes(size_t N) {
  return N * sizeof(int) + 2 * sizeof(double);
}

size_t loss_buffer_bytes(size_t chunk, size_t N, const struct loss_vocab *voc, int distill,
                         float temperature, int capped) {
  const size_t stats = (size_t)loss_nstats(distill, temperature, voc->split) * 2 * sizeof(float);
  const size_t cols = (size_t)voc->n * (capped ? 2 : 1) + /* zs (and its capped copy), zt */
                      (distill ? (size_t)voc->common : 0);
  return chunk * (cols * sizeof(float) + stats + PART_W * sizeof(double)) + loss_fixed_bytes(N);
}

size_t loss_chunk_from_budget(size_t budget_bytes, size_t N, int V, int distill, int capped) {
  const size_t fixed = loss_fixed_bytes(N);
  size_t n = (budget_bytes > fixed ? budget_bytes - fixed : 0) / loss_row_bytes(V, distill, capped);
  return n > 0 ? n : 1;
}

/* loss_chunked and loss_chunked_cache: the teacher logits of a chunk come from the
 * teacher's LM head (t) or, when tc != NULL, from cached sparse rows (capped when the
 * cache was made). */
static void loss_run(struct kd_backend *be, const struct loss_spec *spec, struct loss_sums *sums,
                     const struct loss_student *s, const struct loss_teacher *t,
                     const struct tcache_rows *tc, const int *labels, size_t N,
                     const struct loss_vocab *voc, size_t chunk, float grad_scale, MPI_Comm tp_comm,
                     const struct loss_caps *caps) {
  const int distill = spec->distill;
  const float *hs = s->h, *ws = s->w;
  float *dhs = s->dh, *dws = s->dw;
  const int Cs = s->C;
  KD_CHECK(!distill || tc || t, "loss_chunked: distillation without a teacher");
  const int V = voc->n, Vk = distill ? voc->common : V, vocab_lo = voc->lo; /* CE, KD columns */
  const float tau = distill ? spec->temperature : 1.0f, inv_t = 1.0f / tau;
  const int need_s1 = !distill || tau != 1.0f || voc->split;
  const int nstats = loss_nstats(distill, tau, voc->split);
  const float t2 = distill && spec->t2_scale ? tau * tau : 1.0f;
  const float wkd = distill ? grad_scale * spec->alpha * t2 : 0.0f;
  const float wce = distill ? grad_scale * (1.0f - spec->alpha) : grad_scale;
  KD_CHECK(chunk > 0, "loss_chunked: chunk must be at least 1 row");
  KD_CHECK(Vk <= V && (Vk == V || voc->split), "loss_chunked: %d KD columns of %d", Vk, V);
  if (chunk > N) chunk = N > 0 ? N : 1;
  KD_CHECK(chunk * (size_t)nstats <= INT_MAX / PART_W, "loss_chunked: chunk %zu too large", chunk);
  int tp = 1;
  MPI_Comm_size(tp_comm, &tp);
  if (tp > 1) stats_op_init();

  float *zs = be->alloc(be, KD_MEM_LOSS, chunk * (size_t)V * sizeof(float));
  float *zt = distill ? be->alloc(be, KD_MEM_LOSS, chunk * (size_t)Vk * sizeof(float)) : NULL;
  /* the student's capped logits, kept for the cap's gradient (loss_grad overwrites zs) */
  const float scap = caps ? caps->student : 0.0f, tcap = caps && distill && !tc ? caps->teacher : 0;
  float *zc = scap > 0 ? be->alloc(be, KD_MEM_LOSS, chunk * (size_t)V * sizeof(float)) : NULL;
  float *stats = be->alloc(be, KD_MEM_LOSS, chunk * (size_t)nstats * 2 * sizeof(float));
  double *part = be->alloc(be, KD_MEM_LOSS, chunk * PART_W * sizeof(double));
  int *lab = be->alloc(be, KD_MEM_LOSS, N * sizeof(int));       /* all labels: one upload */
  double *acc = be->alloc(be, KD_MEM_LOSS, 2 * sizeof(double)); /* (KD, CE) sums */
  be->upload(be, lab, labels, N * sizeof(int));
  float *stage = distill && tc && be->device /* host twin of zt for the cached rows */
                     ? be->alloc(be, KD_MEM_HOST, chunk * (size_t)Vk * sizeof(float))
                     : NULL;
  const double kd_off = distill && tc ? tcache_kd_offset(tc, labels, N) : 0.0;

  for (size_t r0 = 0; r0 < N; r0 += chunk) {
    const size_t n = N - r0 < chunk ? N - r0 : chunk;
    const int ni = (int)n;
    const float *hs_c = hs + r0 * (size_t)Cs;
    const int *lab_c = lab + r0;
    /* stats blocks of this chunk, contiguous so one all-reduce covers them */
    float *ss = distill ? stats : NULL, *st = distill ? stats + 2 * n : NULL;
    float *s1 = need_s1 ? stats + 2 * n * (size_t)(nstats - 1) : ss; /* shared */

    be->gemm(be, 0, 1, ni, V, Cs, 1.0f, hs_c, Cs, ws, Cs, 0.0f, zs, V);
    if (distill && tc)
      tcache_fill(be, zt, stage, tc, r0, n, vocab_lo, Vk, tau);
    else if (distill && t->w16) /* the teacher's first Vk rows: the student's first Vk ids */
      be->gemm_w16(be, 0, ni, Vk, t->C, 1.0f, t->h + r0 * (size_t)t->C, t->C, t->w16, t->C, 0.0f,
                   zt, Vk);
    else if (distill)
      be->gemm(be, 0, 1, ni, Vk, t->C, 1.0f, t->h + r0 * (size_t)t->C, t->C, t->w, t->C, 0.0f, zt,
               Vk);
    if (be->bf16) {
      be->round_bf16(be, zs, n * (size_t)V);
      if (distill && !tc) be->round_bf16(be, zt, n * (size_t)Vk);
    }
    if (scap > 0) { /* final_logit_softcapping: c tanh(z / c), stored as the logits are */
      be->softcap_forward(be, zs, n * (size_t)V, scap);
      if (be->bf16) be->round_bf16(be, zs, n * (size_t)V);
      be->copy(be, zc, zs, n * (size_t)V);
    }
    if (tcap > 0) {
      be->softcap_forward(be, zt, n * (size_t)Vk, tcap);
      if (be->bf16) be->round_bf16(be, zt, n * (size_t)Vk);
    }

    if (distill) {
      be->softmax_stats(be, ss, zs, n, Vk, V, inv_t);
      be->softmax_stats(be, st, zt, n, Vk, Vk, inv_t);
    }
    if (need_s1) be->softmax_stats(be, s1, zs, n, V, V, 1.0f);
    if (tp > 1) comm_allreduce(be, stats, (size_t)nstats * n, stats_type, stats_op, 1, tp_comm);

    be->loss_partials(be, part, zs, zt, ss, st, s1, lab_c, n, V, Vk, vocab_lo, spec->kind, inv_t,
                      spec->beta);
    if (tp > 1) comm_allreduce(be, part, PART_W * n, MPI_DOUBLE, MPI_SUM, 0, tp_comm);
    be->loss_accumulate(be, acc, part, n);

    if (!dhs) continue; /* forward only */
    be->loss_grad(be, zs, zt, ss, st, s1, part, lab_c, n, V, Vk, vocab_lo, spec->kind, inv_t,
                  spec->beta, wkd, wce);
    if (scap > 0) be->softcap_backward(be, zs, zc, n * (size_t)V, scap);
    be->gemm(be, 0, 0, ni, Cs, V, 1.0f, zs, V, ws, Cs, 1.0f, dhs + r0 * (size_t)Cs, Cs);
    if (dws) be->gemm(be, 1, 0, V, Cs, ni, 1.0f, zs, V, hs_c, Cs, 1.0f, dws, Cs);
  }

  double total[2];
  be->download(be, total, acc, sizeof total);
  sums->kd = distill ? (total[0] + kd_off) * t2 : 0.0;
  sums->ce = total[1];
  be->free(be, acc);
  be->free(be, lab);
  be->free(be, part);
  be->free(be, stats);
  if (zc) be->free(be, zc);
  if (zt) be->free(be, zt);
  if (stage) be->free(be, stage);
  be->free(be, zs);
}

void loss_chunked(struct kd_backend *be, const struct loss_spec *spec, struct loss_sums *sums,
                  const struct loss_student *s, const struct loss_teacher *t, const int *labels,
                  size_t N, const struct loss_vocab *voc, size_t chunk, float grad_scale,
                  MPI_Comm tp_comm) {
  loss_run(be, spec, sums, s, t, NULL, labels, N, voc, chunk, grad_scale, tp_comm, NULL);
}

void loss_chunked_capped(struct kd_backend *be, const struct loss_spec *spec,
                         struct loss_sums *sums, const struct loss_student *s,
                         const struct loss_teacher *t, const int *labels, size_t N,
                         const struct loss_vocab *voc, size_t chunk, float grad_scale,
                         MPI_Comm tp_comm, const struct loss_caps *caps) {
  loss_run(be, spec, sums, s, t, NULL, labels, N, voc, chunk, grad_scale, tp_comm, caps);
}

void loss_chunked_cache(struct kd_backend *be, const struct loss_spec *spec, struct loss_sums *sums,
                        const struct loss_student *s, const struct tcache_rows *tc,
                        const int *labels, size_t N, const struct loss_vocab *voc, size_t chunk,
                        float grad_scale, MPI_Comm tp_comm, const struct loss_caps *caps) {
  loss_run(be, spec, sums, s, NULL, tc, labels, N, voc, chunk, grad_scale, tp_comm, caps);
}
