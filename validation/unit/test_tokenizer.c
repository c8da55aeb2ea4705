/* test_tokenizer.c: the C tokenizer (src/tokenizer.h). Without arguments: small
 * tokenizer.json texts written here (merges by rank, byte fallback, unknown tokens, added
 * tokens, text that is not UTF-8, the API), and every component it does not implement
 * refused by name. With a directory written by validation/ref/tokenizer_ref.py
 * (validation/unit/test_tokenizer.sh): for every tokenizer kind there, the ids and byte
 * offsets Hugging Face `tokenizers` gives for each string (with and without the template's
 * special tokens) and the text of the ids and of random id lists (with and without special
 * tokens), exactly; prints how many. */
#include <check.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "tokenizer.h"

static const char *ref_dir;

/* --- small tokenizers written here --------------------------------------------------- */

static struct tokenizer *load(const char *json) {
  char err[512];
  struct tokenizer *t = tokenizer_load(json, strlen(json), err, sizeof err);
  if (!t) fprintf(stderr, "%s\n", err);
  ck_assert_ptr_nonnull(t);
  return t;
}

/* The ids and offsets of `text` as "id:start-end id:start-end ...". */
static char *enc_str(struct tokenizer *t, const char *text, size_t len, int special) {
  static char buf[4096];
  struct tok_encoding e = {0};
  char err[256];
  ck_assert_int_eq(tokenizer_encode(t, text, len, special, &e, err, sizeof err), 0);
  size_t p = 0;
  buf[0] = 0;
  for (size_t i = 0; i < e.n && p < sizeof buf - 64; i++)
    p += (size_t)snprintf(buf + p, sizeof buf - p, "%s%d:%lld-%lld", i ? " " : "", e.ids[i],
                          (long long)e.start[i], (long long)e.end[i]);
  tok_encoding_free(&e);
  return buf;
}

#define BPE_HEAD "{\"version\": \"1.0\", \"added_tokens\": ["
static const char *tiny_bytelevel =
    BPE_HEAD "{\"id\": 9, \"content\": \"<x>\", \"special\": true, \"normalized\": false}],"
             "\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
             "\"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true},"
             "\"post_processor\": null, \"decoder\": {\"type\": \"ByteLevel\"},"
             "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, "
             "\"\\u0120\": 3, \"\\u0120a\": 4, \"\\u00ef\": 5, \"\\u00bf\": 6, \"\\u00bd\": 7, "
             "\"\\u00ff\": 8}, \"merges\": [\"a b\", \"\\u0120 a\"]}}";

START_TEST(merges_and_offsets) {
  struct tokenizer *t = load(tiny_bytelevel);
  /* "abab a": ab ab | Ġa (GPT-2's split: "abab", " a") */
  ck_assert_str_eq(enc_str(t, "abab a", 6, 0), "2:0-2 2:2-4 4:4-6");
  /* the added token splits first; unknown bytes ('c') have no token */
  ck_assert_str_eq(enc_str(t, "a<x>bc", 6, 0), "0:0-1 9:1-4 1:4-5");
  /* 0xFF is not UTF-8: one U+FFFD (EF BF BD) whose three tokens cover the byte */
  ck_assert_str_eq(enc_str(t,
                           "a\xff"
                           "b",
                           3, 0),
                   "0:0-1 5:1-2 6:1-2 7:1-2 1:2-3");
  /* a truncated character is one maximal subpart: E4 B8 then 'a' */
  ck_assert_str_eq(enc_str(t,
                           "\xe4\xb8"
                           "a",
                           3, 0),
                   "5:0-2 6:0-2 7:0-2 0:2-3");
  ck_assert_int_eq(tokenizer_vocab_size(t), 10);
  ck_assert_int_eq(tokenizer_token_id(t, "<x>", 3), 9);
  ck_assert_int_eq(tokenizer_token_id(t,
                                      "\xc4\xa0"
                                      "a",
                                      3),
                   4);
  ck_assert_int_eq(tokenizer_token_id(t, "zz", 2), -1);
  const int32_t ids[] = {2, 9, 4, 77, 8};
  size_t n;
  char *s = tokenizer_decode(t, ids, 5, 0, &n);
  ck_assert_str_eq(s, "ab<x> a\xef\xbf\xbd"); /* 77 unknown: skipped; 0xFF alone: U+FFFD */
  free(s);
  s = tokenizer_decode(t, ids, 3, 1, &n);
  ck_assert_str_eq(s, "ab a");
  free(s);
  tokenizer_free(t);
}
END_TEST

