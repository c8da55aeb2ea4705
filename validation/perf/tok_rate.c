/* tok_rate.c: the C tokenizer's encoding rate (validation/perf/tokenizer.sh). Usage:
 *
 *   tok_rate TOKENIZER.json TEXT [REPEATS]
 *
 * encodes TEXT whole and line by line, REPEATS times each (default 5), one thread, and
 * prints "whole TOKENS SECONDS HASH" and "lines TOKENS SECONDS HASH": the best time of the
 * repeats (after one run that warms the word cache, as a long run has it) and the FNV-1a
 * hash of the ids (little-endian int32, all lines' in order), which
 * validation/ref/tokenizer_ref.py --perf prints for Hugging Face tokenizers. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer.h"

static uint64_t fnv(uint64_t h, const int32_t *ids, size_t n) {
  for (size_t i = 0; i < n; i++)
    for (int b = 0; b < 4; b++)
      h = (h ^ (((uint32_t)ids[i] >> (8 * b)) & 255)) * 0x100000001B3ull;
  return h;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: tok_rate TOKENIZER.json TEXT [REPEATS]\n");
    return 2;
  }
  const int reps = argc > 3 ? atoi(argv[3]) : 5;
  char err[512];
  struct tokenizer *t = tokenizer_load_file(argv[1], err, sizeof err);
  if (!t) {
    fprintf(stderr, "tok_rate: %s\n", err);
    return 2;
  }
  FILE *f = fopen(argv[2], "rb");
  if (!f) {
    fprintf(stderr, "tok_rate: %s cannot be read\n", argv[2]);
    return 2;
  }
  fseek(f, 0, SEEK_END);
  const long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)n + 1);
  if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) return 2;
  fclose(f);
  struct tok_encoding e = {0};
  for (int mode = 0; mode < 2; mode++) {
    double best = 1e30;
    size_t tokens = 0;
    uint64_t hash = 0, first = 0;
    for (int r = 0; r < reps + 1; r++) { /* the first run warms the cache */
      const double t0 = now();
      tokens = 0;
      hash = 0xCBF29CE484222325ull;
      if (mode == 0) {
        if (tokenizer_encode(t, text, (size_t)n, 0, &e, err, sizeof err)) return 1;
        tokens = e.n;
        if (r == 0) hash = fnv(hash, e.ids, e.n);
      } else {
        for (long a = 0; a < n;) {
          long b = a;
          while (b < n && text[b] != '\n')
            b++;
          if (tokenizer_encode(t, text + a, (size_t)(b - a), 0, &e, err, sizeof err)) return 1;
          tokens += e.n;
          if (r == 0) hash = fnv(hash, e.ids, e.n);
          a = b + 1;
        }
      }
      const double dt = now() - t0;
      if (r == 0) first = hash;
      if (r > 0 && dt < best) best = dt;
    }
    printf("%s %zu %.6f %016llx\n", mode == 0 ? "whole" : "lines", tokens, best,
           (unsigned long long)first);
  }
  tok_encoding_free(&e);
  tokenizer_free(t);
  free(text);
  return 0;
}
