/* weights_card.c: the root attributes and /config of a weights file (doc/format.md): the
 * format and its version, the model card as attributes, its text, the run's namelist, and
 * the bound checksums that cover them all. */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agree.h"
#include "checksum.h"
#include "h5attr.h"
#include "util.h"
#include "weights_impl.h"

/* The model card as /config attributes: every key of card_keys.h the card holds
 * (card_key_present), in /config order (kd_card_file_order). */

/* Key p of /config order. */
static const struct kd_card_key *file_key(size_t p) {
  return &kd_card_keys[kd_card_file_order[p]];
}

/* The stored word of a word field ("" for a value outside its list) into buf; returns buf. */
static const char *card_word(char *buf, size_t len, const struct kd_card_key *k,
                             const void *field) {
  return words_name(buf, len, k->words, *(const int *)field);
}

/* The number of values of a list key. */
static int *card_count(const struct kd_card_key *k, struct kd_card *card) {
  return (int *)((char *)card + k->count_off);
}

/* The stored text of a list key (layer_types, mlp_only_layers, ...): its words or integers
 * separated by ','. */
#define WORDS_TEXT_MAX (KD_LAYERS_MAX * 24)
static void card_words_text(char *out, size_t len, const struct kd_card_key *k,
                            const struct kd_card *card) {
  size_t n = 0;
  out[0] = 0;
  const int count = *card_count(k, (struct kd_card *)card);
  for (int e = 0; e < count && n < len; e++) {
    const char *field = (const char *)card + k->off + (size_t)e * k->size;
    char word[64];
    if (k->type == KD_CARD_INTS)
      n += (size_t)snprintf(out + n, len - n, "%s%d", e ? "," : "", *(const int *)field);
    else
      n += (size_t)snprintf(out + n, len - n, "%s%s", e ? "," : "",
                            card_word(word, sizeof word, k, field));
  }
}

/* Parse the stored text of a list key into `card`: 0, or KD_EXIT_INPUT with err. */
static int card_words_parse(const char *text, const struct kd_card_key *k, struct kd_card *card,
                            const char *path, char *err, size_t errlen) {
  const int ints = k->type == KD_CARD_INTS;
  int n = 0;
  for (const char *p = text; *p;) {
    const size_t l = strcspn(p, ",");
    char word[64];
    snprintf(word, sizeof word, "%.*s", (int)(l < 63 ? l : 63), p);
    char *end = word;
    const long v = ints ? strtol(word, &end, 10) : 0;
    const int w = ints     ? (l && l < 63 && !*end && v >= 0 && v < KD_LAYERS_MAX ? (int)v : -1)
                  : l < 63 ? words_find(k->words, word)
                           : -1;
    if (w < 0 || n >= KD_LAYERS_MAX) {
      kd_seterr(err, errlen,
                "%s: /config is not a valid model card: %s entry %d = '%s': expected at most %d "
                "of %s",
                path, k->name, n, word, KD_LAYERS_MAX, ints ? "non-negative integers" : k->words);
      return KD_EXIT_INPUT;
    }
    *(int *)((char *)card + k->off + (size_t)n++ * k->size) = w;
    p += l + (p[l] == ',');
  }
  *card_count(k, card) = n;
  return 0;
}

/* Longest /config/namelist read (the run's namelist: a few KiB). */
#define NAMELIST_MAX ((size_t)16 << 20)

/* The bound checksum of the root attributes format and format_version (format 1.2). */
static uint64_t root_sum(const char *format, const char *version) {
  uint64_t h = kd_fnv1a(format, kd_fnv1a("format", 0));
  h = kd_fnv1a(version, kd_fnv1a("format_version", h));
  return h + checksum_bind("/", "root", 0, NULL);
}

int weights_card_write_root(hid_t file) {
  char ver[32];
  snprintf(ver, sizeof ver, "%d.%d", WEIGHTS_VERSION_MAJOR, WEIGHTS_VERSION_MINOR);
  int rc = h5attr_set_string(file, "format", WEIGHTS_FORMAT);
  if (!rc) rc = h5attr_set_string(file, "format_version", ver);
  if (!rc) rc = h5attr_set_u64(file, CHECKSUM_BOUND, root_sum(WEIGHTS_FORMAT, ver));
  return rc;
}