static const char *tiny_sp =
    BPE_HEAD "{\"id\": 0, \"content\": \"<unk>\", \"special\": true, \"normalized\": false}],"
             "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", "
             "\"prepend\": \"\\u2581\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" "
             "\"}, \"content\": \"\\u2581\"}]}, \"pre_tokenizer\": null, \"post_processor\": null,"
             "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", "
             "\"pattern\": {\"String\": \"\\u2581\"}, \"content\": \" \"}, {\"type\": "
             "\"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", "
             "\"start\": 1, \"stop\": 0}]},"
             "\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, "
             "\"byte_fallback\": true, \"vocab\": {\"<unk>\": 0, \"<0xC3>\": 1, \"<0xA9>\": 2, "
             "\"\\u2581\": 3, \"h\": 4, \"i\": 5, \"\\u2581h\": 6, \"\\u2581hi\": 7}, "
             "\"merges\": [[\"\\u2581\", \"h\"], [\"\\u2581h\", \"i\"]]}}";

START_TEST(byte_fallback_and_unknown) {
  struct tokenizer *t = load(tiny_sp);
  /* "hi é": ▁hi ▁ <0xC3><0xA9>; "hi z": z has no token nor bytes: <unk> */
  ck_assert_str_eq(enc_str(t, "hi \xc3\xa9", 5, 0), "7:0-2 3:2-3 1:3-5 2:3-5");
  ck_assert_str_eq(enc_str(t, "hi zz", 5, 0), "7:0-2 3:2-3 0:3-5");
  const int32_t ids[] = {7, 3, 1, 2, 3, 1};
  size_t n;
  char *s = tokenizer_decode(t, ids, 6, 0, &n);
  ck_assert_str_eq(s, "hi \xc3\xa9 \xef\xbf\xbd"); /* a lone <0xC3>: U+FFFD */
  free(s);
  tokenizer_free(t);
}
END_TEST

/* A tokenizer.json with `field` set to `value` in the tiny byte-level one. */
static void refused(const char *field, const char *value, const char *needle) {
  char json[4096], err[512];
  const char *p = strstr(tiny_bytelevel, field);
  ck_assert_ptr_nonnull(p);
  const char *colon = strchr(p, ':') + 1, *end = colon;
  int depth = 0; /* the old value: up to the comma that ends it */
  for (; *end && !(depth == 0 && (*end == ',' || *end == '}')); end++) {
    if (*end == '{' || *end == '[') depth++;
    if (*end == '}' || *end == ']') depth--;
  }
  snprintf(json, sizeof json, "%.*s %s%s", (int)(colon - tiny_bytelevel), tiny_bytelevel, value,
           end);
  struct tokenizer *t = tokenizer_load(json, strlen(json), err, sizeof err);
  if (t || !strstr(err, needle)) fprintf(stderr, "%s = %s: %s\n", field, value, t ? "loaded" : err);
  ck_assert_ptr_null(t);
  ck_assert_ptr_nonnull(strstr(err, needle));
}

