/* hfconfig.c: config.json of a Hugging Face Qwen2 / Qwen3 / Llama / Mistral / Gemma 3 /
 * Qwen3-MoE / Mixtral / Phi-3 model <->
 * model card (Gemma 3 multimodal: its text_config).
 * Absent keys take the transformers default of the model_type; a key whose value kdtrain
 * does not compute is refused, never ignored. The keys config.json holds as the card does
 * (the plain keys: CARD_HF in card_keys.h) are read by read_plain and written by one loop;
 * the others by code of their own: renamed (num_local_experts), nested (rope_parameters /
 * rope_scaling, Gemma's text_config and sliding-layer RoPE), null-valued (pad_token_id,
 * sliding_window, the soft caps), read by rules of the model_type (head_dim, the windows,
 * the qwen3_moe-only expert keys, attention_bias), or SmolLM3's no_rope_layers. */
#include "tools/hfconfig.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* transformers' defaults for the keys that have one, and how each model_type spells what
 * kdtrain computes. The first entry of a card arch is the one exported. */
struct hf_arch {
  const char *model_type;
  enum kd_arch arch; /* the card's arch */
  const char *architecture;
  int kv_heads; /* num_key_value_heads when absent; 0: num_attention_heads */
  int max_pos;
  int qkv_bias;    /* q/k/v biases always (the key attention_bias is not read) */
  int bias_key;    /* reads attention_bias (which would include o_proj) */
  int window_flag; /* use_sliding_window turns the window on */
  int window_size; /* sliding_window alone sets a window; absent, this many tokens (-1: none) */
  int head_dim;    /* head_dim when absent; 0: hidden_size / num_attention_heads */
  /* vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads when
   * absent (0: required), tie_word_embeddings when absent */
  int sizes[5], tie;
  int text_config; /* a multimodal model: the decoder's keys are in text_config */
};
/* Gemma3TextConfig's defaults (the 2B-shaped text model transformers describes) */
#define GEMMA3_SIZES                                                                               \
  { 262208, 2304, 9216, 26, 8 }
/* Phi3Config's defaults (Phi-3-mini's) */
#define PHI3_SIZES                                                                                 \
  { 32064, 3072, 8192, 32, 32 }
/* SmolLM3Config's defaults (SmolLM3-3B's) */
#define SMOLLM3_SIZES                                                                              \
  { 128256, 2048, 11008, 36, 16 }
/* Olmo2Config's defaults (OLMo-2-7B's) */
#define OLMO2_SIZES                                                                                \
  { 50304, 4096, 11008, 32, 32 }
/* transformers' default window of the model_types that have one (sliding_window absent;
 * JSON null: none) */
#define HF_WINDOW_DEFAULT 4096
static const struct hf_arch archs[] = {
    {"qwen2", KD_ARCH_QWEN2, "Qwen2ForCausalLM", 32, 32768, 1, 0, 1, 0, 0, {0}, 0, 0},
    {"llama", KD_ARCH_LLAMA, "LlamaForCausalLM", 0, 2048, 0, 1, 0, 0, 0, {0}, 0, 0},
    {"mistral", KD_ARCH_LLAMA, "MistralForCausalLM", 8, 4096 * 32, 0, 0, 0, 4096, 0, {0}, 0, 0},
    {"qwen3", KD_ARCH_QWEN3, "Qwen3ForCausalLM", 32, 32768, 0, 1, 1, 0, 128, {0}, 0, 0},
    {"gemma3_text", KD_ARCH_GEMMA3, "Gemma3ForCausalLM", 4, 131072, 0, 1, 0, 0, 256, GEMMA3_SIZES,
     1, 0},
    {"gemma3", KD_ARCH_GEMMA3, "Gemma3ForConditionalGeneration", 4, 131072, 0, 1, 0, 0, 256,
     GEMMA3_SIZES, 1, 1},
    {"qwen3_moe", KD_ARCH_QWEN3_MOE, "Qwen3MoeForCausalLM", 4, 32768, 0, 1, 1, 0, 0, {0}, 0, 0},
    {"mixtral", KD_ARCH_MIXTRAL, "MixtralForCausalLM", 8, 4096 * 32, 0, 0, 0, -1, 0, {0}, 0, 0},
    {"phi3", KD_ARCH_PHI3, "Phi3ForCausalLM", 0, 4096, 0, 0, 0, -1, 0, PHI3_SIZES, 0, 0},
    {"olmo2", KD_ARCH_OLMO2, "Olmo2ForCausalLM", 0, 2048, 0, 1, 0, 0, 0, OLMO2_SIZES, 0, 0},
    {"smollm3", KD_ARCH_SMOLLM3, "SmolLM3ForCausalLM", 4, 32768, 0, 1, 1, 0, 0, SMOLLM3_SIZES, 1,
     0},
};
#define NARCHS (sizeof archs / sizeof archs[0])

/* Reading state: the file, its JSON (o: the decoder's keys, top: the whole file; the same
 * object but for a multimodal model's text_config), and the error buffer. */
struct rd {
  const char *path;
  const cJSON *o;
  char *err;
  size_t errlen;
  const cJSON *top;
};

/* A key's value, NULL when absent or JSON null (transformers treats both as unset). */
static const cJSON *get(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return v && !cJSON_IsNull(v) ? v : NULL;
}

/* Refuse `key` = its value with `why`; returns KD_EXIT_INPUT. */
static int refuse(const struct rd *r, const char *key, const cJSON *v, const char *why) {
  char *text = v ? cJSON_PrintUnformatted(v) : NULL;
  kd_seterr(r->err, r->errlen, "%s: key \"%s\" = %s: %s", r->path, key, text ? text : "(absent)",
            why);
  free(text);
  return KD_EXIT_INPUT;
}

/* A positive integer key; `dflt` < 0: required. */
static int get_int(const struct rd *r, const char *key, int dflt, int *out) {
  const cJSON *v = get(r->o, key);
  if (!v && dflt >= 0) return *out = dflt, 0;
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 ||
      v->valuedouble > 2147483647.0)
    return refuse(r, key, v, "expected a positive integer");
  *out = (int)v->valuedouble;
  return 0;
}

/* pad_token_id: the embedding row transformers never trains (nn.Embedding's padding_idx);
 * absent: the model_type's default (Gemma3TextConfig 0, Phi3Config 32000, Olmo2Config 1,
 * SmolLM3Config 128004, the others none), null: none (-1). */