int weights_card_check_root(hid_t file, const char *path, int *minor, char *err, size_t errlen) {
  char fmt[64] = "", ver[64] = "", why[1024] = "";
  if (h5attr_get_string(file, "format", fmt, sizeof fmt, why, sizeof why) != 0 ||
      strcmp(fmt, WEIGHTS_FORMAT)) {
    kd_seterr(err, errlen, "%s is not a kdtrain weights file (no format attribute '%s')%s%s", path,
              WEIGHTS_FORMAT, why[0] ? ": " : "", why);
    return KD_EXIT_INPUT;
  }
  int major = -1;
  *minor = -1;
  if (h5attr_get_string(file, "format_version", ver, sizeof ver, why, sizeof why) != 0) {
    kd_seterr(err, errlen, "%s: missing or malformed format_version attribute: %s", path, why);
    return KD_EXIT_INPUT;
  }
  if (sscanf(ver, "%d.%d", &major, minor) != 2 || major < 0 || *minor < 0) {
    kd_seterr(err, errlen, "%s: missing or malformed format_version attribute '%s'", path, ver);
    return KD_EXIT_INPUT;
  }
  if (major > WEIGHTS_VERSION_MAJOR) {
    kd_seterr(err, errlen,
              "%s has format_version %s but this kdtrain reads format %d.x (writes %d.%d): use a "
              "newer kdtrain",
              path, ver, WEIGHTS_VERSION_MAJOR, WEIGHTS_VERSION_MAJOR, WEIGHTS_VERSION_MINOR);
    return KD_EXIT_INPUT;
  }
  /* required from 1.2; checked wherever present (a 1.2 file relabelled 1.1 still has it) */
  if (*minor < CHECKSUM_ALL_SINCE_MINOR && !h5attr_exists(file, CHECKSUM_BOUND)) return 0;
  uint64_t stored = 0;
  if (h5attr_get_u64(file, CHECKSUM_BOUND, &stored, why, sizeof why) != 0) {
    kd_seterr(err, errlen, "%s: the file is damaged (format %s requires it)", why, ver);
    return KD_EXIT_INPUT;
  }
  if (stored != root_sum(fmt, ver)) {
    kd_seterr(err, errlen,
              "%s: the root attributes format/format_version fail their checksum (stored "
              "%016" PRIx64 ", computed %016" PRIx64 "): the file's header was changed",
              path, stored, root_sum(fmt, ver));
    return KD_EXIT_INPUT;
  }
  return 0;
}

/* The bound checksum of /config: every card key's name and value (as stored: strings,
 * int64, float64 bits), bound to the path /config (format 1.1, unchanged in 1.2 so that
 * older readers still read newer files). */
static uint64_t config_sum(const struct kd_card *card) {
  uint64_t h = 0;
  for (size_t p = 0; p < KD_CARD_NKEYS; p++) {
    const struct kd_card_key *k = file_key(p);
    const char *field = (const char *)card + k->off;
    if (!card_key_present(k, card)) continue;
    h = kd_fnv1a(k->name, h);
    uint64_t bits = 0;
    char text[WORDS_TEXT_MAX];
    if (k->type == KD_CARD_STR) {
      h = kd_fnv1a(field, h);
    } else if (k->count_off) {
      card_words_text(text, sizeof text, k, card);
      h = kd_fnv1a(text, h); /* the words or integers, as stored */
    } else if (k->type == KD_CARD_WORD) {
      h = kd_fnv1a(card_word(text, sizeof text, k, field), h); /* the word, as stored */
    } else if (k->type == KD_CARD_REAL) {
      memcpy(&bits, field, sizeof bits);
    } else {
      bits = (uint64_t)(int64_t) * (const int *)field;
    }
    h = checksum_mix64(h, (uint32_t)bits) ^ checksum_mix64(~h, (uint32_t)(bits >> 32));
  }
  return h + checksum_bind("/config", "card", 0, NULL);
}

/* The bound checksum of the card text, /config attribute 'card' (format 1.2). */
static uint64_t card_sum(const char *text) {
  const int64_t n = (int64_t)strlen(text);
  return checksum_bytes(text, (size_t)n) + checksum_bind("/config@card", "str", 1, &n);
}

/* The bound checksum of /config/namelist: its bytes (without the terminating NUL). */
static uint64_t namelist_sum(const char *text) {
  const int64_t n = (int64_t)strlen(text);
  return checksum_bytes(text, (size_t)n) + checksum_bind("/config/namelist", "str", 1, &n);
}

/* The text of the model card (card_print), allocated. */
static char *card_text(const struct kd_card *card) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return NULL;
  card_print(f, card);
  fclose(f);
  return text;
}

/* Write /config/namelist (a dataset: the text may outgrow an attribute's 64 KiB) with its
 * checksum, rank 0 writing the bytes. Collective. */