START_TEST(refusals) {
  refused("\"model\"", "{\"type\": \"WordPiece\", \"vocab\": {}}", "model type 'WordPiece'");
  refused("\"model\"", "{\"type\": \"Unigram\", \"vocab\": []}", "model type 'Unigram'");
  refused("\"normalizer\"", "{\"type\": \"Lowercase\"}", "normalizer 'Lowercase'");
  refused("\"normalizer\"", "{\"type\": \"NFKC\"}", "normalizer 'NFKC'");
  refused("\"normalizer\"",
          "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \" {2,}\"}, "
          "\"content\": \" \"}",
          "normalizer Replace with the regular expression");
  refused("\"pre_tokenizer\"", "{\"type\": \"Whitespace\"}", "pre-tokenizer 'Whitespace'");
  refused("\"pre_tokenizer\"", "{\"type\": \"Digits\", \"individual_digits\": true}",
          "pre-tokenizer 'Digits'");
  refused("\"pre_tokenizer\"",
          "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\d+\"}, "
          "\"behavior\": \"Isolated\", \"invert\": false}",
          "regular expression '\\d+' is not implemented");
  refused("\"pre_tokenizer\"",
          "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
          "\"ByteLevel\"}, {\"type\": \"Metaspace\"}]}",
          "after ByteLevel");
  refused("\"post_processor\"", "{\"type\": \"BertProcessing\"}",
          "post-processor 'BertProcessing'");
  refused("\"post_processor\"", "{\"type\": \"RobertaProcessing\"}",
          "post-processor 'RobertaProcessing'");
  refused("\"decoder\"", "{\"type\": \"WordPiece\"}", "decoder 'WordPiece'");
  refused("\"decoder\"", "{\"type\": \"CTC\"}", "decoder 'CTC'");
  refused("\"added_tokens\"", "[{\"content\": \"<x>\", \"single_word\": true}]", "single_word");
  refused("\"version\"", "\"2.0\"", "version");
  refused("\"normalizer\"", "null, \"truncation\": {\"max_length\": 5}", "truncation");
  refused("\"post_processor\"", "null, \"padding\": {\"strategy\": \"BatchLongest\"}", "padding");
  refused("\"merges\"", "[\"a b c\"]", "not two tokens");
  refused("\"merges\"", "[\"a zz\"]", "not in the vocabulary");
  char err[256];
  ck_assert_ptr_null(tokenizer_load("{", 1, err, sizeof err));
  ck_assert_ptr_null(tokenizer_load_file("/nonexistent/tokenizer.json", err, sizeof err));
  ck_assert_ptr_nonnull(strstr(err, "/nonexistent/tokenizer.json"));
}
END_TEST

START_TEST(model_refusals) {
  char json[2048], err[512];
  const char *bad[][2] = {
      {"\"dropout\": 0.1", "dropout"},
      {"\"continuing_subword_prefix\": \"##\"", "continuing_subword_prefix"},
      {"\"end_of_word_suffix\": \"</w>\"", "end_of_word_suffix"},
  };
  for (int i = 0; i < 3; i++) {
    snprintf(json, sizeof json,
             "{\"model\": {\"type\": \"BPE\", %s, \"vocab\": {\"a\": 0}, "
             "\"merges\": []}}",
             bad[i][0]);
    ck_assert_ptr_null(tokenizer_load(json, strlen(json), err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, bad[i][1]));
  }
}
END_TEST

/* --- against Hugging Face tokenizers (ref_dir) ----------------------------------------- */

static size_t unhex(const char *h, char *out) {
  if (!strcmp(h, "-")) return 0;
  size_t n = strlen(h) / 2;
  for (size_t i = 0; i < n; i++) {
    unsigned v;
    sscanf(h + 2 * i, "%2x", &v);
    out[i] = (char)v;
  }
  return n;
}

static void show(const char *what, const char *s, size_t n) {
  fprintf(stderr, "  %s: \"", what);
  for (size_t i = 0; i < n && i < 300; i++) {
    const unsigned char c = (unsigned char)s[i];
    if (c >= 32 && c < 127 && c != '"') {
      fputc(c, stderr);
    } else {
      fprintf(stderr, "\\x%02x", c);
    }
  }
  fprintf(stderr, "\"\n");
}