static int read_pad(const struct rd *r, const struct hf_arch *a, struct kd_card *c) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->o, "pad_token_id");
  c->pad_token_id = a->arch == KD_ARCH_GEMMA3    ? 0
                    : a->arch == KD_ARCH_PHI3    ? 32000
                    : a->arch == KD_ARCH_OLMO2   ? 1
                    : a->arch == KD_ARCH_SMOLLM3 ? 128004
                                                 : -1;
  if (!v && c->pad_token_id >= c->vocab_size)
    return refuse(r, "pad_token_id", v,
                  "its default (the model_type's config class's) is not an id of this vocabulary "
                  "(transformers cannot build the embedding); expected null or an id");
  if (!v) return 0;
  if (cJSON_IsNull(v)) return c->pad_token_id = -1, 0;
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
      v->valuedouble >= c->vocab_size)
    return refuse(r, "pad_token_id", v, "expected null or an id of the vocabulary");
  c->pad_token_id = (int)v->valuedouble;
  return 0;
}

/* A positive real key of object `o` (default when absent). */
static int get_real(const struct rd *r, const cJSON *o, const char *key, double dflt, double *out) {
  const cJSON *v = get(o, key);
  if (!v) return *out = dflt, 0;
  if (!cJSON_IsNumber(v) || !(v->valuedouble > 0))
    return refuse(r, key, v, "expected a positive number");
  *out = v->valuedouble;
  return 0;
}

/* A logical key (default when absent). */
static int get_bool(const struct rd *r, const char *key, int dflt, int *out) {
  const cJSON *v = get(r->o, key);
  if (!v) return *out = dflt, 0;
  if (!cJSON_IsBool(v)) return refuse(r, key, v, "expected true or false");
  *out = cJSON_IsTrue(v);
  return 0;
}

/* transformers' defaults of the model_type for the keys config.json holds as the card does
 * (CARD_HF, card_keys.h), into d: the card defaults, then the model_type's (a size 0: none,
 * the key is required). num_key_value_heads follows num_attention_heads, read before it. */
static void hf_defaults(const struct hf_arch *a, const struct kd_card *c, struct kd_card *d) {
  card_defaults(d);
  const int mixtral = a->arch == KD_ARCH_MIXTRAL;
  d->vocab_size = a->sizes[0], d->hidden_size = a->sizes[1], d->intermediate_size = a->sizes[2];
  d->num_hidden_layers = a->sizes[3], d->num_attention_heads = a->sizes[4];
  d->num_key_value_heads = a->kv_heads ? a->kv_heads : c->num_attention_heads;
  d->max_position_embeddings = a->max_pos;
  /* MixtralConfig's, Phi3Config's and Olmo2Config's 1e-5 */
  d->rms_norm_eps = mixtral || a->arch == KD_ARCH_PHI3 || a->arch == KD_ARCH_OLMO2 ? 1e-5 : 1e-6;
  d->tie_word_embeddings = a->tie;
  d->num_experts_per_tok = mixtral ? 2 : 8; /* Qwen3MoeConfig's 8 */
}

/* Plain key k (CARD_HF) of config.json into the card: an integer, a number or a logical
 * within the key's card bounds; absent: transformers' default (hf_defaults), an integer below
 * its lower bound there meaning required. */
static int read_plain(const struct rd *r, const struct hf_arch *a, const struct kd_card_key *k,
                      struct kd_card *c) {
  char *field = (char *)c + k->off, why[64];
  const cJSON *v = get(r->o, k->name);
  const double lo = k->lo + ((k->nl_flags & NL_GT) && k->type == KD_CARD_INT);
  if (!v) {
    struct kd_card d;
    hf_defaults(a, c, &d);
    memcpy(field, (const char *)&d + k->off, k->size);
    if (k->type != KD_CARD_INT || *(const int *)field >= lo) return 0;
  }
  if (k->type == KD_CARD_BOOL) {
    if (!cJSON_IsBool(v)) return refuse(r, k->name, v, "expected true or false");
    *(int *)field = cJSON_IsTrue(v);
    return 0;
  }
  const double x = v && cJSON_IsNumber(v) ? v->valuedouble : NAN;
  const int low = (k->nl_flags & NL_GT) && k->type == KD_CARD_REAL ? !(x > lo) : !(x >= lo);
  const int high = (k->nl_flags & NL_LE) ? x > k->hi : (k->nl_flags & NL_LT) ? x >= k->hi : 0;
  if (k->type == KD_CARD_REAL) {
    if (low || high) {
      if ((k->nl_flags & NL_GT) && lo == 0)
        snprintf(why, sizeof why, "expected a positive number");
      else
        snprintf(why, sizeof why, "expected a number %s %g", k->nl_flags & NL_GT ? ">" : ">=", lo);
      return refuse(r, k->name, v, why);
    }
    *(double *)field = x;
    return 0;
  }
  KD_CHECK(k->type == KD_CARD_INT, "card key %s: config.json reads numbers and logicals", k->name);
  if (low || high || x != floor(x) || x > 2147483647.0) {
    if (lo == 1)
      snprintf(why, sizeof why, "expected a positive integer");
    else
      snprintf(why, sizeof why, "expected an integer >= %.0f", lo);
    return refuse(r, k->name, v, why);
  }
  *(int *)field = (int)x;
  return 0;
}

/* A number key of the RoPE dict `rp` (named `key`.name in messages) at least `lo` (above it
 * when `strict`); `dflt` when absent, `dflt` < 0: required. */
static int rope_num(const struct rd *r, const cJSON *rp, const char *key, const char *name,
                    double lo, int strict, double dflt, double *out) {
  char k[128];
  snprintf(k, sizeof k, "%s.%s", key, name);
  const cJSON *v = get(rp, name);
  if (!v && dflt >= 0) return *out = dflt, 0;
  if (!v) return refuse(r, k, v, "required by this rope_type");
  if (!cJSON_IsNumber(v) || (strict ? !(v->valuedouble > lo) : !(v->valuedouble >= lo)))
    return refuse(r, k, v, strict && lo == 0 ? "expected a positive number" : "out of range");
  *out = v->valuedouble;
  return 0;
}

/* The pretraining length of llama3 and yarn: as transformers 5 standardizes it, a
 * top-level original_max_position_embeddings first, then the dict's, then
 * max_position_embeddings. */