static int namelist_write(hid_t cfg, const char *namelist, int ok, int rank, MPI_Comm comm) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, strlen(namelist) + 1);
  H5Tset_strpad(t, H5T_STR_NULLTERM);
  hid_t fs = H5Screate(H5S_SCALAR), ms = H5Screate(H5S_SCALAR);
  hid_t d = H5Dcreate2(cfg, "namelist", t, fs, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (rank != 0) {
    H5Sselect_none(fs);
    H5Sselect_none(ms);
  }
  hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
  /* every rank enters the collective write, or none does */
  ok = agree_all(d >= 0 && ok, comm) &&
       agree_all(h5attr_set_u64(d, CHECKSUM_BOUND, namelist_sum(namelist)) == 0, comm);
  if (ok) ok = H5Dwrite(d, t, ms, fs, dxpl, namelist) >= 0;
  H5Pclose(dxpl);
  if (d >= 0) H5Dclose(d);
  H5Sclose(fs);
  H5Sclose(ms);
  H5Tclose(t);
  return ok;
}

int weights_card_write(hid_t cfg, const struct kd_card *card, const char *namelist, int rank,
                       MPI_Comm comm) {
  int ok = 1;
  for (size_t p = 0; p < KD_CARD_NKEYS; p++) {
    const struct kd_card_key *k = file_key(p);
    const char *field = (const char *)card + k->off;
    char text[WORDS_TEXT_MAX];
    if (!card_key_present(k, card)) continue;
    if (k->count_off) {
      card_words_text(text, sizeof text, k, card);
      ok &= h5attr_set_string(cfg, k->name, text) == 0;
    } else if (k->type == KD_CARD_STR) {
      ok &= h5attr_set_string(cfg, k->name, field) == 0;
    } else if (k->type == KD_CARD_WORD) {
      ok &= h5attr_set_string(cfg, k->name, card_word(text, sizeof text, k, field)) == 0;
    } else if (k->type == KD_CARD_INT) {
      ok &= h5attr_set_int(cfg, k->name, *(const int *)field) == 0;
    } else if (k->type == KD_CARD_REAL) {
      ok &= h5attr_set_double(cfg, k->name, *(const double *)field) == 0;
    } else {
      int8_t v = (int8_t)(*(const int *)field != 0);
      ok &= h5attr_set_typed(cfg, k->name, H5T_STD_I8LE, H5T_NATIVE_INT8, &v) == 0;
    }
  }
  char *text = card_text(card);
  ok = ok && text && h5attr_set_string(cfg, "card", text) == 0 &&
       h5attr_set_u64(cfg, CHECKSUM_BOUND, config_sum(card)) == 0 &&
       h5attr_set_u64(cfg, CHECKSUM_CARD, card_sum(text)) == 0;
  free(text);
  if (namelist) ok = namelist_write(cfg, namelist, ok, rank, comm);
  return ok ? 0 : -1;
}

/* Check /config/namelist when present: a scalar string dataset (fixed or variable length,
 * ASCII or UTF-8) of at most NAMELIST_MAX bytes whose checksum (required when `all`, checked
 * when present) holds; its text into *out when out is not NULL (left NULL when the file has
 * none). Every rank reads it. 0 or KD_EXIT_INPUT. */
static int namelist_check(hid_t cfg, const char *path, int all, char **out, char *err,
                          size_t errlen) {
  if (out) *out = NULL;
  if (H5Lexists(cfg, "namelist", H5P_DEFAULT) <= 0) return 0;
  H5O_info_t oi;
  hid_t d =
      H5Oget_info_by_name(cfg, "namelist", &oi, H5P_DEFAULT) >= 0 && oi.type == H5O_TYPE_DATASET
          ? H5Dopen2(cfg, "namelist", H5P_DEFAULT)
          : -1;
  char *text = NULL, why[200] = "is not a scalar string dataset";
  int st = 0;
  if (d < 0 || h5attr_read_text(d, NAMELIST_MAX - 1, &text, why, sizeof why) != 0) {
    kd_seterr(err, errlen,
              "%s: /config/namelist %s (the run's namelist, at most %zu bytes): the file is "
              "damaged",
              path, why, NAMELIST_MAX - 1);
    st = KD_EXIT_INPUT;
  }
  if (!st && (all || h5attr_exists(d, CHECKSUM_BOUND))) {
    uint64_t stored = 0;
    char why[1200];
    if (h5attr_get_u64(d, CHECKSUM_BOUND, &stored, why, sizeof why) != 0) {
      kd_seterr(err, errlen, "%s: the file is damaged", why);
      st = KD_EXIT_INPUT;
    } else {
      st = checksum_verify(stored, namelist_sum(text), path, "/config/namelist",
                           "the run's namelist stored in the file was changed", err, errlen);
    }
  }
  if (!st && out) {
    *out = text;
    text = NULL;
  }
  free(text);
  if (d >= 0) H5Dclose(d);
  return st;
}

