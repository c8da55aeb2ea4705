/* uld.h: the host-side math of cross-tokenizer distillation (issue 39) as TRL's GOLD computes
 * it (trl 1.16, trl/experimental/gold: ULDLoss with use_extended_uld and the default "observed"
 * token merge, optionally the hybrid loss), in plain C on host memory: no MPI, no backend.
 *
 * GOLD, per sample of the batch, on the answer rows of each side (the EOS row dropped under
 * its default uld_skip_*_eos):
 *  1. aligns the rows by the END byte offsets of their tokens in the answer text (uld_align):
 *     a group closes where both tokenizations end at the same byte;
 *  2. merges a group's rows into one vector per side (the "observed" merge): the first row's
 *     probabilities times, for each later row j, max(p_j[tok_j], 1e-8), tok_j being the token
 *     id AT row j (GOLD indexes token_ids[j] with probs[j]: the row's own input token, scored by
 *     the distribution that row predicts; that is GOLD's default, reproduced as it is);
 *  3. compares the two merged vectors (uld_group): plain ULD, both sorted descending, the
 *     shorter zero-padded to max(Vs, Vt), their L1 distance; or the hybrid: the generalized JSD
 *     (beta) over the matched columns (tokens both vocabularies spell alike) plus the sorted L1
 *     over each side's unmatched columns, weighted (fixed, or adaptive: matched / Vt);
 *  4. averages over the sample's groups (uld_sample); the batch loss is
 *     distillation_weight * the mean over samples (samples without answer count as 0).
 *
 * Probabilities are the callers': p = softmax(z / T) of the logits' rows (uld_softmax), T the
 * side's temperature; V is the logits' width (the model's vocab_size, padding ids included),
 * not the tokenizer's. The backward gives d(loss)/d(student logits) through the merge, the
 * clamps (zero gradient where a clamped value is at or below 1e-8, as torch's clamp_min) and
 * the softmax at T_s; the teacher gets none (GOLD's teacher runs without gradient). Sorts are
 * stable (equal values keep their index order), so the gradient of tied values is defined.
 *
 * Threads: a struct uld is read-only once set up and may be shared; each thread needs its own
 * struct uld_work; groups use disjoint rows, so threads may write one gradient buffer. */
#ifndef KD_ULD_H
#define KD_ULD_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer;

/* GOLD's floor of clamped probabilities (the scalar factors of the merge, the JSD's logs). */
#define ULD_EPS 1e-8f

/* --- alignment ---------------------------------------------------------------------------- */

/* Aligned groups: group g pairs the student rows s_rows[s_off[g] .. s_off[g + 1]) with the
 * teacher rows t_rows[t_off[g] .. t_off[g + 1]) (indices into the caller's probability rows).
 * Zero-initialise; the arrays grow (doubling) as uld_align appends. */
struct uld_groups {
  size_t n;                /* groups */
  size_t *s_off, *t_off;   /* (n + 1) */
  size_t *s_rows, *t_rows; /* (s_off[n]), (t_off[n]) */
  size_t cap, s_cap, t_cap;
};

/* Append the groups of one sample, GOLD's _align_by_byte_offsets: walk both sides' END byte
 * offsets (s_end: (ns), t_end: (nt), each non-decreasing, in one coordinate: the answer text's
 * bytes), advancing the side whose token ends earlier; where both end at the same byte, the
 * tokens since the last such point form a group. What remains after one side runs out becomes
 * one last group, unless `cut` (a side was truncated, so the remainder ends nowhere common):
 * then it is left out. A pair with an empty side (the remainder of one side alone) is dropped.
 * Row indices are s_row0 + i and t_row0 + i. Returns the number of groups appended, -1 when
 * out of memory (g unchanged then). */
int64_t uld_align(struct uld_groups *g, const int32_t *s_end, size_t ns, size_t s_row0,
                  const int32_t *t_end, size_t nt, size_t t_row0, int cut);

/* Empty g (keeping its memory) / free its arrays. */
void uld_groups_clear(struct uld_groups *g);
void uld_groups_free(struct uld_groups *g);

/* --- the loss ----------------------------------------------------------------------------- */

/* The loss's setting; read-only after uld_init and uld_set_hybrid. */
struct uld {
  size_t Vs, Vt;        /* logits' widths, student and teacher */
  float Ts;             /* student temperature (the softmax the backward goes through) */
  int hybrid;           /* 0: plain sorted L1; 1: the hybrid */
  double beta;          /* the JSD's beta: 0 is KL(teacher || student), 1 KL(student || teacher) */
  double wm, wu;        /* the hybrid's matched and unmatched weights */
  size_t nm;            /* matched pairs */
  int32_t *m_t, *m_s;   /* (nm) teacher and student column of each pair */
  size_t nsu, ntu;      /* unmatched columns of each side */
  int32_t *s_un, *t_un; /* (nsu), (ntu) ascending */
};

