/* convert_hf.c: kdconvert's from-hf and to-hf (convert.h). The model is built as its
 * parameter table only (MODEL_TABLE); tensors move one at a time through one host buffer
 * the size of the largest tensor, so the peak memory is about one tensor. */
#include "tools/convert.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "model.h"
#include "tokfiles.h"
#include "tools/hfconfig.h"
#include "tools/safetensors.h"
#include "util.h"
#include "weights.h"

#define ERRLEN 1536

/* The largest tensor of the table, in elements. */
static size_t largest(const struct kd_model *m) {
  size_t most = 1;
  for (int p = 0; p < m->nparams; p++)
    if (m->params[p].numel > most) most = m->params[p].numel;
  return most;
}

/* --- from-hf --------------------------------------------------------------------------- */

/* The safetensors files of a model directory (one file, or the index's shards), opened. */
static int open_shards(const char *dir, struct st_file **out) {
  char path[1200], err[ERRLEN];
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  FILE *f = fopen(path, "rb");
  char **names = NULL;
  int n = 0;
  if (!f) {
    names = kd_calloc(1, sizeof *names);
    names[n] = kd_malloc(1200);
    snprintf(names[n++], 1200, "%s/model.safetensors", dir);
    if (access(names[0], R_OK) != 0)
      kd_fail(KD_EXIT_INPUT,
              "%s: no model.safetensors nor model.safetensors.index.json "
              "(kdconvert reads safetensors weights only)",
              dir);
  } else {
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = kd_calloc((size_t)(len > 0 ? len : 0) + 1, 1);
    size_t got = len > 0 ? fread(text, 1, (size_t)len, f) : 0;
    fclose(f);
    cJSON *o = cJSON_ParseWithLength(text, got);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(o, "weight_map"), *e;
    if (!cJSON_IsObject(map)) kd_fail(KD_EXIT_INPUT, "%s: no weight_map object", path);
    names = kd_calloc((size_t)cJSON_GetArraySize(map) + 1, sizeof *names);
    cJSON_ArrayForEach(e, map) {
      if (!cJSON_IsString(e) || strchr(e->valuestring, '/'))
        kd_fail(KD_EXIT_INPUT, "%s: weight_map[\"%s\"] is not a file name", path, e->string);
      char full[1200];
      snprintf(full, sizeof full, "%s/%s", dir, e->valuestring);
      int seen = 0;
      for (int i = 0; i < n; i++)
        seen |= !strcmp(names[i], full);
      if (seen) continue;
      names[n] = kd_malloc(1200);
      snprintf(names[n++], 1200, "%s", full);
    }
    cJSON_Delete(o);
  }
  struct st_file *sf = kd_calloc((size_t)n + 1, sizeof *sf);
  for (int i = 0; i < n; i++) {
    if (st_open(&sf[i], names[i], err, sizeof err)) kd_fail(KD_EXIT_INPUT, "%s", err);
    free(names[i]);
  }
  free(names);
  *out = sf;
  return n;
}

/* Where a multimodal model's files put its text model's tensors: before the rest of a
 * table name "model.X" and "lm_head.X" (transformers 5 writes model.language_model.X and
 * lm_head.X, the Hub's Gemma 3 files language_model.model.X and language_model.lm_head.X). */
struct lm_prefix {
  const char *model, *head;
};
static const struct lm_prefix lm_prefixes[2] = {
    {"model.language_model.", "lm_head."}, {"language_model.model.", "language_model.lm_head."}};

/* The prefixes of the files of a multimodal model (NULL: a text model's files). */
static const struct lm_prefix *lm_prefix_of(const struct hf_extra *x, const struct st_file *sf,
                                            int nsh) {
  if (!x->multimodal) return NULL;
  const size_t l = strlen(lm_prefixes[1].model);
  for (int i = 0; i < nsh; i++) {
    const cJSON *e;
    cJSON_ArrayForEach(e, sf[i].header) {
      if (!strncmp(e->string, lm_prefixes[1].model, l)) return &lm_prefixes[1];
    }
  }
  return &lm_prefixes[0];
}