static int rope_original(const struct rd *r, const cJSON *rp, const char *key, struct kd_card *c) {
  const cJSON *top = get(r->o, "original_max_position_embeddings");
  double v = 0;
  int st =
      top ? get_int(r, "original_max_position_embeddings", -1, &c->original_max_position_embeddings)
          : rope_num(r, rp, key, "original_max_position_embeddings", 1, 0,
                     c->max_position_embeddings, &v);
  if (!st && !top) {
    if (v != floor(v) || v > 2147483647.0)
      return refuse(r, "original_max_position_embeddings",
                    get(rp, "original_max_position_embeddings"), "expected a positive integer");
    c->original_max_position_embeddings = (int)v;
  }
  return st;
}

/* The parameters of a scaled rope_type from dict `rp` (transformers 5's keys and defaults). */
static int read_rope_scaling(const struct rd *r, const cJSON *rp, const char *key,
                             struct kd_card *c) {
  int st = 0;
  if (c->rope_type == KD_ROPE_LINEAR) return rope_num(r, rp, key, "factor", 0, 1, -1, &c->factor);
  st = rope_original(r, rp, key, c);
  if (!st && c->rope_type == KD_ROPE_LLAMA3) {
    st = rope_num(r, rp, key, "factor", 0, 1, -1, &c->factor);
    if (!st) st = rope_num(r, rp, key, "low_freq_factor", 0, 1, -1, &c->low_freq_factor);
    if (!st) st = rope_num(r, rp, key, "high_freq_factor", 0, 1, -1, &c->high_freq_factor);
    if (!st && !(c->high_freq_factor > c->low_freq_factor))
      st = refuse(r, "high_freq_factor", get(rp, "high_freq_factor"),
                  "expected a value above low_freq_factor");
    return st;
  }
  /* yarn: factor from the two lengths when absent; falsy beta_* take 32 and 1 */
  if (!st)
    st = rope_num(r, rp, key, "factor", 0, 1,
                  (double)c->max_position_embeddings / c->original_max_position_embeddings,
                  &c->factor);
  if (!st) st = rope_num(r, rp, key, "attention_factor", 0, 1, 0, &c->attention_factor);
  if (!st) st = rope_num(r, rp, key, "mscale", 0, 0, 0, &c->mscale);
  if (!st) st = rope_num(r, rp, key, "mscale_all_dim", 0, 0, 0, &c->mscale_all_dim);
  if (!st) st = rope_num(r, rp, key, "beta_fast", 0, 0, 32.0, &c->beta_fast);
  if (!st) st = rope_num(r, rp, key, "beta_slow", 0, 0, 1.0, &c->beta_slow);
  if (!st && !c->beta_fast) c->beta_fast = 32.0;
  if (!st && !c->beta_slow) c->beta_slow = 1.0;
  const cJSON *t = get(rp, "truncate");
  if (!st && t && !cJSON_IsBool(t)) {
    char k[128];
    snprintf(k, sizeof k, "%s.truncate", key);
    st = refuse(r, k, t, "expected true or false");
  }
  if (!st && t) c->truncate = cJSON_IsTrue(t);
  return st;
}

/* RoPE: transformers 5 `rope_parameters` {rope_type, rope_theta, ...}, transformers 4
 * `rope_theta` + `rope_scaling`; a non-null rope_scaling takes precedence as in
 * transformers 5, and the dict's rope_theta over the top-level one. The default, linear,
 * llama3 and yarn rules over the full head dimension are computed; dynamic and longrope
 * are refused by name. */
static int read_rope(const struct rd *r, struct kd_card *c) {
  const char *key = "rope_scaling";
  const cJSON *rp = get(r->o, key);
  if (rp && cJSON_IsObject(rp) && !rp->child) rp = NULL; /* {} */
  if (!rp) key = "rope_parameters", rp = get(r->o, key);
  if (rp && !cJSON_IsObject(rp)) return refuse(r, key, rp, "expected an object");
  const cJSON *full = rp ? get(rp, "full_attention") : NULL;
  char k[96];
  if (full) { /* nested by layer type: every layer is full attention (checked elsewhere) */
    if (!cJSON_IsObject(full))
      return refuse(r, "rope_parameters.full_attention", full, "expected an object");
    rp = full;
    key = "rope_parameters.full_attention";
  }
  c->rope_type = KD_ROPE_DEFAULT;
  /* Gemma 3's global base, MixtralConfig's default_theta */
  const double theta0 = c->arch == KD_ARCH_GEMMA3 || c->arch == KD_ARCH_MIXTRAL ? 1e6 : 10000.0;
  int st = get_real(r, r->o, "rope_theta", theta0, &c->rope_theta);
  if (!st && rp) {
    snprintf(k, sizeof k, "%s.rope_theta", key);
    const cJSON *t = get(rp, "rope_theta");
    if (t && (!cJSON_IsNumber(t) || !(t->valuedouble > 0)))
      return refuse(r, k, t, "expected a positive number");
    if (t) c->rope_theta = t->valuedouble;
    const cJSON *ty = get(rp, "rope_type");
    snprintf(k, sizeof k, "%s.rope_type", key);
    if (!ty) {
      ty = get(rp, "type");
      snprintf(k, sizeof k, "%s.type", key);
    }
    if (ty && c->arch == KD_ARCH_PHI3 &&
        !(cJSON_IsString(ty) && words_find(KD_ROPE_TYPE_WORDS, ty->valuestring) == KD_ROPE_DEFAULT))
      return refuse(r, k, ty,
                    "Phi3Config computes \"default\" or \"longrope\" (\"su\" and \"yarn\" are "
                    "its old names of longrope: Phi-3-mini-128k's short and long factors); "
                    "kdtrain does not compute longrope (its frequencies change with the "
                    "sequence length): expected \"default\"");
    const int w = ty && cJSON_IsString(ty) ? words_find(KD_ROPE_TYPE_WORDS, ty->valuestring)
                  : ty                     ? -1
                                           : KD_ROPE_DEFAULT;
    if (w < 0) return refuse(r, k, ty, "expected \"default\", \"linear\", \"llama3\" or \"yarn\"");
    if (w == KD_ROPE_DYNAMIC || w == KD_ROPE_LONGROPE)
      return refuse(r, k, ty,
                    "kdtrain does not compute this RoPE scaling (its frequencies change with "
                    "the sequence length); it computes default, linear, llama3 and yarn");
    c->rope_type = (enum kd_rope_type)w;
    if (w != KD_ROPE_DEFAULT) st = read_rope_scaling(r, rp, key, c);
  }
  const cJSON *prf = rp && get(rp, "partial_rotary_factor") ? get(rp, "partial_rotary_factor")
                                                            : get(r->o, "partial_rotary_factor");
  if (!st && prf && (!cJSON_IsNumber(prf) || prf->valuedouble != 1.0))
    return refuse(r, "partial_rotary_factor", prf,
                  "kdtrain rotates the full head dimension: expected 1.0");
  return st;
}

