/* config.c: the run configuration. The key table of the input file and the card keys'
 * tables, made from card_keys.h (names, types, defaults, bounds; read and printed by
 * namelist.c; which keys a card holds), model card search, path resolution, cross-key checks
 * and the rank-0 load + broadcast. */
#include "config.h"
#include "namelist.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the key tables -------------------------------------------------------------------- */

#define CS(g, k, f, d, ch, fl) NAMELIST_KEY(kd_config, g, k, NL_STR, f, d, fl, 0, 0, ch)
#define CI(g, k, f, d, fl, lo, hi) NAMELIST_KEY(kd_config, g, k, NL_INT, f, d, fl, lo, hi, NULL)
#define CR(g, k, f, d, fl, lo, hi) NAMELIST_KEY(kd_config, g, k, NL_REAL, f, d, fl, lo, hi, NULL)
#define CW(g, k, f, d, words) NAMELIST_KEY(kd_config, g, k, NL_WORD, f, d, 0, 0, 0, words)
#define CB(g, k, f, d) NAMELIST_KEY(kd_config, g, k, NL_BOOL, f, d, 0, 0, 0, NULL)

/* Every input group and key (doc/interface.md), in printing order. */
static const struct namelist_key cfg_keys[] = {
    CW(run, mode, run_mode, "'distill'", KD_RUN_MODE_WORDS),
    CI(run, steps, run_steps, "100", NL_GE, 0, 0),
    CI(run, seed, run_seed, "1234", NL_GE, 0, 0),
    CW(run, device, run_device, "'auto'", KD_DEVICE_WORDS),
    CS(run, out_dir, run_out_dir, "'out'", NULL, NL_PATH),
    CS(teacher, card, teacher_card, "''", NULL, 0),
    CS(teacher, init, teacher_init, "''", NULL, NL_PATH),
    CW(teacher, source, teacher_source, "'live'", KD_TEACHER_SOURCE_WORDS),
    CS(teacher, cache, teacher_cache, "''", NULL, NL_PATH),
    CI(teacher, cache_k, teacher_cache_k, "32", NL_GE, 1, 0),
    CW(teacher, cache_select, teacher_cache_select, "'topk'", KD_CACHE_SELECT_WORDS),
    CB(teacher, cache_compress, teacher_cache_compress, ".true."),
    CS(student, card, student_card, "''", NULL, 0),
    CS(student, init, student_init, "'random'", "random", NL_PATH),
    CI(parallel, tp, par_tp, "1", NL_GE, 1, 0),
    CI(parallel, pp, par_pp, "1", NL_GE, 1, 0),
    CI(parallel, dp, par_dp, "0", NL_GE, 0, 0),
    CI(parallel, ep, par_ep, "1", NL_GE, 1, 0),
    CI(parallel, micro_batch, par_micro_batch, "1", NL_GE, 1, 0),
    CI(parallel, global_batch, par_global_batch, "8", NL_GE, 1, 0),
    CI(parallel, zero, par_zero, "0", NL_GE | NL_LE, 0, 1),
    NAMELIST_LIST(kd_config, data, train, NL_STR, data_train, data_ntrain, "''", NL_PATH, 0, 0,
                  NULL),
    NAMELIST_LIST(kd_config, data, weights, NL_REAL, data_weights, data_nweights, "1.0", NL_GT, 0,
                  0, NULL),
    CS(data, valid, data_valid, "''", NULL, NL_PATH),
    CW(data, format, data_format, "'auto'", KD_DATA_FORMAT_WORDS),
    CI(data, seq_len, data_seq_len, "256", NL_GE, 1, 0),
    CI(data, valid_every, data_valid_every, "0", NL_GE, 0, 0),
    CI(data, valid_batches, data_valid_batches, "8", NL_GE, 0, 0),
    CW(data, samples, data_samples, "'auto'", KD_SAMPLES_WORDS),
    CB(data, pack, data_pack, ".true."),
    CI(data, teacher_seq_len, data_teacher_seq_len, "0", NL_GE, 0, 0),
    CW(loss, kind, loss_kind, "'fkl'", KD_LOSS_KIND_WORDS),
    CR(loss, temperature, loss_temperature, "1.0", NL_GT, 0, 0),
    CR(loss, alpha, loss_alpha, "1.0", NL_GE | NL_LE, 0, 1),
    CR(loss, beta, loss_beta, "0.5", NL_GT | NL_LT, 0, 1),
    CB(loss, t2_scale, loss_t2_scale, ".true."),
    CR(loss, teacher_temperature, loss_teacher_temperature, "0.0", NL_GE, 0, 0),
    CR(loss, matched_weight, loss_matched_weight, "-1.0", NL_GE, -1, 0),
    CR(loss, unmatched_weight, loss_unmatched_weight, "-1.0", NL_GE, -1, 0),
    CR(loss, onpolicy, loss_onpolicy, "0.0", NL_GE | NL_LE, 0, 1),
    CI(loss, chunk_tokens, loss_chunk_tokens, "0", NL_GE, 0, 0),
    CR(loss, router_aux, loss_router_aux, "-1.0", NL_GE, -1, 0),
    CR(optim, lr, optim_lr, "3e-4", NL_GE, 0, 0),
    CR(optim, min_lr, optim_min_lr, "3e-5", NL_GE, 0, 0),
    CI(optim, warmup, optim_warmup, "10", NL_GE, 0, 0),
    CW(optim, decay, optim_decay, "'cosine'", KD_DECAY_WORDS),
    CR(optim, weight_decay, optim_weight_decay, "0.1", NL_GE, 0, 0),
    CR(optim, beta1, optim_beta1, "0.9", NL_GE | NL_LT, 0, 1),
    CR(optim, beta2, optim_beta2, "0.95", NL_GE | NL_LT, 0, 1),
    CR(optim, eps, optim_eps, "1e-8", NL_GT, 0, 0),
    CR(optim, clip, optim_clip, "1.0", NL_GE, 0, 0),
    CW(precision, compute, prec_compute, "'bf16'", KD_PRECISION_WORDS),
    CR(precision, loss_scale, prec_loss_scale, "1.0", NL_GE, 0, 0),
    CI(precision, max_skipped, prec_max_skipped, "10", NL_GE, 0, 0),
    CW(memory, recompute, mem_recompute, "'none'", KD_RECOMPUTE_WORDS),
    CI(memory, recompute_every, mem_recompute_every, "1", NL_GE, 1, 0),
    CB(memory, offload, mem_offload, ".false."),
    CB(memory, tiled_mlp, mem_tiled_mlp, ".false."),
    CI(memory, budget_mb, mem_budget_mb, "0", NL_GE, 0, 0),
    CS(checkpoint, dir, ckpt_dir, "''", NULL, NL_PATH),
    CI(checkpoint, every, ckpt_every, "0", NL_GE, 0, 0),
    CI(checkpoint, keep, ckpt_keep, "3", NL_GE, 0, 0),
    CS(checkpoint, resume, ckpt_resume, "'auto'", "auto|none", NL_PATH),
    CB(checkpoint, on_signal, ckpt_on_signal, ".true."),
    CI(log, every, log_every, "1", NL_GE, 1, 0),
    CS(log, metrics, log_metrics, "''", NULL, NL_PATH),
    CW(log, level, log_level, "'info'", KD_LOG_LEVEL_WORDS),
    CR(log, peak_tflops, log_peak_tflops, "0.0", NL_GE, 0, 0),
    CI(generate, max_new_tokens, gen_max_new_tokens, "64", NL_GE, 1, 0),
    CR(generate, temperature, gen_temperature, "1.0", NL_GE, 0, 0),
    CI(generate, top_k, gen_top_k, "0", NL_GE, 0, 0),
    CR(generate, top_p, gen_top_p, "1.0", NL_GT | NL_LE, 0, 1),
    CB(generate, save, gen_save, ".false."),
    NAMELIST_LIST(kd_config, generate, eos, NL_INT, gen_eos, gen_neos, "-2", NL_GE, -2, 0, NULL),
};