/* Verify the card text's checksum (attribute CHECKSUM_CARD): 0 or KD_EXIT_INPUT. */
static int card_check_text(hid_t cfg, const char *path, char *err, size_t errlen) {
  char *text = kd_calloc(H5ATTR_STR_MAX + 1, 1), why[1200];
  uint64_t stored = 0;
  int st = 0;
  if (h5attr_get_string(cfg, "card", text, H5ATTR_STR_MAX + 1, why, sizeof why) ||
      h5attr_get_u64(cfg, CHECKSUM_CARD, &stored, why, sizeof why)) {
    kd_seterr(err, errlen, "%s: the file is damaged", why);
    st = KD_EXIT_INPUT;
  } else {
    st = checksum_verify(stored, card_sum(text), path, "/config attribute 'card'",
                         "the card text in the file was changed", err, errlen);
  }
  free(text);
  return st;
}

int weights_card_read(hid_t cfg, const char *path, struct kd_card *card, char **namelist, char *err,
                      size_t errlen) {
  if (namelist) *namelist = NULL;
  card_defaults(card);                   /* what a key the file lacks means (the RoPE keys) */
  card->hidden_activation = KD_ACT_SILU; /* no table default (follows arch): a gemma3 file has it */
  card->norm_topk_prob = 0;              /* no table default either: an MoE file has it */
  for (size_t p = 0; p < KD_CARD_NKEYS; p++) {
    const struct kd_card_key *k = file_key(p);
    char *field = (char *)card + k->off;
    if (!(k->flags & CARD_REQ) && !h5attr_exists(cfg, k->name)) continue;
    int rc;
    if (k->type == KD_CARD_STR) {
      rc = h5attr_get_string(cfg, k->name, field, k->size, err, errlen);
    } else if (k->count_off) {
      char text[WORDS_TEXT_MAX];
      rc = h5attr_get_string(cfg, k->name, text, sizeof text, err, errlen);
      if (rc == 0) rc = card_words_parse(text, k, card, path, err, errlen);
    } else if (k->type == KD_CARD_WORD) {
      char word[64];
      rc = h5attr_get_string(cfg, k->name, word, sizeof word, err, errlen);
      const int w = rc ? -1 : words_find(k->words, word);
      if (rc == 0 && w < 0) {
        kd_seterr(err, errlen,
                  "%s: /config is not a valid model card: %s = '%s': expected one of %s", path,
                  k->name, word, k->words);
        rc = KD_EXIT_INPUT;
      }
      if (rc == 0) *(int *)field = w;
    } else if (k->type == KD_CARD_REAL) {
      rc = h5attr_get_double(cfg, k->name, (double *)field, err, errlen);
    } else {
      long long v = 0;
      rc = h5attr_get_int(cfg, k->name, &v, err, errlen);
      if (rc == 0 &&
          (v < INT_MIN || v > INT_MAX || (k->type == KD_CARD_BOOL && v != 0 && v != 1))) {
        kd_seterr(err, errlen, "%s: /config attribute '%s' is out of range (%lld)", path, k->name,
                  v);
        rc = KD_EXIT_INPUT;
      }
      if (rc == 0) *(int *)field = (int)v;
    }
    if (rc) return KD_EXIT_INPUT;
  }
  char why[1200];
  const char *bad = card_check(card, why, sizeof why);
  if (bad) {
    kd_seterr(err, errlen, "%s: /config is not a valid model card: %s = %s", path, bad, why);
    return KD_EXIT_INPUT;
  }
  /* then the checksums: an invalid value is named first, a valid but altered one here */
  hid_t file = H5Iget_file_id(cfg);
  const int all = checksum_required(file);
  if (file >= 0) H5Fclose(file);
  uint64_t stored = 0;
  if (h5attr_get_u64(cfg, CHECKSUM_BOUND, &stored, why, sizeof why)) {
    kd_seterr(err, errlen, "%s: the file is damaged or was written by a kdtrain older than 1.1",
              why);
    return KD_EXIT_INPUT;
  }
  if (checksum_verify(stored, config_sum(card), path, "/config",
                      "the model card in the file is corrupted", err, errlen))
    return KD_EXIT_INPUT;
  int st = all || h5attr_exists(cfg, CHECKSUM_CARD) ? card_check_text(cfg, path, err, errlen) : 0;
  return st ? st : namelist_check(cfg, path, all, namelist, err, errlen);
}