/* A per-layer list of config.json (layer_types; no_rope_layers, of which transformers reads
 * the first num_hidden_layers values): an array of exactly (exact) or at least
 * num_hidden_layers values, which a card can hold; 0 or the refusal. */
static int layer_list_check(const struct rd *r, const char *key, const cJSON *v,
                            const struct kd_card *c, int exact, const char *what) {
  const int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
  if (n < 0 || (exact ? n != c->num_hidden_layers : n < c->num_hidden_layers)) {
    char why[128];
    snprintf(why, sizeof why, "expected a list of %s for each of the %d layers", what,
             c->num_hidden_layers);
    return refuse(r, key, v, why);
  }
  if (c->num_hidden_layers > KD_LAYERS_MAX) {
    char why[96];
    snprintf(why, sizeof why, "a card's %s holds at most %d layers", key, KD_LAYERS_MAX);
    return refuse(r, "num_hidden_layers", get(r->o, "num_hidden_layers"), why);
  }
  return 0;
}

/* layer_types of config.json into the card (absent: none), one known word per layer. */
static int read_layer_types(const struct rd *r, struct kd_card *c) {
  const cJSON *lt = get(r->o, "layer_types"), *e;
  if (!lt) return 0;
  const int st = layer_list_check(r, "layer_types", lt, c, 1, "a layer type");
  if (st) return st;
  int i = 0;
  cJSON_ArrayForEach(e, lt) {
    const int w = cJSON_IsString(e) ? words_find(KD_LAYER_TYPE_WORDS, e->valuestring) : -1;
    if (w < 0) {
      char k[64];
      snprintf(k, sizeof k, "layer_types[%d]", i);
      return refuse(r, k, e, "kdtrain computes \"full_attention\" and \"sliding_attention\"");
    }
    c->layer_types[i++] = (enum kd_layer_type)w;
  }
  c->n_layer_types = i;
  return 0;
}

/* The first layer whose type in the card's layer_types differs from what the other window
 * keys give it without them, or -1. */
static int layer_types_differ(const struct kd_card *c) {
  struct kd_card d = *c;
  d.n_layer_types = 0;
  for (int l = 0; l < c->n_layer_types; l++)
    if ((c->layer_types[l] == KD_LAYER_SLIDING) != (card_layer_window(&d, l) > 0)) return l;
  return -1;
}

/* Sliding-window attention as transformers 5 reads it: qwen2 / qwen3 keep sliding_window
 * only with use_sliding_window and mark the layers from max_window_layers on, unless
 * layer_types marks them; mistral has sliding_window in every layer (its layer_types is
 * ignored by transformers: refused unless it says the same), as have mixtral and phi3;
 * llama has no window (a sliding layer refused). sliding_window absent: the model_type's
 * default (Qwen2, Qwen3, Mistral 4096; Mixtral, Phi-3 none); null: none. */
static int read_window(const struct rd *r, const struct hf_arch *a, struct kd_card *c) {
  const cJSON *use = get(r->o, "use_sliding_window");
  if (use && !cJSON_IsBool(use))
    return refuse(r, "use_sliding_window", use, "expected true or false");
  const cJSON *sw = cJSON_GetObjectItemCaseSensitive(r->o, "sliding_window");
  int w = 0;
  if (!sw) w = a->window_flag ? HF_WINDOW_DEFAULT : a->window_size > 0 ? a->window_size : 0;
  if ((a->window_flag || a->window_size) && sw && !cJSON_IsNull(sw)) {
    if (!cJSON_IsNumber(sw) || sw->valuedouble != floor(sw->valuedouble) || sw->valuedouble < 1 ||
        sw->valuedouble > 2147483647.0)
      return refuse(r, "sliding_window", sw, "expected a window of at least 1 token, or null");
    w = (int)sw->valuedouble;
  }
  if (a->window_flag) { /* qwen2 / qwen3: the window only with the switch */
    if (!cJSON_IsTrue(use)) w = 0;
    c->use_sliding_window = w > 0;
    const cJSON *m = get(r->o, "max_window_layers");
    if (m && (!cJSON_IsNumber(m) || m->valuedouble != floor(m->valuedouble) || m->valuedouble < 0 ||
              m->valuedouble > 2147483647.0))
      return refuse(r, "max_window_layers", m, "expected a layer index (an integer >= 0)");
    c->max_window_layers = m ? (int)m->valuedouble : 28;
  }
  c->sliding_window = w;
  int st = read_layer_types(r, c);
  if (st || !c->n_layer_types) return st;
  char k[64];
  for (int l = 0; l < c->n_layer_types; l++)
    if (c->layer_types[l] == KD_LAYER_SLIDING && !card_layer_window(c, l)) {
      snprintf(k, sizeof k, "layer_types[%d]", l);
      return refuse(r, k, cJSON_GetArrayItem(get(r->o, "layer_types"), l),
                    a->window_flag
                        ? "a sliding layer without a window (use_sliding_window is not true or "
                          "sliding_window is null): transformers cannot build its mask"
                    : a->window_size ? "a sliding layer without a window (sliding_window is null)"
                                     : "kdtrain computes full attention in every layer of a llama "
                                       "model (transformers' Llama has no window)");
    }
  const int l = layer_types_differ(c);
  if (!a->window_flag && l >= 0) {
    char why[192];
    snprintf(k, sizeof k, "layer_types[%d]", l);
    snprintf(why, sizeof why,
             "transformers' %s gives every layer the window sliding_window and ignores "
             "layer_types; expected the same type in every layer",
             a->architecture);
    return refuse(r, k, cJSON_GetArrayItem(get(r->o, "layer_types"), l), why);
  }
  if (l < 0) c->n_layer_types = 0; /* says what the other keys say: the card stays short */
  return 0;
}

/* Gemma 3's windows as transformers 5 reads them: sliding_window (absent: 4096) on the
 * layers layer_types marks 'sliding_attention', or without layer_types on every layer but
 * each sliding_window_pattern-th (default 6: five local layers, then a global one). The
 * card keeps every layer's type. */
