/* kdconvert: Hugging Face model directory <-> kdtrain weights file (doc/checkpoint.md).
 *
 *   kdconvert from-hf HF_DIR OUT.h5 [CARD.nml]   config.json + *.safetensors -> weights file
 *                                                 and a mod/-style card (default OUT.nml)
 *   kdconvert to-hf IN.h5 OUT_DIR                 weights file or checkpoint -> config.json +
 *                                                 model.safetensors (F32) for transformers
 *
 * The parameter table's names are the Hugging Face names, so tensors map one to one. */
#include <cjson/cJSON.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "config.h"
#include "model.h"
#include "tools/safetensors.h"
#include "util.h"
#include "weights.h"

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = kd_calloc((size_t)(n > 0 ? n : 0) + 1, 1);
  if (n > 0 && fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = '\0';
  fclose(f);
  return s;
}

static double num(const cJSON *o, const char *key, double dflt, int required, const char *path) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (cJSON_IsNumber(v)) return v->valuedouble;
  if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
  if (required) kd_fail(KD_EXIT_INPUT, "%s: key \"%s\" missing or not a number", path, key);
  return dflt;
}

/* config.json -> card. */
static void card_from_json(struct kd_card *c, const char *dir) {
  char path[1200];
  snprintf(path, sizeof path, "%s/config.json", dir);
  char *text = slurp(path);
  if (!text) kd_fail(KD_EXIT_INPUT, "%s: cannot read (is %s a Hugging Face model directory?)",
                     path, dir);
  cJSON *o = cJSON_Parse(text);
  free(text);
  if (!cJSON_IsObject(o)) kd_fail(KD_EXIT_INPUT, "%s: not a JSON object", path);
  memset(c, 0, sizeof *c);
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(o, "model_type");
  if (!cJSON_IsString(mt) || (strcmp(mt->valuestring, "qwen2") && strcmp(mt->valuestring, "llama")))
    kd_fail(KD_EXIT_INPUT, "%s: model_type must be \"qwen2\" or \"llama\"", path);
  snprintf(c->arch, sizeof c->arch, "%s", mt->valuestring);
  const int qwen = !strcmp(c->arch, "qwen2");
  c->vocab_size = (int)num(o, "vocab_size", 0, 1, path);
  c->hidden_size = (int)num(o, "hidden_size", 0, 1, path);
  c->intermediate_size = (int)num(o, "intermediate_size", 0, 1, path);
  c->num_hidden_layers = (int)num(o, "num_hidden_layers", 0, 1, path);
  c->num_attention_heads = (int)num(o, "num_attention_heads", 0, 1, path);
  c->num_key_value_heads = (int)num(o, "num_key_value_heads", c->num_attention_heads, 0, path);
  c->max_position_embeddings = (int)num(o, "max_position_embeddings", 2048, 0, path);
  c->rope_theta = num(o, "rope_theta", 10000.0, 0, path);
  c->rms_norm_eps = num(o, "rms_norm_eps", 1e-6, 0, path);
  c->tie_word_embeddings = (int)num(o, "tie_word_embeddings", 0, 0, path);
  c->attention_bias = (int)num(o, "attention_bias", qwen, 0, path);
  if (c->num_attention_heads <= 0 || c->hidden_size % c->num_attention_heads)
    kd_fail(KD_EXIT_INPUT, "%s: hidden_size is not a multiple of num_attention_heads", path);
  double hd = num(o, "head_dim", c->hidden_size / c->num_attention_heads, 0, path);
  if ((int)hd != c->hidden_size / c->num_attention_heads)
    kd_fail(KD_EXIT_INPUT, "%s: head_dim %g differs from hidden_size / num_attention_heads, "
            "which kdtrain assumes", path, hd);
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
  if (rs && !cJSON_IsNull(rs))
    kd_fail(KD_EXIT_INPUT, "%s: rope_scaling is not supported by kdtrain", path);
  cJSON_Delete(o);
}

