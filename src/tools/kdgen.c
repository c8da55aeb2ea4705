/* kdgen: continuations of prompts from any kdtrain weights file or checkpoint, with the
 * KV-cache generation of on-policy distillation (src/generate.c), on one rank or under
 * `mpiexec -n N` with the model split over N tensor-parallel ranks.
 *
 *   kdgen WEIGHTS.h5 --ids PROMPTS.txt [--max-new-tokens N] [--temperature T] [--top-k K]
 *         [--top-p P] [--seed S] [--eos ID]...
 *
 * PROMPTS.txt: one prompt per line, token ids separated by blanks (lines may differ in
 * length). Prints one line per prompt: the generated ids. Temperature 0 (the default) is
 * greedy. This is the ids engine; text prompts through the tokenizer the file carries are
 * not read yet. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "config.h"
#include "generate.h"
#include "grid.h"
#include "model.h"
#include "util.h"
#include "weights.h"

static const char usage[] =
    "usage: kdgen WEIGHTS.h5 --ids PROMPTS.txt [--max-new-tokens N] [--temperature T]\n"
    "             [--top-k K] [--top-p P] [--seed S] [--eos ID]...\n"
    "\n"
    "Continue the prompts of PROMPTS.txt (one per line, token ids separated by blanks) with\n"
    "the model of a kdtrain weights file or checkpoint: prefill, then one step per token\n"
    "with a KV cache; prints one line of generated ids per prompt and the tokens/s on\n"
    "stderr. Temperature 0 (default): greedy; else temperature, top-k (0: all) and top-p\n"
    "(1: all) as transformers filters, draws keyed by (seed, sample, position): the same\n"
    "ids on any number of ranks. Under mpiexec -n N the model is split over N\n"
    "tensor-parallel ranks. Defaults: --max-new-tokens 32, --seed 1.\n";

/* Prompts of `path`: B lines of ids, right-padded with 0 to the longest (Tp). */
static int *read_prompts(const char *path, int vocab, int *B, int *Tp, int **plen) {
  FILE *f = fopen(path, "r");
  if (!f) kd_fail(KD_EXIT_INPUT, "cannot read prompt file %s", path);
  int cap = 16, n = 0, width = 1;
  int **rows = kd_malloc((size_t)cap * sizeof *rows), *len = kd_malloc((size_t)cap * sizeof *len);
  char line[65536];
  while (fgets(line, sizeof line, f)) {
    if (!strchr(line, '\n') && !feof(f))
      kd_fail(KD_EXIT_INPUT, "%s: line %d is longer than %zu bytes", path, n + 1, sizeof line);
    int *ids = kd_malloc(sizeof line / 2 * sizeof *ids), m = 0;
    for (char *s = line, *end;; s = end) {
      long v = strtol(s, &end, 10);
      if (end == s) break;
      if (v < 0 || v >= vocab)
        kd_fail(KD_EXIT_INPUT, "%s: line %d: token id %ld outside the vocabulary [0, %d)", path,
                n + 1, v, vocab);
      ids[m++] = (int)v;
    }
    if (!m) {
      free(ids);
      continue;
    }
    if (n == cap) {
      cap *= 2;
      int **r2 = realloc(rows, (size_t)cap * sizeof *rows), *l2 = realloc(len, (size_t)cap * 4);
      KD_CHECK(r2 && l2, "out of memory reading %s", path);
      rows = r2, len = l2;
    }
    rows[n] = ids, len[n++] = m;
    width = m > width ? m : width;
  }
  fclose(f);
  if (!n) kd_fail(KD_EXIT_INPUT, "%s holds no prompt", path);
  int *p = kd_calloc((size_t)n * width, sizeof *p);
  for (int b = 0; b < n; b++) {
    memcpy(p + (size_t)b * width, rows[b], (size_t)len[b] * sizeof *p);
    free(rows[b]);
  }
  free(rows);
  *B = n, *Tp = width, *plen = len;
  return p;
}