static int read_gemma_window(const struct rd *r, struct kd_card *c) {
  const cJSON *sw = get(r->o, "sliding_window");
  if (sw && (!cJSON_IsNumber(sw) || sw->valuedouble != floor(sw->valuedouble) ||
             sw->valuedouble < 1 || sw->valuedouble > 2147483647.0))
    return refuse(r, "sliding_window", sw, "expected a window of at least 1 token");
  c->sliding_window = sw ? (int)sw->valuedouble : HF_WINDOW_DEFAULT;
  int st = read_layer_types(r, c);
  if (st || c->n_layer_types) return st;
  if (c->num_hidden_layers > KD_LAYERS_MAX)
    return refuse(r, "num_hidden_layers", get(r->o, "num_hidden_layers"),
                  "kdtrain's layer_types holds at most 512 layers");
  int pattern = 6;
  st = get_int(r, "sliding_window_pattern", 6, &pattern);
  for (int l = 0; l < c->num_hidden_layers && !st; l++)
    c->layer_types[l] = (l + 1) % pattern ? KD_LAYER_SLIDING : KD_LAYER_FULL;
  c->n_layer_types = st ? 0 : c->num_hidden_layers;
  return st;
}

/* head_dim (the model_type's default when absent, hidden_size / num_attention_heads when
 * that has none): the card keeps 0 for hidden_size / num_attention_heads unless the
 * model_type has a default of its own. */
static int read_head_dim(const struct rd *r, const struct hf_arch *a, struct kd_card *c) {
  const int nh = c->num_attention_heads;
  int hd = a->head_dim;
  if (!hd && !get(r->o, "head_dim") && c->hidden_size % nh)
    return refuse(r, "num_attention_heads", get(r->o, "num_attention_heads"),
                  "hidden_size is not a multiple of it (and head_dim is not given)");
  int st = get_int(r, "head_dim", hd ? hd : c->hidden_size / nh, &hd);
  if (!st && hd % 2)
    st = refuse(r, "head_dim", get(r->o, "head_dim"),
                "expected an even head dimension (rotary embeddings)");
  c->head_dim = a->head_dim || (int64_t)hd * nh != c->hidden_size ? hd : 0;
  return st;
}

/* Gemma 3's own keys (Gemma3TextConfig's defaults when absent): the activation, the score
 * scale, the final logits' soft cap (null: none; the attention scores' cap, which
 * transformers' Gemma 3 reads but never applies, must be null), and the sliding-window
 * layers' RoPE base, from transformers 5's rope_parameters.sliding_attention (the default
 * rule only) or 4's rope_local_base_freq. */
static int read_gemma(const struct rd *r, struct kd_card *c) {
  const cJSON *v = get(r->o, "hidden_activation");
  if (v && !(cJSON_IsString(v) && words_find(KD_ACT_WORDS, v->valuestring) == KD_ACT_GELU_TANH))
    return refuse(r, "hidden_activation", v, "kdtrain computes Gemma's gelu_pytorch_tanh only");
  c->hidden_activation = KD_ACT_GELU_TANH;
  if ((v = get(r->o, "use_bidirectional_attention")) && !cJSON_IsFalse(v))
    return refuse(r, "use_bidirectional_attention", v, "kdtrain computes causal attention only");
  int st = get_real(r, r->o, "query_pre_attn_scalar", 256.0, &c->query_pre_attn_scalar);
  if (!st) st = get_real(r, r->o, "final_logit_softcapping", 0.0, &c->final_logit_softcapping);
  if (!st && (v = get(r->o, "attn_logit_softcapping")))
    return refuse(r, "attn_logit_softcapping", v,
                  "transformers' Gemma 3 does not apply it (kdtrain would): expected null");
  if (!st) st = get_real(r, r->o, "rope_local_base_freq", 10000.0, &c->rope_local_base_freq);
  const cJSON *rp = get(r->o, "rope_parameters");
  const cJSON *sl = rp && cJSON_IsObject(rp) ? get(rp, "sliding_attention") : NULL;
  if (st || !sl) return st;
  if (!cJSON_IsObject(sl))
    return refuse(r, "rope_parameters.sliding_attention", sl, "expected an object");
  const cJSON *ty = get(sl, "rope_type");
  if (ty &&
      !(cJSON_IsString(ty) && words_find(KD_ROPE_TYPE_WORDS, ty->valuestring) == KD_ROPE_DEFAULT))
    return refuse(r, "rope_parameters.sliding_attention.rope_type", ty,
                  "kdtrain computes the default rule on the sliding-window layers");
  const cJSON *t = get(sl, "rope_theta");
  if (t && (!cJSON_IsNumber(t) || !(t->valuedouble > 0)))
    return refuse(r, "rope_parameters.sliding_attention.rope_theta", t,
                  "expected a positive number");
  if (t) c->rope_local_base_freq = t->valuedouble;
  return 0;
}

/* An integer key at least lo (default when absent). */
static int get_int_ge(const struct rd *r, const char *key, int lo, int dflt, int *out) {
  const cJSON *v = get(r->o, key);
  if (!v) return *out = dflt, 0;
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
      v->valuedouble > 2147483647.0) {
    char why[64];
    snprintf(why, sizeof why, "expected an integer >= %d", lo);
    return refuse(r, key, v, why);
  }
  *out = (int)v->valuedouble;
  return 0;
}

/* The mixture-of-experts keys of code of their own (Qwen3MoeConfig's and MixtralConfig's
 * defaults when absent; experts per token and the load-balancing loss weight are read with
 * the plain keys, read_plain): the expert count in both spellings (num_experts in Hub configs,
 * num_local_experts as transformers 5 writes them), and the keys qwen3_moe reads and
 * MixtralConfig has not: an expert's size, the top-k renormalisation (Mixtral always
 * renormalises) and which layers are sparse. Mixtral's router jitter is not computed. */