static int check_kind(const char *kind) {
  char path[1024], err[512];
  snprintf(path, sizeof path, "%s/%s.json", ref_dir, kind);
  struct tokenizer *t = tokenizer_load_file(path, err, sizeof err);
  if (!t) {
    fprintf(stderr, "%s: %s\n", kind, err);
    return 1;
  }
  snprintf(path, sizeof path, "%s/%s.expect", ref_dir, kind);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  char *line = NULL, *buf = malloc(1 << 20), *want = malloc(1 << 20);
  size_t cap = 0;
  long nenc = 0, ndec = 0, nlist = 0, bad = 0;
  struct tok_encoding e = {0};
  int32_t *ids = malloc(sizeof *ids * (1 << 16));
  while (getline(&line, &cap, f) > 0) {
    char *save, *tk = strtok_r(line, " \n", &save);
    if (!tk) continue;
    if (!strcmp(tk, "V")) {
      const long v = atol(strtok_r(NULL, " \n", &save));
      if (tokenizer_vocab_size(t) != v) {
        fprintf(stderr, "%s: vocabulary size %lld, tokenizers %ld\n", kind,
                (long long)tokenizer_vocab_size(t), v);
        bad++;
      }
    } else if (!strcmp(tk, "T")) {
      const size_t n = unhex(strtok_r(NULL, " \n", &save), buf);
      const int id = atoi(strtok_r(NULL, " \n", &save));
      if (tokenizer_token_id(t, buf, n) != id) {
        fprintf(stderr, "%s: token_to_id %d, tokenizers %d\n", kind, tokenizer_token_id(t, buf, n),
                id);
        show("token", buf, n);
        bad++;
      }
    } else if (!strcmp(tk, "E") || !strcmp(tk, "D")) {
      const int enc = !strcmp(tk, "E");
      int special = 0;
      size_t len = 0, n;
      if (enc) {
        special = atoi(strtok_r(NULL, " \n", &save));
        len = unhex(strtok_r(NULL, " \n", &save), buf);
      }
      n = (size_t)atol(strtok_r(NULL, " \n", &save));
      int64_t *ws = malloc(sizeof *ws * (n + 1)), *we = malloc(sizeof *we * (n + 1));
      for (size_t i = 0; i < n; i++) {
        ids[i] = atoi(strtok_r(NULL, " \n", &save));
        if (enc) {
          ws[i] = atoll(strtok_r(NULL, " \n", &save));
          we[i] = atoll(strtok_r(NULL, " \n", &save));
        }
      }
      int ok = 1;
      const int32_t *dec_ids = ids;
      if (enc) {
        nenc++;
        if (tokenizer_encode(t, buf, len, special, &e, err, sizeof err)) {
          fprintf(stderr, "%s: %s\n", kind, err);
          show("text", buf, len);
          ck_abort();
        }
        ok = e.n == n;
        for (size_t i = 0; ok && i < n; i++)
          ok = e.ids[i] == ids[i] && e.start[i] == ws[i] && e.end[i] == we[i];
        if (!ok && bad < 8) {
          fprintf(stderr, "%s: the encoding (add_special %d) differs from tokenizers'\n", kind,
                  special);
          show("text", buf, len);
          fprintf(stderr, "  C:         ");
          for (size_t i = 0; i < e.n && i < 40; i++)
            fprintf(stderr, " %d:%lld-%lld", e.ids[i], (long long)e.start[i], (long long)e.end[i]);
          fprintf(stderr, "\n  tokenizers:");
          for (size_t i = 0; i < n && i < 40; i++)
            fprintf(stderr, " %d:%lld-%lld", ids[i], (long long)ws[i], (long long)we[i]);
          fprintf(stderr, "\n");
        }
      } else {
        nlist++;
      }
      for (int skip = 0; skip < 2; skip++) {
        const size_t nw = unhex(strtok_r(NULL, " \n", &save), want);
        size_t nd;
        char *d = tokenizer_decode(t, dec_ids, n, skip, &nd);
        ndec++;
        if (nd != nw || memcmp(d, want, nw)) {
          if (bad < 8) {
            fprintf(stderr, "%s: decode (skip_special %d) differs from tokenizers'\n", kind, skip);
            if (enc) show("text", buf, len);
            show("C", d, nd);
            show("tokenizers", want, nw);
          }
          ok = 0;
        }
        free(d);
      }
      bad += !ok;
      free(ws), free(we);
    }
  }
  printf("%s: %ld encodings (ids and byte offsets), %ld decodes (%ld of random id lists): %ld "
         "differ from tokenizers\n",
         kind, nenc, ndec, 2 * nlist, bad);
  fclose(f);
  free(line), free(buf), free(want), free(ids);
  tok_encoding_free(&e);
  tokenizer_free(t);
  return bad > 0;
}

START_TEST(against_tokenizers) {
  char path[1024], kind[64];
  snprintf(path, sizeof path, "%s/kinds.txt", ref_dir);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  int failed = 0, nkinds = 0;
  while (fscanf(f, "%63s", kind) == 1)
    failed += check_kind(kind), nkinds++;
  fclose(f);
  ck_assert_int_gt(nkinds, 0);
  ck_assert_int_eq(failed, 0);
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  ref_dir = argc > 1 ? argv[1] : NULL;
  Suite *s = suite_create("tokenizer");
  TCase *tc = tcase_create("tokenizer");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, merges_and_offsets);
  tcase_add_test(tc, byte_fallback_and_unknown);
  tcase_add_test(tc, refusals);
  tcase_add_test(tc, model_refusals);
  if (ref_dir) tcase_add_test(tc, against_tokenizers);
  suite_add_tcase(s, tc);
  const int failed = check_run(s);
  MPI_Finalize();
  return failed ? 1 : 0;
}
