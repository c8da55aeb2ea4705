/* hftok.c: what transformers 5's AutoTokenizer reads from a model's tokenizer files besides
 * tokenizer.json (hftok.h). The rules follow transformers 5.23's
 * PreTrainedTokenizerBase.from_pretrained and TokenizersBackend.__init__/_post_init: with
 * tokenizer_class TokenizersBackend (PreTrainedTokenizerFast, or none) the backend is
 * tokenizer.json as `tokenizers` reads it; the special tokens the configuration names are
 * then added to it (a no-op for a token tokenizer.json already holds with the same flags);
 * add_bos_token/add_eos_token are dropped where tokenizer.json is (_from_pretrained), and
 * clean_up_tokenization_spaces is ignored for a BPE model unless forced. */
#include "hftok.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

/* The special-token keys of PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES. */
static const char *const named[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                    "pad_token", "cls_token", "mask_token"};
#define NNAMED ((int)(sizeof named / sizeof named[0]))

/* The JSON object of the held file `name`: NULL when absent; *bad set to name when it is not
 * an object. */
static cJSON *parse(const struct tokset *t, const char *name, const char **bad) {
  size_t len;
  const char *s = tokfiles_file(t, name, &len);
  if (!s) return NULL;
  cJSON *j = cJSON_ParseWithLength(s, len);
  if (!cJSON_IsObject(j)) {
    cJSON_Delete(j);
    *bad = name;
    return NULL;
  }
  return j;
}

/* An AddedToken's flags as its repr (and so transformers' comparisons) shows them. */
struct flags {
  int special, normalized, lstrip, rstrip, single_word;
};

/* The flags of token object o as AddedToken(**o) takes them: special false unless stated (true
 * where `special` is given), normalized the opposite of special, the rest false. */
static struct flags flags_of(const cJSON *o, int special) {
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "special");
  struct flags f = {special >= 0 ? special : cJSON_IsTrue(s), 0, 0, 0, 0};
  const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "normalized");
  f.normalized = cJSON_IsBool(n) ? cJSON_IsTrue(n) : !f.special;
  f.lstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "lstrip"));
  f.rstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "rstrip"));
  f.single_word = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "single_word"));
  return f;
}

static int same_flags(struct flags a, struct flags b) {
  return a.special == b.special && a.normalized == b.normalized && a.lstrip == b.lstrip &&
         a.rstrip == b.rstrip && a.single_word == b.single_word;
}

/* tokenizer.json's added token whose content is `content`, NULL when there is none. */
static const cJSON *added(const cJSON *tj, const char *content) {
  const cJSON *a;
  cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(tj, "added_tokens")) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
    if (cJSON_IsString(c) && !strcmp(c->valuestring, content)) return a;
  }
  return NULL;
}