static int read_moe(const struct rd *r, const struct hf_arch *a, struct kd_card *c) {
  const int mixtral = a->arch == KD_ARCH_MIXTRAL;
  const char *ekey = get(r->o, "num_local_experts") ? "num_local_experts" : "num_experts";
  const cJSON *both = get(r->o, "num_experts"), *local = get(r->o, "num_local_experts");
  if (both && local &&
      !(cJSON_IsNumber(both) && cJSON_IsNumber(local) && both->valuedouble == local->valuedouble))
    return refuse(r, "num_experts", both, "differs from num_local_experts (the same key)");
  int st = get_int_ge(r, ekey, 0, mixtral ? 8 : 128, &c->num_experts);
  if (!st && c->num_experts > 0 && c->num_experts_per_tok > c->num_experts)
    st = refuse(r, "num_experts_per_tok", get(r->o, "num_experts_per_tok"),
                "more experts per token than num_experts");
  const cJSON *v;
  if (!st && mixtral && (v = get(r->o, "router_jitter_noise")) &&
      !(cJSON_IsNumber(v) && v->valuedouble == 0))
    return refuse(r, "router_jitter_noise", v,
                  "kdtrain computes the router without jitter: expected 0.0");
  c->norm_topk_prob = 1;
  c->decoder_sparse_step = 1;
  if (st || mixtral) return st;
  st = get_int_ge(r, "moe_intermediate_size", 1, 768, &c->moe_intermediate_size);
  if (!st) st = get_bool(r, "norm_topk_prob", 0, &c->norm_topk_prob);
  if (!st) st = get_int_ge(r, "decoder_sparse_step", 1, 1, &c->decoder_sparse_step);
  if (st || !(v = get(r->o, "mlp_only_layers"))) return st;
  if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > KD_LAYERS_MAX)
    return refuse(r, "mlp_only_layers", v, "expected a list of layer indices");
  const cJSON *e;
  cJSON_ArrayForEach(e, v) {
    if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
        e->valuedouble >= c->num_hidden_layers)
      return refuse(r, "mlp_only_layers", v,
                    "expected layer indices from 0 to num_hidden_layers - 1");
    c->mlp_only_layers[c->n_mlp_only_layers++] = (int)e->valuedouble;
  }
  return 0;
}

/* Layers without RoPE (a family with the NoPE keys, arch.h nope_keys; SmolLM3Config):
 * no_rope_layers, 1 where a layer uses RoPE and 0 where it does not (transformers reads the
 * first num_hidden_layers values of a longer list), or without it every
 * no_rope_layer_interval-th layer without RoPE (the interval is read with the plain keys,
 * read_plain). A list that says what the interval says stays out of the card. */
static int read_nope(const struct rd *r, struct kd_card *c) {
  const cJSON *v = get(r->o, "no_rope_layers"), *e;
  c->n_no_rope_layers = 0;
  if (!v) return 0;
  const int st = layer_list_check(r, "no_rope_layers", v, c, 0, "a 1 or 0");
  if (st) return st;
  int i = 0, differ = 0;
  cJSON_ArrayForEach(e, v) {
    if (i == c->num_hidden_layers) break;
    const int ok =
        cJSON_IsBool(e) || (cJSON_IsNumber(e) && (e->valuedouble == 0 || e->valuedouble == 1));
    if (!ok) {
      char k[64];
      snprintf(k, sizeof k, "no_rope_layers[%d]", i);
      return refuse(r, k, e, "expected 1 (the layer uses RoPE) or 0 (it does not)");
    }
    c->no_rope_layers[i] = cJSON_IsBool(e) ? cJSON_IsTrue(e) : (int)e->valuedouble;
    differ |= c->no_rope_layers[i] != card_nope_rule(c, i); /* the interval's rule (n is 0) */
    i++;
  }
  c->n_no_rope_layers = differ ? i : 0;
  return 0;
}

/* The keys that must have the one value kdtrain computes. */
static int read_fixed(const struct rd *r, const struct hf_arch *a, struct hf_extra *x) {
  const cJSON *v;
  if ((v = get(r->top, "architectures"))) {
    const cJSON *first = cJSON_IsArray(v) ? cJSON_GetArrayItem(v, 0) : NULL;
    if (!cJSON_IsString(first) || strcmp(first->valuestring, a->architecture)) {
      char why[128];
      snprintf(why, sizeof why, "expected [\"%s\"] for model_type \"%s\"", a->architecture,
               a->model_type);
      return refuse(r, "architectures", v, why);
    }
  }
  if ((v = get(r->top, "quantization_config")))
    return refuse(r, "quantization_config", v, "kdconvert reads unquantized weights only");
  v = a->arch == KD_ARCH_GEMMA3 ? NULL : get(r->o, "hidden_act"); /* Gemma 3 ignores it */
  if (v && !(cJSON_IsString(v) && (words_find(KD_ACT_WORDS, v->valuestring) == KD_ACT_SILU ||
                                   !strcmp(v->valuestring, "swish"))))
    return refuse(r, "hidden_act", v, "kdtrain computes the SiLU (SwiGLU) MLP only");
  v = get(r->o, "mlp_bias");
  if (v && !cJSON_IsFalse(v)) return refuse(r, "mlp_bias", v, "kdtrain's MLP has no biases");
  const char *dkey = get(r->top, "dtype") ? "dtype" : "torch_dtype";
  v = get(r->top, dkey);
  if (v && !(cJSON_IsString(v) &&
             (!strcmp(v->valuestring, "float32") || !strcmp(v->valuestring, "bfloat16") ||
              !strcmp(v->valuestring, "float16"))))
    return refuse(r, dkey, v, "expected float32, bfloat16 or float16");
  if (v) snprintf(x->dtype, sizeof x->dtype, "%s", v->valuestring);
  return 0;
}