/* The first layer where a per-layer rule of the card (card_layer_sparse, card_layer_rope)
 * gives the file's card and the model's card different answers (yes / no: the answer's
 * words; keys: the card keys that decide it), as a message: KD_EXIT_INPUT; 0: none. */
static int layer_rule_differs(const char *path, const struct kd_card *file,
                              const struct kd_card *model, int (*rule)(const struct kd_card *, int),
                              const char *yes, const char *no, const char *keys, char *err,
                              size_t errlen) {
  for (int l = 0; l < model->num_hidden_layers; l++)
    if (rule(file, l) != rule(model, l)) {
      kd_seterr(err, errlen,
                "%s was written for a different model: layer %d %s in its /config but %s in the "
                "model card %s (%s); use the card the file was written with",
                path, l, rule(file, l) ? yes : no, rule(model, l) ? yes : no,
                model->path[0] ? model->path : model->name, keys);
      return KD_EXIT_INPUT;
    }
  return 0;
}

int weights_card_compare(const struct kd_card *file, const struct kd_card *model, const char *path,
                         char *err, size_t errlen) {
  /* in /config order: arch, compared first, agrees before a family's keys are */
  for (size_t p = 0; p < KD_CARD_NKEYS; p++) {
    const struct kd_card_key *k = file_key(p);
    if (!(k->flags & CARD_CMP) || !(card_key_present(k, file) || card_key_present(k, model)))
      continue;
    const char *fa = (const char *)file + k->off, *fb = (const char *)model + k->off;
    char va[80], vb[80], wa[64], wb[64];
    int differ;
    if (k->type == KD_CARD_STR) {
      differ = strcmp(fa, fb) != 0;
      snprintf(va, sizeof va, "'%.60s'", fa);
      snprintf(vb, sizeof vb, "'%.60s'", fb);
    } else if (k->type == KD_CARD_WORD) {
      differ = *(const int *)fa != *(const int *)fb;
      snprintf(va, sizeof va, "'%s'", card_word(wa, sizeof wa, k, fa));
      snprintf(vb, sizeof vb, "'%s'", card_word(wb, sizeof wb, k, fb));
    } else if (k->type == KD_CARD_REAL) {
      double a = *(const double *)fa, b = *(const double *)fb;
      differ = !(fabs(a - b) <= 1e-12 * fmax(fabs(a), fabs(b))); /* decimal round trips */
      snprintf(va, sizeof va, "%.17g", a);
      snprintf(vb, sizeof vb, "%.17g", b);
    } else {
      /* head_dim: the width it stands for (0 and hidden / heads agree) */
      const int hd = k->off == offsetof(struct kd_card, head_dim);
      int a = hd ? card_head_dim(file) : *(const int *)fa;
      int b = hd ? card_head_dim(model) : *(const int *)fb;
      differ = a != b;
      if (k->type == KD_CARD_BOOL) {
        snprintf(va, sizeof va, "%s", a ? ".true." : ".false.");
        snprintf(vb, sizeof vb, "%s", b ? ".true." : ".false.");
      } else {
        snprintf(va, sizeof va, "%d", a);
        snprintf(vb, sizeof vb, "%d", b);
      }
    }
    if (differ) {
      kd_seterr(err, errlen,
                "%s was written for a different model: %s = %s in its /config but %s in the "
                "model card %s; use the card the file was written with",
                path, k->name, va, vb, model->path[0] ? model->path : model->name);
      return KD_EXIT_INPUT;
    }
  }
  int st = layer_rule_differs(path, file, model, card_layer_sparse, "is sparse", "is dense",
                              "num_experts, decoder_sparse_step, mlp_only_layers", err, errlen);
  if (!st)
    st = layer_rule_differs(path, file, model, card_layer_rope, "uses RoPE", "skips RoPE",
                            "no_rope_layers, no_rope_layer_interval", err, errlen);
  if (st) return st;
  /* the sliding window keys: what they mean, layer by layer (the layer counts agree) */
  for (int l = 0; l < model->num_hidden_layers; l++) {
    const int a = card_layer_window(file, l), b = card_layer_window(model, l);
    if (a != b) {
      kd_seterr(err, errlen,
                "%s was written for a different model: the sliding window of layer %d is %d in "
                "its /config but %d in the model card %s (sliding_window, use_sliding_window, "
                "max_window_layers, layer_types; 0: full attention); use the card the file was "
                "written with",
                path, l, a, b, model->path[0] ? model->path : model->name);
      return KD_EXIT_INPUT;
    }
  }
  return 0;
}