/* Mixtral's expert tensors as its Hub checkpoints (and transformers' save_pretrained) name
 * them: block_sparse_moe.gate and block_sparse_moe.experts.E.w1 / w3 / w2 for the weights
 * files' mlp.gate and mlp.experts.E.gate_proj / up_proj / down_proj. */
static const char *const mixtral_parts[3][2] = {{".gate_proj.weight", ".w1.weight"},
                                                {".up_proj.weight", ".w3.weight"},
                                                {".down_proj.weight", ".w2.weight"}};

/* Rewrite `name` (in place, at most len bytes) between the weights files' spelling
 * (to_hub = 1) and Mixtral's Hub spelling (to_hub = 0); other names are left alone. */
static void mixtral_name(char *name, size_t len, int to_hub) {
  const char *from = to_hub ? ".mlp." : ".block_sparse_moe.",
             *to = to_hub ? ".block_sparse_moe." : ".mlp.";
  char *at = strstr(name, from), tmp[512];
  if (!at || (!strstr(at, ".gate.weight") && !strstr(at, ".experts."))) return;
  snprintf(tmp, sizeof tmp, "%.*s%s%s", (int)(at - name), name, to, at + strlen(from));
  for (int j = 0; j < 3; j++) {
    const char *a = mixtral_parts[j][to_hub ? 0 : 1], *b = mixtral_parts[j][to_hub ? 1 : 0];
    const size_t l = strlen(tmp), la = strlen(a);
    if (l > la && !strcmp(tmp + l - la, a) && strstr(tmp, ".experts.")) {
      tmp[l - la] = 0;
      strncat(tmp, b, sizeof tmp - strlen(tmp) - 1);
      break;
    }
  }
  snprintf(name, len, "%s", tmp);
}

/* The name in the files of table name `name` (px: lm_prefix_of; mixtral: its Hub spelling). */
static void file_name(char *out, size_t len, const char *name, const struct lm_prefix *px,
                      const struct kd_card *c) {
  if (px && !strncmp(name, "model.", 6))
    snprintf(out, len, "%s%s", px->model, name + 6);
  else if (px && !strncmp(name, "lm_head.", 8))
    snprintf(out, len, "%s%s", px->head, name + 8);
  else
    snprintf(out, len, "%s", name);
  if (c->arch == KD_ARCH_MIXTRAL) mixtral_name(out, len, 1);
}

/* The fused expert tensor of transformers' own layout (save_pretrained with
 * save_original_format=False: mlp.experts.gate_up_proj (E, 2 I, C), mlp.experts.down_proj
 * (E, C, I)) that holds expert tensor q, into out; 0 when q is not an expert tensor. */
static int fused_name(char *out, size_t len, const struct kd_param *q) {
  if (q->expert < 0) return 0;
  snprintf(out, len, "model.layers.%d.mlp.experts.%s", q->layer,
           strstr(q->name, ".down_proj.") ? "down_proj" : "gate_up_proj");
  return 1;
}

/* Tensors a family's checkpoints store fused, as transformers' modelling code names and cuts
 * them: a layer's fused tensor (model.layers.L.file) holds the rows of the table's tensors
 * model.layers.L.part[0], part[1], ... one after the other. Phi-3: Phi3Attention.qkv_proj
 * (the q rows, then k, then v) and Phi3MLP.gate_up_proj (gate, then up: its chunk(2)).
 * from-hf splits them into the table's tensors, to-hf fuses them again. */