/* ---- the card keys (card_keys.h) ------------------------------------------------------- */

/* clang-format off */
/* A key's namelist bounds, (flags, lo, hi) in KD_CARD_KEYS, as three arguments. */
#define CARD_B(fl, lo, hi) fl, lo, hi
#define CARD_NL_(...) NAMELIST_KEY(__VA_ARGS__)
#define CARD_NLL_(...) NAMELIST_LIST(__VA_ARGS__)
/* A key's entry of the &model namelist table, by its type (the name is no &model key). */
#define CARD_NL(k, type, words, d, b, when, flags, pos) CARD_NL_##type(k, words, d, b)
#define CARD_NL_STR(k, words, d, b)
#define CARD_NL_INT(k, words, d, b)   CARD_NL_(kd_card, model, k, NL_INT, k, d, CARD_B b, NULL),
#define CARD_NL_REAL(k, words, d, b)  CARD_NL_(kd_card, model, k, NL_REAL, k, d, CARD_B b, NULL),
#define CARD_NL_BOOL(k, words, d, b)  CARD_NL_(kd_card, model, k, NL_BOOL, k, d, CARD_B b, NULL),
#define CARD_NL_WORD(k, words, d, b)                                                               \
  CARD_NL_(kd_card, model, k, NL_WORD, k, d, CARD_B b, KD_WORDS_OF(words)),