/* The safetensors files of a model directory (one file, or the index's shards). */
static int list_shards(const char *dir, char ***out) {
  char path[1200];
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  char *text = slurp(path);
  char **names = kd_calloc(1024, sizeof *names);
  int n = 0;
  if (!text) {
    names[n] = kd_malloc(1200);
    snprintf(names[n++], 1200, "%s/model.safetensors", dir);
  } else {
    cJSON *o = cJSON_Parse(text);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(o, "weight_map"), *e;
    if (!cJSON_IsObject(map)) kd_fail(KD_EXIT_INPUT, "%s: no weight_map object", path);
    cJSON_ArrayForEach(e, map) {
      if (!cJSON_IsString(e)) continue;
      char full[1200];
      snprintf(full, sizeof full, "%s/%s", dir, e->valuestring);
      int seen = 0;
      for (int i = 0; i < n; i++) seen |= !strcmp(names[i], full);
      if (seen || n == 1024) continue;
      names[n] = kd_malloc(1200);
      snprintf(names[n++], 1200, "%s", full);
    }
    cJSON_Delete(o);
  }
  *out = names;
  return n;
}

static int from_hf(const char *dir, const char *out, const char *card_out) {
  struct kd_backend be;
  backend_cpu_init(&be, 0);
  struct kd_card card;
  card_from_json(&card, dir);
  const char *base = strrchr(out, '/') ? strrchr(out, '/') + 1 : out;
  snprintf(card.name, sizeof card.name, "%.*s", (int)strcspn(base, "."), base);
  struct kd_model m;
  model_build(&m, &be, &card, 0);
  char **shards;
  int nsh = list_shards(dir, &shards);
  struct st_file *sf = kd_calloc((size_t)nsh, sizeof *sf);
  char err[1024];
  for (int i = 0; i < nsh; i++)
    if (st_open(&sf[i], shards[i], err, sizeof err)) kd_fail(KD_EXIT_INPUT, "%s", err);
  for (int p = 0; p < m.nparams; p++) {
    const struct kd_param *q = &m.params[p];
    int found = 0, nd;
    int64_t sh[4];
    for (int i = 0; i < nsh && !found; i++) {
      if (!st_find(&sf[i], q->name, &nd, sh)) continue;
      found = 1;
      if (nd != q->ndim || sh[0] != q->shape[0] || (nd == 2 && sh[1] != q->shape[1]))
        kd_fail(KD_EXIT_INPUT, "%s: tensor %s has another shape than config.json implies",
                shards[i], q->name);
      if (st_read_f32(&sf[i], q->name, m.master + q->offset, q->numel, err, sizeof err))
        kd_fail(KD_EXIT_INPUT, "%s", err);
    }
    if (!found) kd_fail(KD_EXIT_INPUT, "%s: no tensor %s in the safetensors files", dir, q->name);
  }
  int st = weights_save(out, &m, m.master, NULL, 1, MPI_COMM_WORLD, err, sizeof err);
  if (st) kd_fail(st, "%s", err);
  FILE *f = fopen(card_out, "w");
  if (!f) kd_fail(KD_EXIT_IO, "cannot write %s", card_out);
  fprintf(f, "! converted by kdconvert from %s\n", dir);
  card_print(f, &card);
  fclose(f);
  printf("kdconvert: %s -> %s (%d tensors) and card %s\n", dir, out, m.nparams, card_out);
  for (int i = 0; i < nsh; i++) {
    st_close(&sf[i]);
    free(shards[i]);
  }
  free(sf);
  free(shards);
  model_free(&m, &be);
  return 0;
}