struct fusion {
  enum kd_arch arch;
  const char *file;    /* the fused tensor's name after model.layers.L. */
  const char *part[4]; /* its row blocks in order (NULL-ended) */
};
static const struct fusion fusions[] = {
    {KD_ARCH_PHI3,
     "self_attn.qkv_proj.weight",
     {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", NULL}},
    {KD_ARCH_PHI3, "mlp.gate_up_proj.weight", {"mlp.gate_proj.weight", "mlp.up_proj.weight", NULL}},
};

/* The fusion of card c that `name` (model.layers.L.X) is a part of (*part its index) or the
 * fused tensor of (*part = -1), *layer its L; NULL when none. */
static const struct fusion *fusion_of(const struct kd_card *c, const char *name, int *layer,
                                      int *part) {
  int at = 0;
  if (sscanf(name, "model.layers.%d.%n", layer, &at) != 1 || !at) return NULL;
  for (size_t f = 0; f < sizeof fusions / sizeof fusions[0]; f++) {
    if (fusions[f].arch != c->arch) continue;
    *part = -1;
    if (!strcmp(name + at, fusions[f].file)) return &fusions[f];
    for (*part = 0; fusions[f].part[*part]; ++*part)
      if (!strcmp(name + at, fusions[f].part[*part])) return &fusions[f];
  }
  return NULL;
}

/* The table entry of part i of fusion f in layer l. */
static const struct kd_param *fusion_part(const struct kd_model *m, const struct fusion *f, int l,
                                          int i) {
  char name[256];
  snprintf(name, sizeof name, "model.layers.%d.%s", l, f->part[i]);
  const struct kd_param *q = model_find(m, name);
  if (!q) kd_fail(KD_EXIT_INPUT, "no tensor %s in kdtrain's table of this model", name);
  return q;
}

/* The table name of file name `name`, or 0 when it is not the text model's (px: a
 * multimodal model's prefixes, NULL: every name is). */
static int table_name(char *out, size_t len, const char *name, const struct lm_prefix *px) {
  const size_t lm = px ? strlen(px->model) : 0, lh = px ? strlen(px->head) : 0;
  if (!px)
    snprintf(out, len, "%s", name);
  else if (!strncmp(name, px->model, lm))
    snprintf(out, len, "model.%s", name + lm);
  else if (!strncmp(name, px->head, lh))
    snprintf(out, len, "lm_head.%s", name + lh);
  else
    return 0;
  return 1;
}

/* Refuse tensors of the files that the model kdtrain computes has no place for; a
 * multimodal model's tensors outside its text model are counted in *skipped. */
static void check_no_extra(const struct kd_model *m, const struct st_file *sf, int nsh,
                           const struct lm_prefix *px, int *skipped) {
  *skipped = 0;
  for (int i = 0; i < nsh; i++) {
    const cJSON *e;
    cJSON_ArrayForEach(e, sf[i].header) {
      if (!strcmp(e->string, "__metadata__")) continue;
      char name[512];
      if (!table_name(name, sizeof name, e->string, px)) {
        ++*skipped;
        continue;
      }
      size_t l = strlen(name);
      if (m->card.arch == KD_ARCH_MIXTRAL) mixtral_name(name, sizeof name, 0);
      int layer = -1, at = 0, part = 0;
      const struct fusion *fu = fusion_of(&m->card, name, &layer, &part);
      if (fu && part < 0) continue; /* a fused tensor: read by locate */
      if (fu)
        kd_fail(KD_EXIT_INPUT,
                "%s: tensor %s: the checkpoints of this model_type hold it in "
                "model.layers.%d.%s (transformers reads no such tensor)",
                sf[i].path, e->string, layer, fu->file);
      if (model_find(m, name)) continue;
      char proj[32] = "";
      if (sscanf(name, "model.layers.%d.mlp.experts.%31[a-z_]%n", &layer, proj, &at) == 2 &&
          !name[at] && (!strcmp(proj, "gate_up_proj") || !strcmp(proj, "down_proj")) &&
          card_layer_sparse(&m->card, layer))
        continue; /* transformers' fused experts: read by locate */
      if (l > 21 && !strcmp(name + l - 21, ".rotary_emb.inv_freq")) continue;       /* a buffer */
      if (m->card.tie_word_embeddings && !strcmp(name, "lm_head.weight")) continue; /* tied */
      kd_fail(KD_EXIT_INPUT,
              "%s: tensor %s has no place in the model config.json describes "
              "(kdtrain computes no such tensor)",
              sf[i].path, e->string);
    }
  }
}

/* Where a table entry is read from: tensor `name` of shard `shard`, of `total` elements,
 * the entry's being those from `offset` on (all of them when total is the entry's numel). */
struct src {
  int shard;
  size_t total, offset;
  char name[512];
};

/* The shard holding tensor `name` (nd, sh: its shape), or -1. */
static int find_shard(const struct st_file *sf, int nsh, const char *name, int *nd, int64_t sh[4]) {
  for (int i = 0; i < nsh; i++)
    if (st_find(&sf[i], name, nd, sh)) return i;
  return -1;
}

/* Table entry q as rows of its layer's fused tensor (fusion fu, q its part `part`). */
static void locate_fused(const struct kd_model *m, const struct kd_param *q,
                         const struct st_file *sf, int nsh, const char *dir,
                         const struct lm_prefix *px, const struct fusion *fu, int layer, int part,
                         struct src *s) {
  char name[512], err[ERRLEN];
  snprintf(name, sizeof name, "model.layers.%d.%s", layer, fu->file);
  file_name(s->name, sizeof s->name, name, px, &m->card);
  int64_t rows = 0, sh[4];
  for (int i = 0; fu->part[i]; i++) {
    if (i == part) s->offset = (size_t)rows * (size_t)q->shape[1];
    rows += fusion_part(m, fu, layer, i)->shape[0];
  }
  int nd = 0;
  if ((s->shard = find_shard(sf, nsh, s->name, &nd, sh)) < 0)
    kd_fail(KD_EXIT_INPUT, "%s: no tensor %s in the safetensors files", dir, s->name);
  if (nd != 2 || sh[0] != rows || sh[1] != q->shape[1])
    kd_fail(KD_EXIT_INPUT,
            "%s: tensor %s has %d dimension(s) (%lld, ...) but config.json implies (%lld, %lld): "
            "the rows of %s and the tensors after it",
            sf[s->shard].path, s->name, nd, (long long)sh[0], (long long)rows,
            (long long)q->shape[1], q->name);
  s->total = (size_t)rows * (size_t)q->shape[1];
  if (st_check(&sf[s->shard], s->name, s->total, err, sizeof err))
    kd_fail(KD_EXIT_INPUT, "%s", err);
}

/* For every table entry, where it is read from, with shape and byte range checked: under its
 * file_name; under its table name (mixtral's router in transformers' fused-layout files); an
 * expert's slice of transformers' fused expert tensor (fused_name); rows of a family's fused
 * tensor (fusions). */
static struct src *locate(const struct kd_model *m, const struct st_file *sf, int nsh,
                          const char *dir, const struct lm_prefix *px) {
  struct src *src = kd_calloc((size_t)m->nparams, sizeof *src);
  char err[ERRLEN], alt[512];
  for (int p = 0; p < m->nparams; p++) {
    const struct kd_param *q = &m->params[p];
    struct src *s = &src[p];
    int nd = 0, layer = -1, part = 0;
    int64_t sh[4];
    s->total = q->numel;
    const struct fusion *fu = fusion_of(&m->card, q->name, &layer, &part);
    if (fu) {
      locate_fused(m, q, sf, nsh, dir, px, fu, layer, part, s);
      continue;
    }
    file_name(s->name, sizeof s->name, q->name, px, &m->card);
    s->shard = find_shard(sf, nsh, s->name, &nd, sh);
    if (s->shard < 0 && strcmp(s->name, q->name) && q->expert < 0 &&
        (s->shard = find_shard(sf, nsh, q->name, &nd, sh)) >= 0) /* mixtral's router */
      snprintf(s->name, sizeof s->name, "%s", q->name);
    if (s->shard < 0 && fused_name(alt, sizeof alt, q) &&
        (s->shard = find_shard(sf, nsh, alt, &nd, sh)) >= 0) { /* (E, 2 I, C) or (E, C, I) */
      const int down = strstr(q->name, ".down_proj.") != NULL;
      const int up = strstr(q->name, ".up_proj.") != NULL;
      const int64_t E = m->card.num_experts;
      const int64_t r = down ? q->shape[0] : 2 * q->shape[0];
      if (nd != 3 || sh[0] != E || sh[1] != r || sh[2] != q->shape[1])
        kd_fail(KD_EXIT_INPUT,
                "%s: tensor %s has %d dimension(s) (%lld, ...) but config.json implies (%lld, "
                "%lld, %lld)",
                sf[s->shard].path, alt, nd, (long long)sh[0], (long long)E, (long long)r,
                (long long)q->shape[1]);
      snprintf(s->name, sizeof s->name, "%s", alt);
      s->total = (size_t)(E * r * q->shape[1]);
      s->offset = (size_t)q->expert * (size_t)(r * q->shape[1]) + (up ? q->numel : 0);
      if (st_check(&sf[s->shard], alt, s->total, err, sizeof err))
        kd_fail(KD_EXIT_INPUT, "%s", err);
      continue;
    }
    if (s->shard < 0)
      kd_fail(KD_EXIT_INPUT, "%s: no tensor %s in the safetensors files", dir, s->name);
    const struct st_file *f = &sf[s->shard];
    if (nd != q->ndim || sh[0] != q->shape[0] || (nd == 2 && sh[1] != q->shape[1]))
      kd_fail(KD_EXIT_INPUT,
              "%s: tensor %s has %d dimension(s) (%lld, ...) but config.json "
              "implies (%lld, %lld)",
              f->path, s->name, nd, (long long)sh[0], (long long)q->shape[0],
              (long long)(q->ndim == 2 ? q->shape[1] : 1));
    if (st_check(f, s->name, q->numel, err, sizeof err)) kd_fail(KD_EXIT_INPUT, "%s", err);
  }
  return src;
}

int convert_from_hf(const char *dir, const char *out, const char *card_out) {
  struct kd_backend be;
  backend_cpu_init(&be, 0);
  struct kd_card card;
  struct hf_extra extra;
  char err[ERRLEN];
  if (hfconfig_read(&card, &extra, dir, err, sizeof err)) kd_fail(KD_EXIT_INPUT, "%s", err);
  const char *base = strrchr(out, '/') ? strrchr(out, '/') + 1 : out;
  snprintf(card.name, sizeof card.name, "%.*s", (int)strcspn(base, "."), base);
  struct kd_model m;
  model_build(&m, &be, &card, MODEL_TABLE);
  struct st_file *sf;
  const int nsh = open_shards(dir, &sf);
  const struct lm_prefix *px = lm_prefix_of(&extra, sf, nsh);
  int skipped = 0;
  check_no_extra(&m, sf, nsh, px, &skipped);
  struct src *src = locate(&m, sf, nsh, dir, px);
  if (px)
    printf("kdconvert: %s is multimodal (model_type '%s'): importing its text model only (the "
           "tensors under %s), leaving out its %d other tensors (vision tower, projector)\n",
           dir, extra.model_type, px->model, skipped);

  /* everything checked: write OUT.tmp, rename when complete */
  char tmp[1200];
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  struct weights_io io;
  int ntok = 0;
  int st = weights_create(&io, tmp, &m, NULL, 1, MPI_COMM_WORLD, err, sizeof err);
  if (!st) st = tokfiles_write_dir(io.file, dir, MPI_COMM_WORLD, &ntok, err, sizeof err);
  float *x = kd_malloc(largest(&m) * sizeof(float));
  float *fx = NULL; /* the fused tensor last read, named fx_name */
  char fx_name[512] = "";
  for (int p = 0; p < m.nparams && !st; p++) {
    const struct kd_param *q = &m.params[p];
    const struct src *s = &src[p];
    if (s->total != q->numel) { /* the entry's slice of a fused tensor */
      if (strcmp(s->name, fx_name)) {
        free(fx);
        fx = kd_malloc(s->total * sizeof *fx);
        snprintf(fx_name, sizeof fx_name, "%s", s->name);
        if (st_read_f32(&sf[s->shard], s->name, fx, s->total, err, sizeof err)) st = KD_EXIT_IO;
      }
      memcpy(x, fx + s->offset, q->numel * sizeof *x);
    } else if (st_read_f32(&sf[s->shard], s->name, x, q->numel, err, sizeof err)) {
      st = KD_EXIT_IO;
    }
    if (!st) st = weights_write_tensor(&io, "params", p, x, err, sizeof err);
  }
  free(fx);
  free(x);
  st = weights_close(&io, st, err, sizeof err);
  if (!st && rename(tmp, out) != 0) {
    kd_seterr(err, sizeof err, "cannot rename %s to %s", tmp, out);
    st = KD_EXIT_IO;
  }
  if (st) {
    unlink(tmp);
    kd_fail(st, "%s", err);
  }
  FILE *f = fopen(card_out, "w");
  if (!f) kd_fail(KD_EXIT_IO, "cannot write %s", card_out);
  fprintf(f, "! converted by kdconvert from %s (model_type '%s'%s%s)\n", dir, extra.model_type,
          extra.dtype[0] ? ", dtype " : "", extra.dtype);
  card_print(f, &card);
  if (fclose(f) != 0) kd_fail(KD_EXIT_IO, "cannot write %s", card_out);
  printf("kdconvert: %s -> %s (%d tensors, %d tokenizer files) and card %s\n", dir, out, m.nparams,
         ntok, card_out);
  if (ntok == 0) fprintf(stderr, "kdconvert: note: %s holds no tokenizer files\n", dir);
  for (int i = 0; i < nsh; i++)
    st_close(&sf[i]);
  free(sf);
  free(src);
  model_free(&m, &be);
  be.release(&be);
  return 0;
}

/* --- to-hf ----------------------------------------------------------------------------- */

/* One tensor of the exported state dict: the rows of table entries p[0 .. np - 1] one after
 * the other (one entry, or a family's fused tensor), or zeros (np = 0) for a bias that
 * transformers' class has and kdtrain's card leaves out. */
struct xtensor {
  struct st_tensor t;
  int p[4], np;
  char name[96];
  int shard;
};

/* The exported tensors, in table order (a fused tensor where its first part is), then the
 * zero biases. */
static int export_list(const struct kd_model *m, struct xtensor **out) {
  const struct kd_card *c = &m->card;
  const int L = c->num_hidden_layers, qwen = c->arch == KD_ARCH_QWEN2;
  struct xtensor *x = kd_calloc((size_t)m->nparams + 3 * (size_t)L + 1, sizeof *x);
  int n = 0;
  for (int p = 0; p < m->nparams; p++) {
    const struct kd_param *q = &m->params[p];
    int layer = -1, part = 0;
    const struct fusion *fu = fusion_of(c, q->name, &layer, &part);
    if (fu && part > 0) continue;                             /* in its fused tensor */
    file_name(x[n].name, sizeof x[n].name, q->name, NULL, c); /* the Hub's names */
    x[n].t = (struct st_tensor){NULL, q->ndim, {q->shape[0], q->shape[1]}};
    x[n].p[x[n].np++] = p;
    if (fu) {
      snprintf(x[n].name, sizeof x[n].name, "model.layers.%d.%s", layer, fu->file);
      for (int i = 1; fu->part[i]; i++) {
        const struct kd_param *o = fusion_part(m, fu, layer, i);
        x[n].p[x[n].np++] = (int)(o - m->params);
        x[n].t.shape[0] += o->shape[0];
      }
    }
    n++;
  }
  const int64_t hd = card_head_dim(c);
  for (int l = 0; l < L; l++) {
    if (qwen && !c->attention_bias) { /* Qwen2 always has q/k/v biases */
      const char *w[3] = {"q", "k", "v"};
      for (int k = 0; k < 3; k++, n++) {
        snprintf(x[n].name, sizeof x[n].name, "model.layers.%d.self_attn.%s_proj.bias", l, w[k]);
        int64_t rows = (k == 0 ? c->num_attention_heads : c->num_key_value_heads) * hd;
        x[n].t = (struct st_tensor){NULL, 1, {rows, 1}};
      }
    }
    if (!qwen && c->attention_bias) { /* Llama's attention_bias covers o_proj too */
      snprintf(x[n].name, sizeof x[n].name, "model.layers.%d.self_attn.o_proj.bias", l);
      x[n].t = (struct st_tensor){NULL, 1, {c->hidden_size, 1}};
      n++;
    }
  }
  for (int i = 0; i < n; i++)
    x[i].t.name = x[i].name;
  *out = x;
  return n;
}

/* Cut the list into shards as transformers does: in order, a new shard when the next
 * tensor would overflow the limit; a tensor above the limit alone. Returns the count. */
static int plan_shards(struct xtensor *x, int n, int64_t limit) {
  int shard = 0;
  int64_t fill = 0;
  for (int i = 0; i < n; i++) {
    const int64_t bytes = (int64_t)st_numel(&x[i].t) * 4;
    if (fill > 0 && fill + bytes > limit) shard++, fill = 0;
    x[i].shard = shard;
    fill += bytes;
  }
  return n > 0 ? shard + 1 : 0;
}

static void shard_name(char *out, size_t len, int s, int nshards) {
  if (nshards == 1)
    snprintf(out, len, "model.safetensors");
  else
    snprintf(out, len, "model-%05d-of-%05d.safetensors", s + 1, nshards);
}

/* Remove the weights files an earlier export may have left in `dir`. */
static void remove_stale(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    const char *nm = e->d_name; /* model-00001-of-00003.safetensors */
    int shard = strlen(nm) == 32 && !strncmp(nm, "model-", 6) && !strncmp(nm + 11, "-of-", 4) &&
                !strcmp(nm + 20, ".safetensors");
    if (shard || !strcmp(e->d_name, "model.safetensors") ||
        !strcmp(e->d_name, "model.safetensors.index.json")) {
      char path[1200];
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      unlink(path);
    }
  }
  if (d) closedir(d);
}

static void write_text(const char *dir, const char *name, const char *text) {
  char path[1200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  if (!f || fprintf(f, "%s\n", text) < 0 || fclose(f) != 0)
    kd_fail(KD_EXIT_IO, "cannot write %s", path);
}

/* model.safetensors.index.json for a sharded export. */
static void write_index(const char *dir, const struct xtensor *x, int n, int nshards) {
  cJSON *o = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(o, "metadata");
  int64_t total = 0;
  for (int i = 0; i < n; i++)
    total += (int64_t)st_numel(&x[i].t) * 4;
  cJSON_AddNumberToObject(meta, "total_size", (double)total);
  cJSON *map = cJSON_AddObjectToObject(o, "weight_map");
  for (int i = 0; i < n; i++) {
    char name[64];
    shard_name(name, sizeof name, x[i].shard, nshards);
    cJSON_AddStringToObject(map, x[i].name, name);
  }
  char *text = cJSON_Print(o);
  cJSON_Delete(o);
  write_text(dir, "model.safetensors.index.json", text);
  free(text);
}

int convert_to_hf(const char *in, const char *dir, int64_t max_shard) {
  struct kd_backend be;
  backend_cpu_init(&be, 0);
  struct kd_card card;
  char err[ERRLEN];
  if (weights_read_card(in, &card, err, sizeof err)) kd_fail(KD_EXIT_INPUT, "%s", err);
  char *cfg = hfconfig_write(&card, err, sizeof err); /* refused before anything is written */
  if (!cfg) kd_fail(KD_EXIT_INPUT, "%s: %s", in, err);
  struct kd_model m;
  model_build(&m, &be, &card, MODEL_TABLE);
  struct weights_io io;
  int st = weights_open(&io, in, &m, MPI_COMM_WORLD, err, sizeof err);
  if (st) kd_fail(weights_close(&io, st, err, sizeof err), "%s", err);
  if (kd_mkdir_p(dir) != 0 || access(dir, W_OK) != 0)
    kd_fail(KD_EXIT_IO, "cannot create directory %s", dir);
  remove_stale(dir);
  struct xtensor *x;
  const int n = export_list(&m, &x), nshards = plan_shards(x, n, max_shard);
  size_t most = 1;
  for (int i = 0; i < n; i++)
    if (st_numel(&x[i].t) > most) most = st_numel(&x[i].t);
  float *buf = kd_malloc(most * sizeof(float));
  for (int s = 0, i = 0; s < nshards && !st; s++) {
    int lo = i;
    while (i < n && x[i].shard == s)
      i++;
    struct st_tensor *t = kd_calloc((size_t)(i - lo), sizeof *t);
    for (int k = lo; k < i; k++)
      t[k - lo] = x[k].t;
    char name[64], path[1200];
    shard_name(name, sizeof name, s, nshards);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct st_writer w;
    if (st_writer_open(&w, path, t, i - lo, err, sizeof err)) st = KD_EXIT_IO;
    for (int k = lo; k < i && !st; k++) {
      size_t off = 0;
      for (int j = 0; j < x[k].np && !st; j++) { /* a fused tensor: its parts' rows */
        st = weights_read_tensor(&io, "params", x[k].p[j], buf + off, err, sizeof err);
        off += m.params[x[k].p[j]].numel;
      }
      if (!x[k].np) memset(buf, 0, st_numel(&x[k].t) * sizeof(float));
      if (!st && st_writer_put(&w, buf, err, sizeof err)) st = KD_EXIT_IO;
    }
    if (st_writer_close(&w, st ? NULL : err, st ? 0 : sizeof err) && !st) st = KD_EXIT_IO;
    free(t);
  }
  free(buf);
  st = weights_close(&io, st, err, sizeof err);
  if (st) kd_fail(st, "%s", err);
  if (nshards > 1) write_index(dir, x, n, nshards);
  write_text(dir, "config.json", cfg);
  free(cfg);
  int ntok = 0;
  if ((st = tokfiles_extract(in, dir, &ntok, err, sizeof err))) kd_fail(st, "%s", err);
  printf("kdconvert: %s -> %s (config.json, %d tensors in %d safetensors file%s, %d tokenizer "
         "files)\n",
         in, dir, n, nshards, nshards == 1 ? "" : "s", ntok);
  if (ntok == 0) fprintf(stderr, "kdconvert: note: %s stores no tokenizer: %s has none\n", in, dir);
  free(x);
  model_free(&m, &be);
  be.release(&be);
  return 0;
}

int64_t convert_parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || !(v > 0) || v > 1e15) return -1;
  static const struct {
    const char *unit;
    double f;
  } units[] = {{"", 1},
               {"B", 1},
               {"KB", 1e3},
               {"MB", 1e6},
               {"GB", 1e9},
               {"TB", 1e12},
               {"KIB", 1024.0},
               {"MIB", 1048576.0},
               {"GIB", 1073741824.0},
               {"TIB", 1099511627776.0}};
  char u[8];
  size_t l = strlen(end);
  if (l >= sizeof u) return -1;
  for (size_t i = 0; i <= l; i++)
    u[i] = (char)toupper((unsigned char)end[i]);
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (!strcmp(u, units[i].unit)) return v * units[i].f >= 1 ? (int64_t)(v * units[i].f) : -1;
  return -1;
}