int hfconfig_read(struct kd_card *c, struct hf_extra *x, const char *dir, char *err,
                  size_t errlen) {
  char path[1200];
  snprintf(path, sizeof path, "%s/config.json", dir);
  card_defaults(c); /* the RoPE scaling keys of a default rule keep the card defaults */
  memset(x, 0, sizeof *x);
  FILE *f = fopen(path, "rb");
  char *text = NULL;
  size_t len = 0;
  if (f) {
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = kd_calloc((size_t)(n > 0 ? n : 0) + 1, 1);
    len = n > 0 ? fread(text, 1, (size_t)n, f) : 0;
    fclose(f);
  }
  if (!f) {
    kd_seterr(err, errlen, "%s: cannot read (is %s a Hugging Face model directory?)", path, dir);
    return KD_EXIT_INPUT;
  }
  cJSON *o = cJSON_ParseWithLength(text, len);
  free(text);
  if (!cJSON_IsObject(o)) {
    kd_seterr(err, errlen, "%s: not a JSON object", path);
    cJSON_Delete(o);
    return KD_EXIT_INPUT;
  }
  struct rd r = {path, o, err, errlen, o};
  const struct hf_arch *a = NULL;
  const cJSON *mt = get(o, "model_type");
  for (size_t i = 0; i < NARCHS && cJSON_IsString(mt); i++)
    if (!strcmp(mt->valuestring, archs[i].model_type)) a = &archs[i];
  int st = a ? 0
             : refuse(&r, "model_type", mt,
                      "kdtrain computes qwen2, qwen3, llama, mistral, gemma3_text, gemma3, "
                      "qwen3_moe, mixtral and phi3");
  if (!st && a->text_config) { /* the language model of a multimodal model */
    const cJSON *tc = get(o, "text_config"), *tmt = tc ? get(tc, "model_type") : NULL;
    if (!cJSON_IsObject(tc))
      st = refuse(&r, "text_config", tc, "expected the text model's configuration (an object)");
    else if (tmt && !(cJSON_IsString(tmt) && !strcmp(tmt->valuestring, "gemma3_text")))
      st = refuse(&r, "text_config.model_type", tmt, "expected \"gemma3_text\"");
    else
      r.o = tc;
    x->multimodal = 1;
  }
  if (!st) {
    c->arch = a->arch;
    snprintf(x->model_type, sizeof x->model_type, "%s", a->model_type);
  }
  /* the keys config.json holds as the card does, those of the family's traits only */
  for (size_t i = 0; i < KD_CARD_NKEYS && !st; i++)
    if ((kd_card_keys[i].flags & CARD_HF) && card_key_family(&kd_card_keys[i], c))
      st = read_plain(&r, a, &kd_card_keys[i], c);
  if (!st) st = read_head_dim(&r, a, c);
  if (!st && c->num_attention_heads % c->num_key_value_heads)
    st = refuse(&r, "num_key_value_heads", get(r.o, "num_key_value_heads"),
                "num_attention_heads is not a multiple of it");
  if (!st && a->text_config && get(o, "tie_word_embeddings")) { /* Gemma3Config's own */
    const struct rd rt = {path, o, err, errlen, o};
    st = get_bool(&rt, "tie_word_embeddings", a->tie, &c->tie_word_embeddings);
  }
  if (!st) st = read_pad(&r, a, c);
  if (!st) st = read_rope(&r, c);
  if (!st && a->arch == KD_ARCH_GEMMA3) st = read_gemma(&r, c);
  if (!st && card_traits(c)->moe) st = read_moe(&r, a, c);
  if (!st && card_traits(c)->nope_keys) st = read_nope(&r, c);
  if (!st) { /* qwen2: q/k/v biases always (the key is not read by transformers) */
    c->attention_bias = a->qkv_bias;
    if (a->bias_key) {
      int bias = 0;
      st = get_bool(&r, "attention_bias", 0, &bias);
      if (!st && bias)
        st = refuse(&r, "attention_bias", get(r.o, "attention_bias"),
                    "this attention bias includes o_proj, which kdtrain does not compute");
    }
  }
  if (!st) st = a->arch == KD_ARCH_GEMMA3 ? read_gemma_window(&r, c) : read_window(&r, a, c);
  if (!st) st = read_fixed(&r, a, x);
  cJSON_Delete(o);
  return st;
}

/* key = v written as a real (3.0, not 3): transformers' strict configs type-check floats;
 * the shortest of 15 to 17 digits that reads back to v. */
static void add_real(cJSON *o, const char *key, double v) {
  char t[64];
  for (int digits = 15; digits <= 17; digits++)
    if (snprintf(t, sizeof t, "%.*g", digits, v) > 0 && strtod(t, NULL) == v) break;
  if (!strpbrk(t, ".eEn")) strcat(t, ".0"); /* n: inf, nan */
  cJSON_AddRawToObject(o, key, t);
}

/* The RoPE dict of card `c`: its rope_type, rope_theta and the type's parameters. */
static void write_rope(cJSON *rp, const struct kd_card *c) {
  cJSON_AddStringToObject(rp, "rope_type", kd_rope_type_names[c->rope_type]);
  cJSON_AddNumberToObject(rp, "rope_theta", c->rope_theta);
  if (c->rope_type == KD_ROPE_DEFAULT) return;
  cJSON_AddNumberToObject(rp, "factor", c->factor);
  if (c->rope_type == KD_ROPE_LINEAR) return;
  const int orig = c->original_max_position_embeddings > 0 ? c->original_max_position_embeddings
                                                           : c->max_position_embeddings;
  cJSON_AddNumberToObject(rp, "original_max_position_embeddings", orig);
  if (c->rope_type == KD_ROPE_LLAMA3) {
    cJSON_AddNumberToObject(rp, "low_freq_factor", c->low_freq_factor);
    cJSON_AddNumberToObject(rp, "high_freq_factor", c->high_freq_factor);
    return;
  }
  cJSON_AddNumberToObject(rp, "beta_fast", c->beta_fast);
  cJSON_AddNumberToObject(rp, "beta_slow", c->beta_slow);
  cJSON_AddBoolToObject(rp, "truncate", c->truncate);
  if (c->attention_factor > 0) cJSON_AddNumberToObject(rp, "attention_factor", c->attention_factor);
  if (c->mscale > 0) cJSON_AddNumberToObject(rp, "mscale", c->mscale);
  if (c->mscale_all_dim > 0) cJSON_AddNumberToObject(rp, "mscale_all_dim", c->mscale_all_dim);
}