static int to_hf(const char *in, const char *dir) {
  struct kd_backend be;
  backend_cpu_init(&be, 0);
  struct kd_card card;
  char err[1024];
  if (weights_read_card(in, &card, err, sizeof err)) kd_fail(KD_EXIT_INPUT, "%s", err);
  struct kd_model m;
  model_build(&m, &be, &card, 0);
  int st = weights_load(in, &m, m.master, MPI_COMM_WORLD, err, sizeof err);
  if (st) kd_fail(st, "%s", err);
  if (mkdir(dir, 0755) != 0 && access(dir, W_OK) != 0)
    kd_fail(KD_EXIT_IO, "cannot create directory %s", dir);
  const int qwen = !strcmp(card.arch, "qwen2");
  cJSON *o = cJSON_CreateObject();
  cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
  cJSON_AddItemToArray(arch, cJSON_CreateString(qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM"));
  cJSON_AddStringToObject(o, "model_type", card.arch);
  cJSON_AddNumberToObject(o, "vocab_size", card.vocab_size);
  cJSON_AddNumberToObject(o, "hidden_size", card.hidden_size);
  cJSON_AddNumberToObject(o, "intermediate_size", card.intermediate_size);
  cJSON_AddNumberToObject(o, "num_hidden_layers", card.num_hidden_layers);
  cJSON_AddNumberToObject(o, "num_attention_heads", card.num_attention_heads);
  cJSON_AddNumberToObject(o, "num_key_value_heads", card.num_key_value_heads);
  cJSON_AddNumberToObject(o, "max_position_embeddings", card.max_position_embeddings);
  cJSON_AddNumberToObject(o, "rope_theta", card.rope_theta);
  cJSON_AddNumberToObject(o, "rms_norm_eps", card.rms_norm_eps);
  cJSON_AddBoolToObject(o, "tie_word_embeddings", card.tie_word_embeddings);
  if (!qwen) cJSON_AddBoolToObject(o, "attention_bias", card.attention_bias);
  cJSON_AddStringToObject(o, "hidden_act", "silu");
  cJSON_AddStringToObject(o, "torch_dtype", "float32");
  char path[1200];
  snprintf(path, sizeof path, "%s/config.json", dir);
  char *text = cJSON_Print(o);
  cJSON_Delete(o);
  FILE *f = fopen(path, "w");
  if (!f || fprintf(f, "%s\n", text) < 0 || fclose(f) != 0)
    kd_fail(KD_EXIT_IO, "cannot write %s", path);
  free(text);
  struct st_tensor *t = kd_calloc((size_t)m.nparams, sizeof *t);
  for (int p = 0; p < m.nparams; p++) {
    const struct kd_param *q = &m.params[p];
    t[p] = (struct st_tensor){q->name, q->ndim, {q->shape[0], q->shape[1]}, m.master + q->offset};
  }
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  if (st_write(path, t, m.nparams, err, sizeof err)) kd_fail(KD_EXIT_IO, "%s", err);
  printf("kdconvert: %s -> %s (config.json, model.safetensors: %d tensors)\n", in, dir,
         m.nparams);
  free(t);
  model_free(&m, &be);
  return 0;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int st = KD_EXIT_INPUT;
  if (argc >= 4 && argc <= 5 && !strcmp(argv[1], "from-hf")) {
    char card[1200];
    size_t n = strlen(argv[3]);
    if (n >= 3 && !strcmp(argv[3] + n - 3, ".h5")) n -= 3; /* OUT.h5 -> OUT.nml */
    if (argc == 5) snprintf(card, sizeof card, "%s", argv[4]);
    else snprintf(card, sizeof card, "%.*s.nml", (int)n, argv[3]);
    st = from_hf(argv[2], argv[3], card);
  } else if (argc == 4 && !strcmp(argv[1], "to-hf")) {
    st = to_hf(argv[2], argv[3]);
  } else {
    fprintf(stderr, "usage: kdconvert from-hf HF_DIR OUT.h5 [CARD.nml]\n"
                    "       kdconvert to-hf WEIGHTS_OR_CHECKPOINT.h5 OUT_DIR\n");
  }
  MPI_Finalize();
  return st;
}