/* The content of a special-token value (a string or a token object), NULL for none. */
static const char *content_of(const cJSON *v) {
  if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A special token `v` (of key `key` in `file`; map: special_tokens_map.json, whose token
 * objects are special) is one tokenizer.json holds with the flags transformers gives it (a
 * string: special, not normalized): adding it changes nothing. 0, or -1 with the reason. */
static int special_held(const cJSON *tj, const cJSON *v, int map, const char *file, const char *key,
                        char *why, size_t whylen) {
  if (!v || cJSON_IsNull(v)) return 0;
  const char *c = content_of(v);
  if (!c) {
    kd_seterr(why, whylen, "%s: %s is not a token (a string or a token object)", file, key);
    return -1;
  }
  const struct flags want =
      cJSON_IsObject(v) ? flags_of(v, map ? 1 : -1) : (struct flags){1, 0, 0, 0, 0};
  const cJSON *a = added(tj, c);
  if (!a || !same_flags(flags_of(a, -1), want)) {
    kd_seterr(why, whylen,
              "%s: %s '%s' is not an added token of tokenizer.json with the flags transformers "
              "gives it, which then adds it",
              file, key, c);
    return -1;
  }
  return 0;
}

/* Every special token configuration `j` (tokenizer_config.json or special_tokens_map.json)
 * names is held by tokenizer.json: the named keys, any other "*_token" key holding a token,
 * and the tokens of extra_special_tokens / additional_special_tokens (a list or an object). */
static int specials_held(const cJSON *tj, const cJSON *j, int map, const char *file, char *why,
                         size_t whylen) {
  const cJSON *v, *x;
  cJSON_ArrayForEach(v, j) {
    const char *k = v->string;
    const size_t n = strlen(k);
    int is_named = 0;
    for (int i = 0; i < NNAMED; i++)
      is_named |= !strcmp(k, named[i]);
    if (!strcmp(k, "extra_special_tokens") || !strcmp(k, "additional_special_tokens")) {
      cJSON_ArrayForEach(x, v) {
        if (special_held(tj, x, map, file, k, why, whylen)) return -1;
      }
    } else if (is_named || (n > 6 && !strcmp(k + n - 6, "_token") && content_of(v))) {
      if (special_held(tj, v, map, file, k, why, whylen)) return -1;
    }
  }
  return 0;
}

/* Every entry of tokenizer_config.json's added_tokens_decoder ({"id": {token}}) is the added
 * token of tokenizer.json with that id and flags: transformers adds the others. */
static int decoder_held(const cJSON *tj, const cJSON *atd, char *why, size_t whylen) {
  const cJSON *v;
  cJSON_ArrayForEach(v, atd) {
    const char *c = content_of(v);
    const cJSON *a = c ? added(tj, c) : NULL;
    const cJSON *id = a ? cJSON_GetObjectItemCaseSensitive(a, "id") : NULL;
    char num[32];
    snprintf(num, sizeof num, "%d", cJSON_IsNumber(id) ? (int)id->valuedouble : -1);
    if (!a || strcmp(num, v->string) || !same_flags(flags_of(a, -1), flags_of(v, -1))) {
      kd_seterr(why, whylen,
                "tokenizer_config.json: added_tokens_decoder entry %s is not tokenizer.json's "
                "added token of that id and flags",
                v->string);
      return -1;
    }
  }
  return 0;
}

int hftok_check(const struct tokset *t, const struct tokenizer *tk, int *eos, char *why,
                size_t whylen) {
  const char *bad = NULL;
  int st = -1;
  cJSON *tc = parse(t, "tokenizer_config.json", &bad);
  cJSON *sm = parse(t, "special_tokens_map.json", &bad);
  cJSON *tj = parse(t, "tokenizer.json", &bad);
  size_t len;
  const cJSON *cls = cJSON_GetObjectItemCaseSensitive(tc, "tokenizer_class");
  const cJSON *atd = cJSON_GetObjectItemCaseSensitive(tc, "added_tokens_decoder");
  /* without added_tokens_decoder, special_tokens_map.json's keys override the config's */
  const cJSON *map = atd ? NULL : sm;
  const cJSON *e = cJSON_HasObjectItem(map, "eos_token")
                       ? cJSON_GetObjectItemCaseSensitive(map, "eos_token")
                       : cJSON_GetObjectItemCaseSensitive(tc, "eos_token");
  if (bad || !tj) {
    kd_seterr(why, whylen, "%s: not a JSON object", bad ? bad : "tokenizer.json");
  } else if (cls && !cJSON_IsNull(cls) &&
             !(cJSON_IsString(cls) && (!strcmp(cls->valuestring, "TokenizersBackend") ||
                                       !strcmp(cls->valuestring, "PreTrainedTokenizerFast")))) {
    kd_seterr(why, whylen,
              "tokenizer_config.json: tokenizer_class %s, which transformers builds from its "
              "own definition rather than tokenizer.json",
              cJSON_IsString(cls) ? cls->valuestring : "(not a string)");
  } else if (cJSON_HasObjectItem(tc, "auto_map")) {
    kd_seterr(why, whylen, "tokenizer_config.json: auto_map (a tokenizer of remote code)");
  } else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(tc, "clean_up_tokenization_spaces")) &&
             cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(
                 tc, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"))) {
    kd_seterr(why, whylen, "tokenizer_config.json: clean_up_tokenization_spaces forced for BPE");
  } else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(tc, "split_special_tokens"))) {
    kd_seterr(why, whylen, "tokenizer_config.json: split_special_tokens");
  } else if (!atd && tokfiles_file(t, "added_tokens.json", &len)) {
    kd_seterr(why, whylen,
              "added_tokens.json: transformers adds its tokens anew (no "
              "added_tokens_decoder in tokenizer_config.json)");
  } else if (!decoder_held(tj, atd, why, whylen) &&
             !specials_held(tj, tc, 0, "tokenizer_config.json", why, whylen) &&
             !specials_held(tj, map, 1, "special_tokens_map.json", why, whylen)) {
    const char *c = content_of(e);
    *eos = c ? tokenizer_token_id(tk, c, strlen(c)) : -1;
    st = 0;
  }
  cJSON_Delete(tc);
  cJSON_Delete(sm);
  cJSON_Delete(tj);
  return st;
}