#define CARD_NL_WORDS(k, words, d, b)                                                              \
  CARD_NLL_(kd_card, model, k, NL_WORD, k, n_##k, d, CARD_B b, KD_WORDS_OF(words)),
#define CARD_NL_INTS(k, words, d, b)                                                               \
  CARD_NLL_(kd_card, model, k, NL_INT, k, n_##k, d, CARD_B b, NULL),

/* The &model group of a card: every key of KD_CARD_KEYS but the name, in its order (the
 * printing order). attention_bias, hidden_activation and norm_topk_prob have no table
 * default: they follow arch (card_read). */
static const struct namelist_key card_keys[] = {KD_CARD_KEYS(CARD_NL)};

/* A key's field by its type: a scalar, or a list (one element, and the count n_KEY); and a
 * word key's '|' list. */
#define CARD_SCALAR(k) .off = offsetof(struct kd_card, k), .size = sizeof(((struct kd_card *)0)->k)
#define CARD_LIST(k)                                                                               \
  .off = offsetof(struct kd_card, k), .size = sizeof(((struct kd_card *)0)->k[0]),                 \
  .count_off = offsetof(struct kd_card, n_##k)
#define CARD_FIELD_STR(k, w)   CARD_SCALAR(k)
#define CARD_FIELD_INT(k, w)   CARD_SCALAR(k)
#define CARD_FIELD_REAL(k, w)  CARD_SCALAR(k)
#define CARD_FIELD_BOOL(k, w)  CARD_SCALAR(k)
#define CARD_FIELD_WORD(k, w)  CARD_SCALAR(k), .words = KD_WORDS_OF(w)
#define CARD_FIELD_WORDS(k, w) CARD_LIST(k), .words = KD_WORDS_OF(w)
#define CARD_FIELD_INTS(k, w)  CARD_LIST(k)
#define CARD_DESC(k, t, w, d, b, wh, fl, p)                                                        \
  {.name = #k, .type = KD_CARD_##t, CARD_FIELD_##t(k, w), .nl_flags = CARD_B b,                    \
   .when = KD_WHEN_##wh, .flags = fl, .pos = p},
const struct kd_card_key kd_card_keys[KD_CARD_NKEYS] = {KD_CARD_KEYS(CARD_DESC)};

/* Position pos holds its key's index: a position given twice is a compiler warning
 * (-Woverride-init, an error with configure --enable-werror), one past the end an error, so
 * the positions are the numbers 0 to KD_CARD_NKEYS - 1, each once (test_config checks it
 * too). */
#define CARD_POS(k, type, words, d, b, when, flags, pos) [pos] = KD_CARD_KEY_##k,
const unsigned char kd_card_file_order[KD_CARD_NKEYS] = {KD_CARD_KEYS(CARD_POS)};
/* clang-format on */

const struct kd_card_key *card_key_named(const char *name) {
  for (size_t i = 0; i < KD_CARD_NKEYS; i++)
    if (!strcmp(kd_card_keys[i].name, name)) return &kd_card_keys[i];
  return NULL;
}

#define NKEYS(t) (sizeof(t) / sizeof((t)[0]))
_Static_assert(NKEYS(cfg_keys) <= NAMELIST_MAXKEYS, "raise NAMELIST_MAXKEYS");
_Static_assert(NKEYS(card_keys) <= NAMELIST_MAXKEYS, "raise NAMELIST_MAXKEYS");
_Static_assert(KD_PATH_MAX <= NAMELIST_STR_MAX, "the namelist reader takes shorter strings");

void config_defaults(struct kd_config *cfg) {
  namelist_defaults(cfg_keys, NKEYS(cfg_keys), cfg, sizeof *cfg);
}

/* ---- paths and model cards ----------------------------------------------------------------- */

/* Directory part of `path` ("." if none). */
static void dir_of(char *out, size_t len, const char *path) {
  const char *sl = path ? strrchr(path, '/') : NULL;
  if (!sl)
    snprintf(out, len, ".");
  else
    snprintf(out, len, "%.*s", sl == path ? 1 : (int)(sl - path), path);
}

/* Absolute form of a path taken relative to the current directory; 0 if too long. */
static int absolute(char *out, size_t len, const char *p) {
  char cwd[KD_PATH_MAX], tmp[2 * KD_PATH_MAX + 2];
  if (p[0] == '/')
    snprintf(tmp, sizeof tmp, "%s", p);
  else {
    if (!getcwd(cwd, sizeof cwd)) return 0;
    while (p[0] == '.' && p[1] == '/')
      p += 2;
    if (!strcmp(p, ".") || !p[0])
      snprintf(tmp, sizeof tmp, "%s", cwd);
    else
      snprintf(tmp, sizeof tmp, "%s/%s", cwd, p);
  }
  if (strlen(tmp) >= len) return 0;
  strcpy(out, tmp);
  return 1;
}

#define NDIRS 24
/* Directories searched for a card given by name, in order (doc/input.md). */
static size_t card_dirs(char dirs[NDIRS][KD_PATH_MAX], const char *relative_to) {
  size_t n = 0;
  char d[KD_PATH_MAX];
  const char *env = getenv("KDTRAIN_MOD_PATH");
  while (env && *env && n < NDIRS - 6) {
    size_t l = strcspn(env, ":");
    if (l && l < KD_PATH_MAX) snprintf(dirs[n++], KD_PATH_MAX, "%.*s", (int)l, env);
    env += l + (env[l] == ':');
  }
  dir_of(d, sizeof d, relative_to);
  snprintf(dirs[n++], KD_PATH_MAX, "%s", d);
  snprintf(dirs[n++], KD_PATH_MAX, "%.*s/../mod", KD_PATH_MAX - 8, d);
  snprintf(dirs[n++], KD_PATH_MAX, "%.*s/mod", KD_PATH_MAX - 8, d);
  snprintf(dirs[n++], KD_PATH_MAX, "mod");
#ifdef KD_SRC_MODDIR
  snprintf(dirs[n++], KD_PATH_MAX, "%s", KD_SRC_MODDIR);
#endif
#ifdef KD_MODDIR
  snprintf(dirs[n++], KD_PATH_MAX, "%s", KD_MODDIR);
#endif
  return n;
}

/* Find the file of card `name`; 0 and its absolute path, or 1 and why in msg. */
static int card_find(char *path, size_t plen, const char *name, const char *relative_to, char *msg,
                     size_t mlen) {
  char dirs[NDIRS][KD_PATH_MAX], cand[2 * KD_PATH_MAX + 8], names[4096] = "", more[300] = "";
  size_t l = strlen(name), n = 0;
  if (!l) return snprintf(msg, mlen, "empty card name; expected a name in mod/ or a path"), 1;
  if (strchr(name, '/') || (l > 4 && !strcmp(name + l - 4, ".nml"))) {
    if (kd_is_file(name)) return absolute(path, plen, name) ? 0 : 1;
    struct stat st;
    if (stat(name, &st) == 0) /* a FIFO would block the read, a device never end */
      return snprintf(msg, mlen,
                      "model card file '%s' is not a regular file (%s); expected a "
                      "file",
                      name, kd_file_kind(st.st_mode)),
             1;
    dir_of(cand, sizeof cand, relative_to);
    if (name[0] != '/') {
      snprintf(cand + strlen(cand), sizeof cand - strlen(cand), "/%s", name);
      if (kd_is_file(cand)) return absolute(path, plen, cand) ? 0 : 1;
    }
    return snprintf(msg, mlen,
                    "model card file '%s' not found; looked in the current directory "
                    "and in '%s'",
                    name, cand),
           1;
  }
  size_t nd = card_dirs(dirs, relative_to);
  for (size_t i = 0; i < nd; i++) {
    snprintf(cand, sizeof cand, "%.*s/%.*s.nml", KD_PATH_MAX - 1, dirs[i], KD_PATH_MAX - 1, name);
    if (kd_is_file(cand)) return absolute(path, plen, cand) ? 0 : 1;
  }
  for (size_t i = 0; i < nd; i++) { /* the cards that do exist, for "did you mean" */
    DIR *d = opendir(dirs[i]);
    struct dirent *e;
    while (d && (e = readdir(d))) {
      size_t el = strlen(e->d_name);
      if (el > 4 && !strcmp(e->d_name + el - 4, ".nml") && n + el < sizeof names)
        n += snprintf(names + n, sizeof names - n, "%s%.*s", n ? "|" : "", (int)el - 4, e->d_name);
    }
    if (d) closedir(d);
  }
  namelist_suggest(more, sizeof more, name, names, "");
  n = snprintf(msg, mlen, "model card '%s' not found%s; looked for %s.nml in", name, more, name);
  for (size_t i = 0; i < nd && n < mlen; i++)
    n += snprintf(msg + n, mlen - n, "%s '%s'", i ? "," : "", dirs[i]);
  return 1;
}

/* The card defaults (card_defaults), made once: what a KD_WHEN_NOT_DEFAULT key is compared
 * with. */
static const struct kd_card *card_dflt(void) {
  static struct kd_card d;
  static int made;
  if (!made) card_defaults(&d), made = 1;
  return &d;
}

int card_key_family(const struct kd_card_key *k, const struct kd_card *card) {
  const struct kd_arch_traits *t = card_traits(card);
  switch (k->when) {
  case KD_WHEN_ATTN_KEYS:
    return t->attn_keys != 0;
  case KD_WHEN_MOE:
    return t->moe != KD_MOE_NONE;
  case KD_WHEN_NOPE_KEYS:
    return t->nope_keys != 0;
  default:
    return 1;
  }
}

int card_key_present(const struct kd_card_key *k, const struct kd_card *card) {
  const char *field = (const char *)card + k->off;
  if (!card_key_family(k, card)) return 0;
  if (k->count_off && *(const int *)((const char *)card + k->count_off) == 0) return 0;
  if (k->when == KD_WHEN_ROPE_SCALED) return card->rope_type != KD_ROPE_DEFAULT;
  if (k->when == KD_WHEN_NOT_DEFAULT && !k->count_off) /* a list's default: no values */
    return memcmp(field, (const char *)card_dflt() + k->off, k->size) != 0;
  return 1;
}

/* The archs whose cards may give a key of rule `when` (KD_WHEN_MOE, KD_WHEN_NOPE_KEYS) as
 * "'a', 'b'" into buf ("none yet" when no family has them), for messages; returns buf. */
static const char *card_key_archs(enum kd_card_when when, char *buf, size_t len) {
  size_t n = 0;
  buf[0] = 0;
  for (int a = 0; a < KD_ARCH_N && n < len; a++)
    if (when == KD_WHEN_MOE ? kd_arch_traits[a].moe != KD_MOE_NONE : kd_arch_traits[a].nope_keys)
      n += (size_t)snprintf(buf + n, len - n, "%s'%s'", n ? ", " : "", kd_arch_names[a]);
  if (!buf[0]) snprintf(buf, len, "none yet");
  return buf;
}

/* Parse and check the card file `path` (its messages name the card file and line). */
static int card_read(struct kd_card *card, const char *path, const char *name, char *err,
                     size_t errlen) {
  struct namelist_ctx c = {.keys = card_keys,
                           .n = NKEYS(card_keys),
                           .base = card,
                           .file = path,
                           .err = err,
                           .errlen = errlen};
  namelist_defaults(card_keys, NKEYS(card_keys), card, sizeof *card);
  if (strlen(name) >= sizeof card->name || strlen(path) >= sizeof card->path)
    return namelist_err(&c, 0, NULL, NULL, "card name or path too long");
  strcpy(card->name, name);
  strcpy(card->path, path);
  int rc = namelist_read_file(&c, path);
  if (rc) return rc;
  if (!c.gline[0]) return namelist_err(&c, 0, NULL, NULL, "no &model group; expected a model card");
  for (size_t i = 0; i < c.n; i++)
    if ((card_keys[i].flags & NL_REQ) && !c.line[i])
      return namelist_key_err(&c, i, -1, "missing; a model card must give %s (%s)",
                              card_keys[i].key, namelist_type_words(card_keys[i].type));
  size_t ab = (size_t)namelist_find_key(&c, "model", "attention_bias");
  if (!c.line[ab]) card->attention_bias = card_traits(card)->attention_bias;
  size_t ha = (size_t)namelist_find_key(&c, "model", "hidden_activation");
  if (!c.line[ha]) card->hidden_activation = card_traits(card)->act;
  size_t nt = (size_t)namelist_find_key(&c, "model", "norm_topk_prob");
  if (!c.line[nt]) card->norm_topk_prob = card_traits(card)->norm_topk_prob;
  /* the keys of an expert or NoPE family must not be given on another family's card
   * (Gemma's keys are read on any card, and checked or unused there) */
  char archs[256];
  for (size_t i = 0; i < c.n; i++) {
    const struct kd_card_key *k = card_key_named(card_keys[i].key);
    const int moe = k->when == KD_WHEN_MOE;
    if (c.line[i] && (moe || k->when == KD_WHEN_NOPE_KEYS) && !card_key_family(k, card))
      return namelist_key_err(&c, i, -1,
                              "a %s on a '%s' card; expected it on the cards of %s only "
                              "(arch %s)",
                              moe ? "mixture-of-experts key" : "NoPE key (layers without RoPE)",
                              kd_arch_names[card->arch],
                              moe ? "a mixture of experts" : "a family with layers without RoPE",
                              card_key_archs(k->when, archs, sizeof archs));
  }
  size_t sw = (size_t)namelist_find_key(&c, "model", "sliding_window");
  if (c.line[sw] && card->sliding_window < 1)
    return namelist_key_err(&c, sw, -1,
                            "%d is not a window; expected at least 1 token (leave the key out "
                            "for full attention)",
                            card->sliding_window);
  char why[512];
  const char *key = card_check(card, why, sizeof why);
  if (key) return namelist_key_err(&c, (size_t)namelist_find_key(&c, "model", key), -1, "%s", why);
  return 0;
}

/* The RoPE scaling keys of a card (rope.c computes them): the key at fault, or NULL. */
static const char *card_check_rope(const struct kd_card *card, char *why, size_t whylen) {
  if (card->rope_type == KD_ROPE_DYNAMIC || card->rope_type == KD_ROPE_LONGROPE) {
    snprintf(why, whylen,
             "'%s' is not computed by kdtrain (its frequencies change with the sequence "
             "length); expected 'default', 'linear', 'llama3' or 'yarn'",
             kd_rope_type_names[card->rope_type]);
    return "rope_type";
  }
  if (card->rope_type == KD_ROPE_LLAMA3 && card->high_freq_factor <= card->low_freq_factor) {
    snprintf(why, whylen, "%g is not above low_freq_factor = %g; expected high > low",
             card->high_freq_factor, card->low_freq_factor);
    return "high_freq_factor";
  }
  return NULL;
}

/* Whether the card's family switches its window with use_sliding_window (and places it
 * with max_window_layers): qwen2, qwen3. */
static int card_window_switched(const struct kd_card *c) {
  return card_traits(c)->window != KD_WINDOW_EVERY_LAYER;
}

int card_layer_window(const struct kd_card *c, int layer) {
  const int qwen = card_window_switched(c);
  const int w = qwen && !c->use_sliding_window ? 0 : c->sliding_window;
  if (w <= 0 || layer < 0 || layer >= c->num_hidden_layers) return 0;
  const struct kd_arch_traits *t = card_traits(c);
  if (t->window == KD_WINDOW_SWITCHED_ALL) return w; /* Qwen3MoeConfig: no max_window_layers */
  if (t->window_period && c->n_layer_types == 0)     /* Gemma3TextConfig's sliding_window_pattern */
    return (layer + 1) % t->window_period ? w : 0;
  if (c->n_layer_types > 0)
    return layer < c->n_layer_types && c->layer_types[layer] == KD_LAYER_SLIDING ? w : 0;
  return !qwen || layer >= c->max_window_layers ? w : 0;
}

/* The sliding-window keys of a card together: the key at fault, or NULL. */
static const char *card_check_window(const struct kd_card *card, char *why, size_t whylen) {
  const int qwen = card_window_switched(card);
  if (card->n_layer_types && card->n_layer_types != card->num_hidden_layers) {
    snprintf(why, whylen, "%d values for num_hidden_layers = %d; expected one per layer",
             card->n_layer_types, card->num_hidden_layers);
    return "layer_types";
  }
  if (card->use_sliding_window && !qwen) {
    snprintf(why, whylen,
             ".true. on a '%s' card; expected it on qwen2 and qwen3 cards only (a llama / "
             "Mistral card's sliding_window alone sets the window)",
             kd_arch_names[card->arch]);
    return "use_sliding_window";
  }
  if (card->use_sliding_window && card->sliding_window < 1) {
    snprintf(why, whylen, ".true. without a window; expected sliding_window >= 1 with it");
    return "use_sliding_window";
  }
  for (int l = 0; l < card->n_layer_types; l++)
    if (card->layer_types[l] == KD_LAYER_SLIDING && !card_layer_window(card, l)) {
      snprintf(why, whylen,
               "layer %d is 'sliding_attention' but the card has no window; expected "
               "sliding_window >= 1%s",
               l, qwen ? " and use_sliding_window = .true." : "");
      return "layer_types";
    }
  return NULL;
}

int card_layer_sparse(const struct kd_card *c, int layer) {
  if (!card_traits(c)->moe || c->num_experts <= 0 || layer < 0 || layer >= c->num_hidden_layers)
    return 0;
  for (int i = 0; i < c->n_mlp_only_layers; i++)
    if (c->mlp_only_layers[i] == layer) return 0;
  return (layer + 1) % (c->decoder_sparse_step > 0 ? c->decoder_sparse_step : 1) == 0;
}

int card_sparse_layers(const struct kd_card *c) {
  int n = 0;
  for (int l = 0; l < c->num_hidden_layers; l++)
    n += card_layer_sparse(c, l);
  return n;
}

int card_nope_rule(const struct kd_card *c, int layer) {
  if (layer < 0 || layer >= c->num_hidden_layers) return 1;
  if (c->n_no_rope_layers > 0)
    return layer < c->n_no_rope_layers ? c->no_rope_layers[layer] != 0 : 1;
  const int every = c->no_rope_layer_interval > 0 ? c->no_rope_layer_interval : 1;
  return (layer + 1) % every != 0;
}

int card_layer_rope(const struct kd_card *c, int layer) {
  return card_traits(c)->nope_keys ? card_nope_rule(c, layer) : 1;
}

/* The mixture-of-experts keys of a card together: the key at fault, or NULL. */
static const char *card_check_moe(const struct kd_card *c, char *why, size_t whylen) {
  if (!card_traits(c)->moe) return NULL;
  const int every = card_traits(c)->moe == KD_MOE_EVERY_LAYER;
  const char *arch = kd_arch_names[c->arch];
  if (c->num_experts > 0 && c->num_experts_per_tok > c->num_experts) {
    snprintf(why, whylen, "%d experts per token of %d; expected at most num_experts",
             c->num_experts_per_tok, c->num_experts);
    return "num_experts_per_tok";
  }
  if (every && c->moe_intermediate_size) {
    snprintf(why, whylen,
             "%d on a %s card; expected it left out (its experts take intermediate_size)",
             c->moe_intermediate_size, arch);
    return "moe_intermediate_size";
  }
  if (!every && card_sparse_layers(c) > 0 && c->moe_intermediate_size < 1) {
    snprintf(why, whylen,
             "missing or 0; a %s card with experts must give an expert's "
             "intermediate size (at least 1)",
             arch);
    return "moe_intermediate_size";
  }
  if (every && !c->norm_topk_prob) {
    snprintf(why, whylen,
             ".false. on a %s card; expected .true. (it always renormalises its top-k "
             "probabilities)",
             arch);
    return "norm_topk_prob";
  }
  if (every && (c->decoder_sparse_step != 1 || c->n_mlp_only_layers)) {
    snprintf(why, whylen, "given on a %s card; expected every layer sparse", arch);
    return c->n_mlp_only_layers ? "mlp_only_layers" : "decoder_sparse_step";
  }
  if (every && c->attention_bias) {
    snprintf(why, whylen, ".true. on a %s card; expected .false. (its attention has no biases)",
             arch);
    return "attention_bias";
  }
  for (int i = 0; i < c->n_mlp_only_layers; i++)
    if (c->mlp_only_layers[i] >= c->num_hidden_layers) {
      snprintf(why, whylen, "layer %d of %d; expected layer indices from 0", c->mlp_only_layers[i],
               c->num_hidden_layers);
      return "mlp_only_layers";
    }
  return NULL;
}

void card_defaults(struct kd_card *card) {
  namelist_defaults(card_keys, NKEYS(card_keys), card, sizeof *card);
}

const char *card_check(const struct kd_card *card, char *why, size_t whylen) {
  long i = namelist_check_values(card_keys, NKEYS(card_keys), card, why, whylen);
  if (i >= 0) return card_keys[i].key;
  if (card->pad_token_id >= card->vocab_size) {
    snprintf(why, whylen, "%d is not an id of the %d-id vocabulary; expected -1 (none) or an id",
             card->pad_token_id, card->vocab_size);
    return "pad_token_id";
  }
  if (card->num_attention_heads % card->num_key_value_heads) {
    snprintf(why, whylen,
             "num_attention_heads = %d is not divisible by %d; expected a divisor of "
             "num_attention_heads",
             card->num_attention_heads, card->num_key_value_heads);
    return "num_key_value_heads";
  }
  if (card->head_dim == 0 && card->hidden_size % card->num_attention_heads) {
    snprintf(why, whylen,
             "%d is not divisible by num_attention_heads = %d; expected a multiple of the head "
             "count (or give head_dim)",
             card->hidden_size, card->num_attention_heads);
    return "hidden_size";
  }
  if (card_head_dim(card) % 2) {
    snprintf(why, whylen,
             "head dimension %s = %d is odd; expected an even head dimension (rotary "
             "embeddings)",
             card->head_dim ? "head_dim" : "hidden_size / num_attention_heads",
             card_head_dim(card));
    return card->head_dim ? "head_dim" : "hidden_size";
  }
  const enum kd_act act = card_traits(card)->act;
  if (card->hidden_activation != act) {
    snprintf(why, whylen, "'%s' is not computed for arch '%s'; expected '%s'",
             kd_act_names[card->hidden_activation], kd_arch_names[card->arch], kd_act_names[act]);
    return "hidden_activation";
  }
  const char *key = card_check_window(card, why, whylen);
  if (!key) key = card_check_moe(card, why, whylen);
  if (!key && card->n_no_rope_layers && card->n_no_rope_layers != card->num_hidden_layers) {
    snprintf(why, whylen, "%d values for num_hidden_layers = %d; expected one per layer",
             card->n_no_rope_layers, card->num_hidden_layers);
    key = "no_rope_layers";
  }
  return key ? key : card_check_rope(card, why, whylen);
}

int config_load_card(struct kd_card *card, const char *name, const char *relative_to, char *err,
                     size_t errlen) {
  char path[KD_PATH_MAX];
  err[0] = 0;
  if (card_find(path, sizeof path, name, relative_to, err, errlen)) return KD_EXIT_INPUT;
  return card_read(card, path, name, err, errlen);
}

/* ---- resolution and cross-checks ------------------------------------------------------------- */

static size_t key_index(const struct namelist_ctx *c, const char *g, const char *k) {
  long i = namelist_find_key(c, g, k);
  KD_CHECK(i >= 0, "no key &%s %s in the table", g, k);
  return (size_t)i;
}
#define FIELD(c, i) ((char *)(c)->base + (c)->keys[i].off)

/* Is w one of the words of the '|' list? */
static int word_in(const char *list, const char *w) {
  for (const char *p = list; *p;) {
    size_t l = strcspn(p, "|");
    if (strlen(w) == l && !strncmp(p, w, l)) return 1;
    p += l + (p[l] == '|');
  }
  return 0;
}

/* Make every path absolute (cwd-relative) and fill the paths derived from out_dir. */
static int resolve_paths(struct namelist_ctx *c, struct kd_config *cfg) {
  if (!cfg->run_out_dir[0])
    return namelist_key_err(c, key_index(c, "run", "out_dir"), -1,
                            "empty; expected a directory path for the run's output");
  for (size_t i = 0; i < c->n; i++) {
    const struct namelist_key *k = &c->keys[i];
    for (size_t e = 0; e < namelist_count(k, c->base); e++) {
      char *f = namelist_field(k, c->base, e);
      if (!(k->flags & NL_PATH) || !f[0]) continue;
      if (k->choices && word_in(k->choices, f)) continue; /* 'random', 'auto', 'none' */
      if (!absolute(f, k->size, f))
        return namelist_key_err(c, i, -1,
                                "'%s' is too long as an absolute path; expected at most %zu "
                                "characters",
                                f, k->size - 1);
    }
  }
  if (!cfg->ckpt_dir[0] && snprintf(cfg->ckpt_dir, sizeof cfg->ckpt_dir, "%s/checkpoints",
                                    cfg->run_out_dir) >= (int)sizeof cfg->ckpt_dir)
    return namelist_key_err(c, key_index(c, "run", "out_dir"), -1, "path too long");
  if (!cfg->log_metrics[0] && snprintf(cfg->log_metrics, sizeof cfg->log_metrics, "%s/metrics.csv",
                                       cfg->run_out_dir) >= (int)sizeof cfg->log_metrics)
    return namelist_key_err(c, key_index(c, "run", "out_dir"), -1, "path too long");
  return 0;
}

/* Key i (element e of a list) names a file (or, with dir_ok, a directory) that must exist. */
static int check_exists_at(struct namelist_ctx *c, size_t i, size_t e, const char *what,
                           int dir_ok) {
  struct stat st;
  const char *p = namelist_field(&c->keys[i], c->base, e);
  if (stat(p, &st) != 0)
    return namelist_key_err(c, i, -1,
                            "%s '%s' not found (%s); expected an existing file (relative paths "
                            "are taken from the current directory)",
                            what, p, strerror(errno));
  /* a FIFO would block the open, a device never end: only regular files (and, with
   * dir_ok, directories) are taken */
  if (!S_ISREG(st.st_mode) && !(dir_ok && S_ISDIR(st.st_mode)))
    return namelist_key_err(c, i, -1, "%s '%s' is not a regular file (%s); expected a %s", what, p,
                            kd_file_kind(st.st_mode), dir_ok ? "file or a directory" : "file");
  if (access(p, R_OK) != 0)
    return namelist_key_err(c, i, -1, "%s '%s' is not readable; expected a readable file", what, p);
  return 0;
}

static int check_exists(struct namelist_ctx *c, size_t i, const char *what, int dir_ok) {
  return check_exists_at(c, i, 0, what, dir_ok);
}

/* Element e of data key i names a token file; a Megatron dataset may be given by its
 * prefix (PREFIX.bin must then exist). */
static int check_data_path(struct namelist_ctx *c, size_t i, size_t e) {
  const struct kd_config *cfg = c->base;
  const char *p = namelist_field(&c->keys[i], c->base, e);
  char bin[KD_PATH_MAX + 8];
  snprintf(bin, sizeof bin, "%s.bin", p);
  if ((cfg->data_format == KD_DATA_MEGATRON || cfg->data_format == KD_DATA_AUTO) &&
      !kd_is_file(p) && kd_is_file(bin))
    return 0;
  return check_exists_at(c, i, e, "data file", 0);
}

/* The blend: at most one weight per train path, missing weights mean equal weights. */
static int check_blend(struct namelist_ctx *c, struct kd_config *cfg) {
  size_t wk = key_index(c, "data", "weights"), train = key_index(c, "data", "train");
  if (cfg->data_ntrain == 1 && !cfg->data_train[0][0]) cfg->data_ntrain = 0; /* train = '' */
  for (int e = 0; e < cfg->data_ntrain; e++)
    if (!cfg->data_train[e][0])
      return namelist_key_err(c, train, -1, "value %d is empty; expected a file path", e + 1);
  const int given = c->line[wk] || c->setby[wk];
  if (!given) {
    cfg->data_nweights = cfg->data_ntrain > 1 ? cfg->data_ntrain : 1;
    for (int e = 0; e < cfg->data_nweights; e++)
      cfg->data_weights[e] = 1.0;
  } else if (cfg->data_ntrain > 0 && cfg->data_nweights != cfg->data_ntrain) {
    return namelist_key_err(c, wk, (long)train,
                            "%d weights for %d train files; expected one weight per train file",
                            cfg->data_nweights, cfg->data_ntrain);
  }
  return 0;
}

static int without_files; /* --dry-run --without-files */

int config_without_files(int on) {
  if (on >= 0) without_files = on;
  return without_files;
}

/* Every file the input names exists and is readable (not with --without-files). */
static int check_files(struct namelist_ctx *c, const struct kd_config *cfg) {
  const size_t train = key_index(c, "data", "train"), valid = key_index(c, "data", "valid");
  const int live = cfg->run_mode == KD_MODE_CACHE || config_teacher_live(cfg);
  int rc = 0;
  for (int e = 0; e < cfg->data_ntrain && !rc; e++)
    rc = check_data_path(c, train, (size_t)e);
  if (!rc && cfg->data_valid[0]) rc = check_data_path(c, valid, 0);
  if (!rc && live && cfg->teacher_init[0])
    rc = check_exists(c, key_index(c, "teacher", "init"), "weights file", 0);
  if (!rc && config_teacher_cached(cfg) && cfg->run_mode == KD_MODE_DISTILL)
    rc = check_exists(c, key_index(c, "teacher", "cache"), "teacher cache", 0);
  if (!rc && !config_student_random(cfg))
    rc = check_exists(c, key_index(c, "student", "init"), "weights file", 0);
  if (!rc && config_resume(cfg) == KD_RESUME_PATH)
    rc = check_exists(c, key_index(c, "checkpoint", "resume"), "checkpoint", 1);
  return rc;
}

/* On-policy distillation (loss%onpolicy > 0, doc/user-guide.md, "On-policy distillation"): a live
 * teacher scores the student's continuations, in mode 'distill'. */
static int check_onpolicy(struct namelist_ctx *c, const struct kd_config *cfg) {
  if (cfg->loss_onpolicy <= 0) return 0;
  const size_t op = key_index(c, "loss", "onpolicy");
  if (cfg->run_mode != KD_MODE_DISTILL)
    return namelist_key_err(c, op, (long)key_index(c, "run", "mode"),
                            "%g with mode '%s': the student's continuations are scored by a "
                            "teacher; expected 0, or mode 'distill'",
                            cfg->loss_onpolicy, kd_run_mode_names[cfg->run_mode]);
  if (cfg->teacher_source == KD_TEACHER_CACHE)
    return namelist_key_err(c, key_index(c, "teacher", "source"), (long)op,
                            "'cache' with loss%%onpolicy = %g: the teacher cache holds the "
                            "teacher's distribution over the data's own text and cannot score "
                            "text the student writes; expected 'live' (or loss%%onpolicy = 0)",
                            cfg->loss_onpolicy);
  if (cfg->par_ep > 1)
    return namelist_key_err(c, key_index(c, "parallel", "ep"), (long)op,
                            "%d with loss%%onpolicy = %g: generation with experts split over "
                            "ranks is not computed yet (the ranks of an ep group would have to "
                            "decode in lockstep); expected ep = 1",
                            cfg->par_ep, cfg->loss_onpolicy);
  return 0;
}

/* The cross-tokenizer loss (loss%kind = 'uld', doc/user-guide.md, "Teacher and student with
 * different tokenizers"): a live teacher in mode 'distill'; the hybrid's two weights together. */
static int check_uld(struct namelist_ctx *c, const struct kd_config *cfg) {
  const size_t kind = key_index(c, "loss", "kind"), mw = key_index(c, "loss", "matched_weight");
  const size_t uw = key_index(c, "loss", "unmatched_weight");
  if (cfg->loss_kind != LOSS_ULD) return 0;
  if (cfg->run_mode != KD_MODE_DISTILL)
    return namelist_key_err(c, kind, (long)key_index(c, "run", "mode"),
                            "'uld' with mode '%s': a cross-tokenizer loss needs a teacher; "
                            "expected mode 'distill', or another loss%%kind",
                            kd_run_mode_names[cfg->run_mode]);
  if (cfg->teacher_source == KD_TEACHER_CACHE)
    return namelist_key_err(c, key_index(c, "teacher", "source"), (long)kind,
                            "'cache' with loss%%kind = 'uld': ULD compares the teacher's whole "
                            "sorted distribution, and the cache keeps %d entries of it per row "
                            "(the rest is unknown, so the sorted distance cannot be computed); "
                            "expected 'live'",
                            cfg->teacher_cache_k);
  if ((cfg->loss_matched_weight < 0) != (cfg->loss_unmatched_weight < 0))
    return namelist_key_err(c, cfg->loss_matched_weight < 0 ? mw : uw,
                            (long)(cfg->loss_matched_weight < 0 ? uw : mw),
                            "missing: the hybrid loss needs both matched_weight and "
                            "unmatched_weight (or neither: plain ULD)");
  return 0;
}

static int check_config(struct namelist_ctx *c, struct kd_config *cfg) {
  size_t mode = key_index(c, "run", "mode"), tcard = key_index(c, "teacher", "card");
  size_t scard = key_index(c, "student", "card"), train = key_index(c, "data", "train");
  size_t valid = key_index(c, "data", "valid");
  int distill = cfg->run_mode == KD_MODE_DISTILL, eval = cfg->run_mode == KD_MODE_EVAL;
  int cache = cfg->run_mode == KD_MODE_CACHE, cached = cfg->teacher_source == KD_TEACHER_CACHE;
  size_t tcache = key_index(c, "teacher", "cache");
  if (cache && !cfg->teacher_init[0])
    return namelist_key_err(c, key_index(c, "teacher", "init"), (long)mode,
                            "missing: mode 'cache' runs the teacher; expected &teacher init "
                            "(a weights file)");
  if ((cache || (distill && cached)) && !cfg->teacher_cache[0])
    return namelist_key_err(c, tcache, (long)(cache ? mode : key_index(c, "teacher", "source")),
                            "missing; expected the path of the teacher cache file");
  if (distill && cached && config_check_cache_loss(cfg, c->err, c->errlen)) return KD_EXIT_INPUT;
  if (check_onpolicy(c, cfg) || check_uld(c, cfg)) return KD_EXIT_INPUT;
  if (distill && cached) distill = 0; /* no teacher model */
  if (distill && !cfg->teacher_card[0] && !cfg->teacher_init[0])
    return namelist_key_err(c, tcard, (long)mode,
                            "missing: mode 'distill' needs a teacher; expected "
                            "&teacher card (a model card) and/or init (a weights file)");
  if (!cfg->student_card[0])
    return namelist_key_err(c, scard, (long)mode,
                            "missing; expected the student model card (a name in "
                            "mod/ or a path)");
  int rc = check_blend(c, cfg);
  if (rc) return rc;
  if (!eval && !cfg->data_ntrain)
    return namelist_key_err(c, train, (long)mode,
                            "missing; mode '%s' needs training data, expected a "
                            "file path",
                            kd_run_mode_names[cfg->run_mode]);
  if (eval && !cfg->data_valid[0])
    return namelist_key_err(c, valid, (long)mode,
                            "missing; mode 'eval' needs validation data, expected "
                            "a file path");
  if (!rc && !without_files) rc = check_files(c, cfg);
  if (rc) return rc;
  if (config_check_batch(cfg, cfg->par_dp, c->err, c->errlen)) return KD_EXIT_INPUT;
  size_t mk = key_index(c, "log", "metrics");
  if (c->line[mk] || c->setby[mk]) { /* out_dir's own metrics.csv: created with out_dir */
    char d[KD_PATH_MAX];
    struct stat st;
    dir_of(d, sizeof d, cfg->log_metrics);
    if (strcmp(d, cfg->run_out_dir) != 0 && (stat(d, &st) != 0 || !S_ISDIR(st.st_mode)))
      return namelist_key_err(c, mk, -1,
                              "the directory '%s' of '%s' does not exist; expected "
                              "an existing directory (kdtrain creates only run%%out_dir)",
                              d, cfg->log_metrics);
  }
  if (cfg->optim_min_lr > cfg->optim_lr)
    return namelist_key_err(c, key_index(c, "optim", "min_lr"), (long)key_index(c, "optim", "lr"),
                            "%g is larger than lr = %g; expected min_lr <= lr", cfg->optim_min_lr,
                            cfg->optim_lr);
  return 0;
}

/* Resolve the card named by key ki into `card` and check seq_len against it. */
static int resolve_card(struct namelist_ctx *c, struct kd_card *card, size_t ki) {
  char path[KD_PATH_MAX], msg[3072];
  const char *name = FIELD(c, ki), *who = c->keys[ki].group;
  if (card_find(path, sizeof path, name, c->file, msg, sizeof msg))
    return namelist_key_err(c, ki, -1, "%s", msg);
  if (card_read(card, path, name, c->err, c->errlen)) {
    size_t n = strlen(c->err);
    if (c->line[ki])
      snprintf(c->err + n, c->errlen - n, " (the %s card, named at %s:%d)", who, c->file,
               c->line[ki]);
    else
      snprintf(c->err + n, c->errlen - n, " (the %s card, named on the command line)", who);
    return KD_EXIT_INPUT;
  }
  const struct kd_config *cfg = c->base;
  if (cfg->data_seq_len > card->max_position_embeddings)
    return namelist_key_err(
        c, key_index(c, "data", "seq_len"), -1,
        "%d is longer than "
        "max_position_embeddings = %d of the %s card '%s'; expected seq_len <= %d",
        cfg->data_seq_len, card->max_position_embeddings, who, name, card->max_position_embeddings);
  return 0;
}

/* Where each key of the last config_load was set (config_where): its line in the file,
 * else its &group's line, else 0; the command-line word that set it, if one did. */
static int where_line[NAMELIST_MAXKEYS];
static char where_word[NAMELIST_MAXKEYS][64];
static int where_set[NAMELIST_MAXKEYS]; /* set by the file or the command line, not a default */

double config_router_aux(const struct kd_config *cfg, const struct kd_card *student) {
  if (card_sparse_layers(student) == 0) return 0.0;
  return cfg->loss_router_aux >= 0 ? cfg->loss_router_aux : student->router_aux_loss_coef;
}

/* What a mixture-of-experts model does not compute: the memory policies that keep or
 * recompute parts of a layer (its routed activations are kept whole). */
static int check_moe(struct namelist_ctx *c, const struct kd_config *cfg) {
  const struct kd_card *cards[2] = {&cfg->student, &cfg->teacher};
  for (int m = 0; m < 2; m++) {
    if (!cards[m]->name[0] || card_sparse_layers(cards[m]) == 0) continue;
    const char *key = cfg->mem_tiled_mlp ? "tiled_mlp" : NULL;
    if (m == 0 && !key && cfg->mem_recompute != KD_RECOMPUTE_NONE) key = "recompute";
    if (m == 0 && !key && cfg->mem_offload) key = "offload";
    if (key)
      return namelist_key_err(c, key_index(c, "memory", key), -1,
                              "not computed for the mixture-of-experts %s card '%s'; expected "
                              "the default (recompute 'none', offload and tiled_mlp .false.)",
                              m ? "teacher" : "student", cards[m]->name);
  }
  return 0;
}

int config_load(struct kd_config *cfg, const char *path, int noverrides, char **overrides,
                char *err, size_t errlen) {
  struct namelist_ctx c = {.keys = cfg_keys,
                           .n = NKEYS(cfg_keys),
                           .base = cfg,
                           .file = path,
                           .err = err,
                           .errlen = errlen};
  err[0] = 0;
  config_defaults(cfg);
  if (strlen(path) >= sizeof cfg->source) return namelist_err(&c, 0, NULL, NULL, "path too long");
  strcpy(cfg->source, path);
  int rc = namelist_read_file(&c, path);
  for (int i = 0; i < noverrides && !rc; i++)
    rc = namelist_override(&c, overrides[i]);
  for (size_t i = 0; i < c.n; i++) { /* for config_where (the checks below use it too) */
    size_t g = i;
    while (g > 0 && strcmp(c.keys[g - 1].group, c.keys[i].group) == 0)
      g--;
    where_line[i] = c.line[i] ? c.line[i] : c.gline[g];
    where_set[i] = c.line[i] > 0 || c.setby[i];
    snprintf(where_word[i], sizeof where_word[i], "%s", c.setby[i] ? c.setby[i] : "");
  }
  if (!rc) rc = resolve_paths(&c, cfg);
  if (!rc) rc = check_config(&c, cfg);
  if (!rc && config_teacher_model(cfg) && cfg->teacher_card[0])
    rc = resolve_card(&c, &cfg->teacher, key_index(&c, "teacher", "card"));
  if (!rc) rc = resolve_card(&c, &cfg->student, key_index(&c, "student", "card"));
  if (!rc) rc = check_moe(&c, cfg);
  if (!rc) rc = config_check_ep(cfg, cfg->par_dp, err, errlen);
  return rc;
}

void config_where(const struct kd_config *cfg, const char *group, const char *key, char *out,
                  size_t n) {
  const struct namelist_ctx c = {.keys = cfg_keys, .n = NKEYS(cfg_keys)};
  const long i = namelist_find_key(&c, group, key);
  if (i >= 0 && where_word[i][0])
    snprintf(out, n, "command line '%s': &%s %s", where_word[i], group, key);
  else if (i >= 0 && where_line[i] > 0)
    snprintf(out, n, "%s:%d: &%s %s", cfg->source, where_line[i], group, key);
  else
    snprintf(out, n, "%s: &%s %s", cfg->source, group, key);
}

/* ---- what the words mean together (the only place that decides each) ------------------------ */

int config_teacher_model(const struct kd_config *cfg) {
  return cfg->run_mode == KD_MODE_CACHE ||
         (cfg->run_mode == KD_MODE_DISTILL && cfg->teacher_source == KD_TEACHER_LIVE);
}

int config_teacher_live(const struct kd_config *cfg) {
  return cfg->run_mode == KD_MODE_DISTILL && cfg->teacher_source == KD_TEACHER_LIVE;
}

int config_teacher_cached(const struct kd_config *cfg) {
  return cfg->run_mode == KD_MODE_DISTILL && cfg->teacher_source == KD_TEACHER_CACHE;
}

int config_data_vocab(const struct kd_config *cfg) {
  const int vs = cfg->student.vocab_size, vt = cfg->teacher.vocab_size;
  const int teacher = cfg->run_mode == KD_MODE_DISTILL || cfg->run_mode == KD_MODE_CACHE;
  return teacher && vt > 0 && vt < vs ? vt : vs;
}

int config_student_random(const struct kd_config *cfg) {
  return strcmp(cfg->student_init, "random") == 0;
}

enum kd_resume config_resume(const struct kd_config *cfg) {
  return strcmp(cfg->ckpt_resume, "auto") == 0   ? KD_RESUME_AUTO
         : strcmp(cfg->ckpt_resume, "none") == 0 ? KD_RESUME_NONE
                                                 : KD_RESUME_PATH;
}

int config_check_batch(const struct kd_config *cfg, int dp, char *err,
                       size_t errlen) { /* dp 0: unknown */
  const int64_t per = (int64_t)cfg->par_micro_batch * (dp > 0 ? dp : 1);
  if (cfg->par_global_batch % per == 0) return 0;
  char where[KD_PATH_MAX + 96];
  config_where(cfg, "parallel", "global_batch", where, sizeof where);
  if (dp <= 0)
    snprintf(err, errlen, "%s: %d is not divisible by micro_batch = %d; expected a multiple of %d",
             where, cfg->par_global_batch, cfg->par_micro_batch, cfg->par_micro_batch);
  else
    snprintf(err, errlen,
             "%s: %d is not divisible by micro_batch * dp = %d * %d (dp %s); expected a "
             "multiple of %lld",
             where, cfg->par_global_batch, cfg->par_micro_batch, dp,
             cfg->par_dp > 0 ? "as given in &parallel" : "= ranks / (tp * pp)", (long long)per);
  return KD_EXIT_INPUT;
}

/* The experts of each sparse layer of a card (0: a dense card). */
static int card_experts(const struct kd_card *c) {
  return c->num_experts;
}

int config_check_ep(const struct kd_config *cfg, int dp, char *err, size_t errlen) {
  const int ep = cfg->par_ep;
  if (ep <= 1) return 0; /* 0 is refused by the key's bounds */
  char where[KD_PATH_MAX + 96];
  config_where(cfg, "parallel", "ep", where, sizeof where);
  if (dp > 0 && dp % ep != 0) {
    snprintf(err, errlen,
             "%s: %d does not divide the data-parallel size dp = %d (dp %s); expected a "
             "divisor of dp (expert-parallel ranks are taken from the data-parallel ones)",
             where, ep, dp, cfg->par_dp > 0 ? "as given in &parallel" : "= ranks / (tp * pp)");
    return KD_EXIT_INPUT;
  }
  /* a teacher given by its weights file alone has its card read later (hidden_size 0 until
   * then): the layout check decides */
  const int teacher = config_teacher_model(cfg), pending = teacher && !cfg->teacher.hidden_size;
  const struct kd_card *card[2] = {&cfg->student, teacher && !pending ? &cfg->teacher : NULL};
  const char *who[2] = {"student", "teacher"};
  int moe = pending;
  for (int i = 0; i < 2; i++) {
    const int E = card[i] ? card_experts(card[i]) : 0;
    moe += E > 0;
    if (E > 0 && E % ep != 0) {
      snprintf(err, errlen,
               "%s: %d does not divide the %d experts of the %s card '%s'; expected a divisor "
               "of num_experts",
               where, ep, E, who[i], card[i]->name);
      return KD_EXIT_INPUT;
    }
  }
  if (moe) return 0;
  snprintf(err, errlen,
           "%s: ep = %d needs a mixture-of-experts card (the student card '%s'%s%s%s has no "
           "experts); expected 1",
           where, ep, cfg->student.name, card[1] ? " and the teacher card '" : "",
           card[1] ? cfg->teacher.name : "", card[1] ? "'" : "");
  return KD_EXIT_INPUT;
}

int config_check_cache_loss(const struct kd_config *cfg, char *err, size_t errlen) {
  if (cfg->loss_kind == LOSS_FKL || cfg->teacher_cache_select != TCACHE_SAMPLE) return 0;
  char where[KD_PATH_MAX + 96];
  config_where(cfg, "loss", "kind", where, sizeof where);
  snprintf(err, errlen,
           "%s: '%s' cannot be computed from a 'sample' cache (%s: the sampled distribution has "
           "no mass outside the drawn ids); expected 'fkl', or a 'topk' cache (doc/cache.md)",
           where, kd_loss_kind_names[cfg->loss_kind], cfg->teacher_cache);
  return KD_EXIT_INPUT;
}

int config_is_set(const struct kd_config *cfg, const char *group, const char *key) {
  (void)cfg;
  const struct namelist_ctx c = {.keys = cfg_keys, .n = NKEYS(cfg_keys)};
  const long i = namelist_find_key(&c, group, key);
  return i >= 0 && where_set[i];
}

/* ---- printing and broadcast ---------------------------------------------------------------- */

/* Whether "group%key" is one of list's names, or in one of its groups (an entry "group%"). */
static int key_listed(const char *name, const char *const *list, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const size_t l = strlen(list[i]);
    if (list[i][l - 1] == '%' ? !strncmp(name, list[i], l) : !strcmp(name, list[i])) return 1;
  }
  return 0;
}

/* What changing a key means for a run resumed from a checkpoint written with another value:
 * keys of what is computed (the models, the data and how it is cut, the loss, the seed), of
 * how long the run goes and what it records, and of how it is computed (layout, precision,
 * memory, optimizer); the resume key itself is never compared. */
static int change_kind(const struct namelist_key *k) {
  static const char *const computed[] = {
      "run%mode",       "run%seed",      "teacher%card",    "teacher%init",
      "teacher%source", "teacher%cache", "teacher%cache_k", "teacher%cache_select",
      "student%card",   "student%init",  "data%train",      "data%weights",
      "data%format",    "data%seq_len",  "data%samples",    "data%pack",
      "loss%"};
  static const char *const extends[] = {"run%steps",
                                        "log%",
                                        "checkpoint%every",
                                        "checkpoint%keep",
                                        "checkpoint%on_signal",
                                        "data%valid",
                                        "data%valid_every",
                                        "data%valid_batches",
                                        "generate%save"};
  char name[96];
  snprintf(name, sizeof name, "%s%%%s", k->group, k->key);
  if (!strcmp(name, "checkpoint%resume")) return -1;
  return key_listed(name, computed, sizeof computed / sizeof *computed) ? KD_CHANGE_COMPUTED
         : key_listed(name, extends, sizeof extends / sizeof *extends)  ? KD_CHANGE_EXTENDS
                                                                        : KD_CHANGE_HOW;
}

int config_compare(const struct kd_config *cfg, const char *text, const char *name,
                   char lines[KD_CHANGE_NKINDS][KD_CHANGE_LINE], char *err, size_t errlen) {
  struct kd_config *old = kd_malloc(sizeof *old);
  config_defaults(old);
  struct namelist_ctx c = {.keys = cfg_keys,
                           .n = NKEYS(cfg_keys),
                           .base = old,
                           .file = name,
                           .err = err,
                           .errlen = errlen};
  for (int k = 0; k < KD_CHANGE_NKINDS; k++)
    lines[k][0] = '\0';
  if (namelist_read_text(&c, text)) {
    free(old);
    return -1;
  }
  int changed = 0;
  for (size_t i = 0; i < NKEYS(cfg_keys); i++) {
    const struct namelist_key *k = &cfg_keys[i];
    const int kind = change_kind(k);
    char was[512], now[512];
    namelist_value_text(k, old, was, sizeof was);
    namelist_value_text(k, cfg, now, sizeof now);
    if (kind < 0 || !strcmp(was, now)) continue;
    /* 'auto' data words: the file decides, as it did for the checkpoint */
    if (k->type == NL_WORD && (!strcmp(was, "'auto'") || !strcmp(now, "'auto'")) &&
        !strcmp(k->group, "data"))
      continue;
    char *l = lines[kind];
    const size_t n = strlen(l);
    snprintf(l + n, KD_CHANGE_LINE - n, "%s%s%%%s %s -> %s", n ? ", " : "", k->group, k->key, was,
             now);
    changed++;
  }
  free(old);
  return changed;
}

void config_print(FILE *f, const struct kd_config *cfg) {
  fprintf(f, "! kdtrain configuration: every key, defaults filled in, paths made absolute\n");
  namelist_print(f, cfg_keys, NKEYS(cfg_keys), cfg);
}

void card_print(FILE *f, const struct kd_card *card) {
  struct namelist_key keys[NKEYS(card_keys)];
  size_t n = 0;
  for (size_t i = 0; i < NKEYS(card_keys); i++)
    if (card_key_present(card_key_named(card_keys[i].key), card)) keys[n++] = card_keys[i];
  namelist_print(f, keys, n, card);
}

void config_load_bcast(struct kd_config *cfg, const char *path, int noverrides, char **overrides) {
  int init = 0, fin = 0, rank = 0, rc = 0;
  char err[4096] = "";
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  init = init && !fin;
  if (init) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) rc = config_load(cfg, path, noverrides, overrides, err, sizeof err);
  if (init) MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (rc) {
    if (rank == 0) fprintf(stderr, "kdtrain: %s\n", err);
    if (init) MPI_Finalize();
    exit(KD_EXIT_INPUT);
  }
  if (init) MPI_Bcast(cfg, (int)sizeof *cfg, MPI_BYTE, 0, MPI_COMM_WORLD);
}