char *hfconfig_write(const struct kd_card *c, char *err, size_t errlen) {
  const struct hf_arch *a = &archs[0];
  while (a->arch != c->arch && a + 1 < archs + NARCHS)
    a++;
  const int qwen = a->arch == KD_ARCH_QWEN2 || a->arch == KD_ARCH_QWEN3; /* their config keys */
  int window = 0, mixed = 0;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    const int w = card_layer_window(c, l);
    mixed |= l > 0 && w != window;
    window = w;
  }
  if (a->arch == KD_ARCH_LLAMA &&
      (mixed || window)) { /* a window in a llama card: transformers' Mistral */
    a = &archs[0];
    while (strcmp(a->model_type, "mistral"))
      a++;
    if (mixed) {
      kd_seterr(err, errlen,
                "the card's sliding window differs between layers (layer_types); transformers' "
                "Llama has no window and its Mistral one window in every layer: no config.json "
                "of model_type llama or mistral computes this model");
      return NULL;
    }
  }
  if (mixed && a->window_size) { /* mixtral, phi3: one window in every layer */
    kd_seterr(err, errlen,
              "the card's sliding window differs between layers (layer_types); transformers' "
              "%s has one window in every layer: no config.json of model_type %s computes "
              "this model",
              a->architecture, a->model_type);
    return NULL;
  }
  if (c->attention_bias && !a->qkv_bias && !a->bias_key) {
    kd_seterr(err, errlen,
              "the card has attention biases (attention_bias = .true.); transformers' %s has "
              "none: no config.json of model_type %s computes this model",
              a->architecture, a->model_type);
    return NULL;
  }
  cJSON *o = cJSON_CreateObject();
  cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
  cJSON_AddItemToArray(arch, cJSON_CreateString(a->architecture));
  cJSON_AddStringToObject(o, "model_type", a->model_type);
  for (size_t i = 0; i < KD_CARD_NKEYS; i++) { /* the keys config.json holds as the card does */
    const struct kd_card_key *k = &kd_card_keys[i];
    const char *field = (const char *)c + k->off;
    if (!(k->flags & CARD_HF) || !card_key_present(k, c)) continue;
    if (k->type == KD_CARD_REAL)
      add_real(o, k->name, *(const double *)field);
    else if (k->type == KD_CARD_BOOL)
      cJSON_AddBoolToObject(o, k->name, *(const int *)field);
    else
      cJSON_AddNumberToObject(o, k->name, *(const int *)field);
  }
  cJSON_AddNumberToObject(o, "head_dim", card_head_dim(c));
  const int gemma = c->arch == KD_ARCH_GEMMA3;
  if (gemma)
    cJSON_AddStringToObject(o, "hidden_activation", kd_act_names[c->hidden_activation]);
  else
    cJSON_AddStringToObject(o, "hidden_act", "silu");
  /* both spellings: transformers 4 reads rope_theta, 5 rope_parameters */
  cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
  cJSON *rp = cJSON_AddObjectToObject(o, "rope_parameters");
  if (gemma) { /* transformers 5: one dict per layer type; 4: rope_local_base_freq */
    write_rope(cJSON_AddObjectToObject(rp, "full_attention"), c);
    cJSON *sl = cJSON_AddObjectToObject(rp, "sliding_attention");
    cJSON_AddStringToObject(sl, "rope_type", "default");
    cJSON_AddNumberToObject(sl, "rope_theta", c->rope_local_base_freq);
    cJSON_AddNumberToObject(o, "rope_local_base_freq", c->rope_local_base_freq);
  } else {
    write_rope(rp, c);
  }
  if (c->rope_type != KD_ROPE_DEFAULT) /* transformers 4's spelling of a scaled rule */
    write_rope(cJSON_AddObjectToObject(o, "rope_scaling"), c);
  if (c->pad_token_id >= 0)
    cJSON_AddNumberToObject(o, "pad_token_id", c->pad_token_id);
  else
    cJSON_AddNullToObject(o, "pad_token_id");
  if (gemma) {
    cJSON_AddNumberToObject(o, "query_pre_attn_scalar", c->query_pre_attn_scalar);
    if (c->final_logit_softcapping > 0)
      add_real(o, "final_logit_softcapping", c->final_logit_softcapping);
    else
      cJSON_AddNullToObject(o, "final_logit_softcapping");
    if (c->attn_logit_softcapping > 0)
      add_real(o, "attn_logit_softcapping", c->attn_logit_softcapping);
    else
      cJSON_AddNullToObject(o, "attn_logit_softcapping");
    cJSON_AddBoolToObject(o, "use_bidirectional_attention", 0);
    if (c->sliding_window > 0)
      cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window);
    else
      cJSON_AddNullToObject(o, "sliding_window");
  } else if (qwen || c->arch == KD_ARCH_QWEN3_MOE) {
    /* as transformers 5 writes them: the window null without the switch; qwen3_moe has it
     * in every layer with the switch (no max_window_layers) */
    const int on = c->use_sliding_window && c->sliding_window > 0;
    cJSON_AddBoolToObject(o, "use_sliding_window", on);
    if (on)
      cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window);
    else
      cJSON_AddNullToObject(o, "sliding_window");
    if (qwen) cJSON_AddNumberToObject(o, "max_window_layers", c->max_window_layers);
  } else if (window) {
    cJSON_AddNumberToObject(o, "sliding_window", window);
  } else if (a->window_size) {
    cJSON_AddNullToObject(o, "sliding_window");
  }
  if (qwen || gemma) { /* every layer's type */
    cJSON *lt = cJSON_AddArrayToObject(o, "layer_types");
    for (int l = 0; l < c->num_hidden_layers; l++)
      cJSON_AddItemToArray(
          lt,
          cJSON_CreateString(
              kd_layer_type_names[card_layer_window(c, l) > 0 ? KD_LAYER_SLIDING : KD_LAYER_FULL]));
  }
  if (a->bias_key) cJSON_AddBoolToObject(o, "attention_bias", c->attention_bias);
  if (a->arch == KD_ARCH_LLAMA) cJSON_AddBoolToObject(o, "mlp_bias", 0);
  if (card_traits(c)->moe) { /* the Hub's spelling of the expert count (transformers maps both) */
    const int mixtral = c->arch == KD_ARCH_MIXTRAL;
    cJSON_AddNumberToObject(o, mixtral ? "num_local_experts" : "num_experts", c->num_experts);
    cJSON_AddBoolToObject(o, "output_router_logits", 0);
    if (mixtral) {
      add_real(o, "router_jitter_noise", 0.0);
    } else {
      cJSON_AddNumberToObject(o, "moe_intermediate_size", c->moe_intermediate_size);
      cJSON_AddBoolToObject(o, "norm_topk_prob", c->norm_topk_prob);
      cJSON_AddNumberToObject(o, "decoder_sparse_step", c->decoder_sparse_step);
      cJSON *ml = cJSON_AddArrayToObject(o, "mlp_only_layers");
      for (int i = 0; i < c->n_mlp_only_layers; i++)
        cJSON_AddItemToArray(ml, cJSON_CreateNumber(c->mlp_only_layers[i]));
    }
  }
  if (card_traits(c)->nope_keys) { /* every layer's (no_rope_layer_interval: a plain key) */
    cJSON *nl = cJSON_AddArrayToObject(o, "no_rope_layers");
    for (int l = 0; l < c->num_hidden_layers; l++)
      cJSON_AddItemToArray(nl, cJSON_CreateNumber(card_layer_rope(c, l)));
  }
  cJSON_AddStringToObject(o, "torch_dtype", "float32");
  cJSON_AddStringToObject(o, "dtype", "float32");
  char *text = cJSON_Print(o);
  cJSON_Delete(o);
  return text;
}