/* The plain loss for logits of widths Vs and Vt and the student temperature Ts > 0. 0, or -1
 * when Vs or Vt is 0 or above 2^31. */
int uld_init(struct uld *u, size_t Vs, size_t Vt, float Ts);

/* Make u the hybrid over n matched pairs (t_ids, s_ids: (n), distinct teacher ids, each below
 * Vt, student ids below Vs; uld_vocab_match gives them), JSD beta in [0, 1], weights wm and wu
 * (GOLD's uld_hybrid_matched/unmatched_weight), or, when adaptive, wm = n / Vt and
 * wu = 1 - wm (GOLD's default: both weights None). 0, or -1 (an id out of range, a teacher id
 * twice, beta outside [0, 1], out of memory; u unchanged then). */
int uld_set_hybrid(struct uld *u, const int32_t *t_ids, const int32_t *s_ids, size_t n, double beta,
                   int adaptive, double wm, double wu);

void uld_free(struct uld *u);

#define ULD_RADIX 2048 /* buckets of a digit of the radix sort */

/* Scratch of uld_group, sized for one struct uld: 0 or -1 (out of memory). */
struct uld_work {
  float *ms, *mt;              /* (Vs), (Vt) the merged vectors */
  float *gm;                   /* (Vs) d(loss)/d(student's merged vector) */
  uint64_t *sa, *sb;           /* (Vs) each: student (key, index) pairs being sorted */
  uint32_t *ta, *tb;           /* (Vt) each: teacher keys being sorted */
  uint32_t (*hist)[ULD_RADIX]; /* (3, ULD_RADIX) the sort's histograms */
};
int uld_work_init(struct uld_work *w, const struct uld *u);
void uld_work_free(struct uld_work *w);

/* probs = softmax(logits / T) row by row (max subtracted, sums in double).
 * probs, logits: (rows, V); may be the same buffer. */
void uld_softmax(float *probs, const float *logits, size_t rows, size_t V, float T);

/* The loss of one group, and when dz is not NULL, scale * its gradient w.r.t. the student's
 * logits ADDED into dz at the group's student rows (the first row's whole vector, each later
 * row through its scalar factor); other rows are not touched, so the caller zeroes dz once.
 *   dz:    (rows_s, Vs) gradient of the student's logits, accumulated; or NULL (loss only);
 *          not overlapping ps
 *   ps:    (rows_s, Vs) student probabilities, softmax(z / u->Ts)
 *   ids_s: (rows_s) the student's input token at each row
 *   srows: (ns) the group's student rows, in order; trows: (nt) the teacher's
 *   pt:    (rows_t, Vt) teacher probabilities, softmax(z_t / T_t); ids_t: (rows_t)
 * The loss is the plain sorted L1, or wm * JSD(matched) + wu * sorted L1(unmatched) (the JSD
 * summed over the matched columns; the unmatched L1 only when both sides have unmatched
 * columns, as GOLD). The L1's gradient is sign(s_(k) - t_(k)) at the student's entry of rank k
 * (0 where they are equal, as torch's abs); tied values take ranks in index order. Cost: a
 * radix sort of each side (3 passes over (key, index) pairs, over keys for the teacher) and
 * O(Vs + Vt), plus O(Vs) per later student row; about 0.35 ms at Vs = Vt = 32k and 1.8 ms at
 * 152k for a plain 1:1 group on one Zen 4 core (validation/perf/README.md, "ULD"). */
double uld_group(float *dz, struct uld_work *w, const struct uld *u, const float *ps,
                 const int32_t *ids_s, const size_t *srows, size_t ns, const float *pt,
                 const int32_t *ids_t, const size_t *trows, size_t nt, float scale);

/* GOLD's loss of one sample: the mean of uld_group over groups [g0, g1) of g (0 without
 * groups), with scale * its gradient added into dz as uld_group does. The batch loss is the
 * mean of this over the batch's samples times distillation_weight: pass scale =
 * distillation_weight / samples and sum. Arguments as uld_group's. */
double uld_sample(float *dz, struct uld_work *w, const struct uld *u, const struct uld_groups *g,
                  size_t g0, size_t g1, const float *ps, const int32_t *ids_s, const float *pt,
                  const int32_t *ids_t, float scale);

/* --- the hybrid's vocabulary matching ----------------------------------------------------- */

/* GOLD's _initialize_vocabulary_mapping: for each (string, id) of the teacher's vocabulary
 * with its added tokens (as get_vocab() gives them: strings as tokenizer.json spells them),
 * the student's id of the same string, if it has one. *n pairs into malloc'ed *t_ids and
 * *s_ids (n), ascending by teacher id, one per teacher id (an id spelt two ways, which only an
 * odd tokenizer.json gives, keeps its last entry that matches). 0 or -1 (out of memory). */
int uld_vocab_match(int32_t **t_ids, int32_t **s_ids, size_t *n, const struct tokenizer *teacher,
                    const struct tokenizer *student);

#endif
