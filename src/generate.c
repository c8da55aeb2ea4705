/* generate.c: prefill and decode with a KV cache (generate.h). The cache holds every layer's
 * keys and values after RoPE for B samples x (Tp + max_new) positions; the prefill writes
 * positions 0 .. Tp-1 of every sample (a short prompt's padding rows are overwritten by its
 * own decode steps before any query reaches them: a query at position p sees p + 1 rows). */
#include "generate.h"

#include <stdlib.h>
#include <string.h>

#include "layers.h"
#include "util.h"

/* z (n, vocab slice) := the logits of the n final-norm rows hn (n, C), capped as the card
 * says (Gemma's final_logit_softcapping). */
static void head_rows(struct kd_backend *be, const struct kd_model *mdl, float *z, const float *hn,
                      int n) {
  const int C = mdl->card.hidden_size, V = mdl->vocab;
  if (mdl->pw.head16)
    be->gemm_w16(be, 0, n, V, C, 1.0f, hn, C, mdl->pw.head16, C, 0.0f, z, V);
  else
    be->gemm(be, 0, 1, n, V, C, 1.0f, hn, C, mdl->pw.head, C, 0.0f, z, V);
  if (mdl->card.final_logit_softcapping > 0)
    be->softcap_forward(be, z, (size_t)n * V, (float)mdl->card.final_logit_softcapping);
}

static int is_eos(const struct kd_gen_opts *o, int64_t id) {
  for (int e = 0; e < o->neos; e++)
    if (o->eos[e] == id) return 1;
  return 0;
}

size_t gen_run(struct kd_backend *be, const struct kd_model *mdl, const int *prompts,
               const int *plen, int B, int Tp, const struct kd_gen_opts *o, int64_t sample0,
               int *out, int *nout) {
  KD_CHECK(mdl->frozen && mdl->has_embed && mdl->has_head,
           "gen_run: a frozen model holding every layer (one pipeline stage)");
  KD_CHECK(B >= 1 && Tp >= 1 && o->max_new >= 1, "gen_run: %d prompts of %d, %d new", B, Tp,
           o->max_new);
  for (int b = 0; b < B; b++)
    KD_CHECK(plen[b] >= 1 && plen[b] <= Tp, "gen_run: prompt %d of %d ids", b, plen[b]);
  const int L = mdl->nlayers, C = mdl->card.hidden_size, V = mdl->vocab;
  struct kd_kv kv = {.B = B, .S = Tp + o->max_new};
  kv.k = kd_calloc((size_t)L, sizeof *kv.k);
  kv.v = kd_calloc((size_t)L, sizeof *kv.v);
  const size_t cache = (size_t)B * kv.S * mdl->kv_dim * sizeof(float);
  for (int i = 0; i < L; i++) {
    kv.k[i] = be->alloc(be, KD_MEM_ACTS, cache);
    kv.v[i] = be->alloc(be, KD_MEM_ACTS, cache);
  }
  kv.hpos = kd_malloc((size_t)B * 2 * sizeof(int));
  int *hlen = kv.hpos + B;
  kv.pos = be->alloc(be, KD_MEM_ACTS, (size_t)B * sizeof(int));
  kv.len = be->alloc(be, KD_MEM_ACTS, (size_t)B * sizeof(int));
  float *z = be->alloc(be, KD_MEM_LOSS, (size_t)B * V * sizeof(float));
  float *hz = kd_malloc((size_t)B * V * sizeof(float));
  int *tok = kd_malloc((size_t)B * 2 * sizeof(int)), *done = tok + B;

  struct kd_acts pre, dec;
  acts_build(&pre, be, mdl, B, Tp);
  pre.kv = &kv;
  layers_forward(be, mdl, &pre, prompts);
  for (int b = 0; b < B; b++) /* each sample's last prompt row */
    head_rows(be, mdl, z + (size_t)b * V, pre.hn + ((size_t)b * Tp + plen[b] - 1) * C, 1);
  acts_free(&pre, be);
  acts_build(&dec, be, mdl, B, 1);
  dec.kv = &kv;
  size_t made = 0;
  memset(done, 0, (size_t)B * sizeof(int));
  for (int t = 0;; t++) {
    be->download(be, hz, z, (size_t)B * V * sizeof(float));
    int live = 0;
    for (int b = 0; b < B; b++) {
      if (done[b]) continue;
      const int64_t id =
          sample_token(hz + (size_t)b * V, V, mdl->vocab_lo, &o->s,
                       sample_key(o->seed, o->step, sample0 + b, plen[b] + t), mdl->tp_comm);
      out[(size_t)b * o->max_new + t] = (int)id;
      nout[b] = t + 1;
      tok[b] = (int)id;
      made++;
      done[b] = is_eos(o, id) || t + 1 == o->max_new;
      live += !done[b];
    }
    if (!live) break;
    kv.decode = 1; /* the tokens just chosen, at their positions */
    for (int b = 0; b < B; b++)
      kv.hpos[b] = plen[b] + t, hlen[b] = plen[b] + t + 1;
    be->upload(be, kv.pos, kv.hpos, (size_t)B * sizeof(int));
    be->upload(be, kv.len, hlen, (size_t)B * sizeof(int));
    layers_forward(be, mdl, &dec, tok);
    head_rows(be, mdl, z, dec.hn, B);
  }
  acts_free(&dec, be);
  for (int i = 0; i < L; i++)
    be->free(be, kv.k[i]), be->free(be, kv.v[i]);
  be->free(be, kv.pos), be->free(be, kv.len), be->free(be, z);
  free(kv.k), free(kv.v), free(kv.hpos), free(hz), free(tok);
  return made;
}