static double number(const char *opt, const char *v, double lo, double hi) {
  char *end;
  double x = strtod(v, &end);
  if (*end || end == v || !(x >= lo && x <= hi))
    kd_fail(KD_EXIT_INPUT, "%s %s: expected a number in [%g, %g]", opt, v, lo, hi);
  return x;
}

int main(int argc, char **argv) {
  kd_set_program("kdgen");
  if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    fputs(usage, stdout);
    return KD_EXIT_OK;
  }
  const char *ids_path = NULL;
  struct kd_gen_opts o = {.s = {0.0f, 0, 1.0f}, .max_new = 32, .seed = 1};
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v || a[0] != '-') {
      fputs(usage, stderr);
      return KD_EXIT_INPUT;
    }
    i++;
    if (!strcmp(a, "--ids"))
      ids_path = v;
    else if (!strcmp(a, "--max-new-tokens"))
      o.max_new = (int)number(a, v, 1, 1 << 20);
    else if (!strcmp(a, "--temperature"))
      o.s.temperature = (float)number(a, v, 0, 1e6);
    else if (!strcmp(a, "--top-k"))
      o.s.top_k = (int)number(a, v, 0, 1 << 30);
    else if (!strcmp(a, "--top-p"))
      o.s.top_p = (float)number(a, v, 1e-6, 1);
    else if (!strcmp(a, "--seed"))
      o.seed = (uint64_t)number(a, v, 0, 9e15);
    else if (!strcmp(a, "--eos") && o.neos < KD_GEN_MAX_EOS)
      o.eos[o.neos++] = (int)number(a, v, 0, 1 << 30);
    else {
      fprintf(stderr, "kdgen: unknown option '%s'\n", a);
      fputs(usage, stderr);
      return KD_EXIT_INPUT;
    }
  }
  if (argc < 2 || !ids_path) {
    fputs(usage, stderr);
    return KD_EXIT_INPUT;
  }
  MPI_Init(&argc, &argv);
  struct kd_backend be;
  backend_cpu_init(&be, 0);
  struct kd_card card;
  char err[1024];
  if (weights_read_card(argv[1], &card, err, sizeof err)) kd_fail(KD_EXIT_INPUT, "%s", err);
  int B, Tp, *plen;
  int *prompts = read_prompts(ids_path, card.vocab_size, &B, &Tp, &plen);
  if (Tp + o.max_new > card.max_position_embeddings)
    kd_fail(KD_EXIT_INPUT, "%s: prompts of %d ids and %d new exceed max_position_embeddings = %d",
            ids_path, Tp, o.max_new, card.max_position_embeddings);
  int world;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  struct kd_grid g;
  if (model_check_layout(&card, "model", world, 1, err, sizeof err) ||
      grid_init(&g, world, 1, 1, err, sizeof err))
    kd_fail(KD_EXIT_INPUT, "%s: %d tensor-parallel ranks: %s", argv[1], world, err);
  struct kd_model m;
  model_build_grid(&m, &be, &card, MODEL_FROZEN, 0, &g);
  int st = weights_load(argv[1], &m, m.w, MPI_COMM_WORLD, err, sizeof err);
  if (st) kd_fail(st, "%s", err);
  int *out = kd_calloc((size_t)B * o.max_new, sizeof *out), *nout = kd_calloc((size_t)B, 4);
  const double t0 = MPI_Wtime();
  const size_t made = gen_run(&be, &m, prompts, plen, B, Tp, &o, 0, out, nout);
  const double dt = MPI_Wtime() - t0;
  if (g.rank == 0) {
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < nout[b]; t++)
        printf("%s%d", t ? " " : "", out[(size_t)b * o.max_new + t]);
      printf("\n");
    }
    if (fflush(stdout) != 0 || ferror(stdout))
      kd_fail(KD_EXIT_IO, "writing to standard output failed");
    fprintf(stderr, "kdgen: %zu tokens for %d prompt(s) in %.2f s: %.1f tokens/s (%d rank(s))\n",
            made, B, dt, made / (dt > 0 ? dt : 1e-9), world);
  }
  model_free(&m, &be);
  grid_free(&g);
  be.release(&be);
  free(prompts), free(plen), free(out), free(nout);
  MPI_Finalize();
  return 0;
}
