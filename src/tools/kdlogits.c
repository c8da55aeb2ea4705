/* kdlogits: the logits of a kdtrain weights file (or checkpoint) for given token ids,
 * computed by kdtrain's own forward on one rank in FP32 (doc/checkpoint.md: how the
 * Hugging Face round trip compares them with transformers').
 *
 *   kdlogits WEIGHTS.h5 TOKENS.txt OUT.npy
 *
 * TOKENS.txt holds one sequence per line, token ids separated by blanks, every line of
 * the same length T; OUT.npy receives float32 logits of shape (B, T, vocab_size). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "config.h"
#include "grid.h"
#include "layers.h"
#include "model.h"
#include "util.h"
#include "weights.h"

/* Read B sequences of T ids (one line each) into a new array; exits 2 on bad input. */
static int *read_tokens(const char *path, int vocab, int *B, int *T) {
  FILE *f = fopen(path, "r");
  if (!f) kd_fail(KD_EXIT_INPUT, "cannot read token file %s", path);
  size_t cap = 256, n = 0;
  int *ids = kd_malloc(cap * sizeof *ids);
  char line[65536];
  *B = 0;
  *T = 0;
  while (fgets(line, sizeof line, f)) {
    if (!strchr(line, '\n') && !feof(f))
      kd_fail(KD_EXIT_INPUT, "%s: line %d is longer than %zu bytes", path, *B + 1, sizeof line);
    int len = 0;
    for (char *s = line, *end;; s = end) {
      long v = strtol(s, &end, 10);
      if (end == s) break;
      if (v < 0 || v >= vocab)
        kd_fail(KD_EXIT_INPUT, "%s: line %d: token id %ld outside the vocabulary [0, %d)", path,
                *B + 1, v, vocab);
      if (n == cap) {
        cap *= 2;
        int *grown = realloc(ids, cap * sizeof *ids);
        KD_CHECK(grown, "out of memory reading %s", path);
        ids = grown;
      }
      ids[n++] = (int)v;
      len++;
    }
    if (len == 0) continue;
    if (*B > 0 && len != *T)
      kd_fail(KD_EXIT_INPUT, "%s: line %d has %d ids but line 1 has %d", path, *B + 1, len, *T);
    *T = len;
    (*B)++;
  }
  fclose(f);
  if (*B == 0) kd_fail(KD_EXIT_INPUT, "%s holds no token ids", path);
  return ids;
}

/* Write a (B, T, V) little-endian float32 array in NumPy's .npy format (version 1.0). */
static void write_npy(const char *path, const float *x, int B, int T, int V) {
  char hdr[128];
  int n = snprintf(hdr, sizeof hdr,
                   "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d, %d), }", B, T, V);
  const int total = 10 + n + 1, pad = (64 - total % 64) % 64; /* header ends on 64 bytes */
  FILE *f = fopen(path, "wb");
  if (!f) kd_fail(KD_EXIT_IO, "cannot write %s", path);
  const unsigned short hlen = (unsigned short)(n + pad + 1);
  unsigned char pre[10] = {0x93,
                           'N',
                           'U',
                           'M',
                           'P',
                           'Y',
                           1,
                           0,
                           (unsigned char)(hlen & 0xff),
                           (unsigned char)(hlen >> 8)};
  int ok = fwrite(pre, 1, sizeof pre, f) == sizeof pre && fwrite(hdr, 1, (size_t)n, f) == (size_t)n;
  for (int i = 0; i < pad && ok; i++)
    ok = fputc(' ', f) != EOF;
  ok = ok && fputc('\n', f) != EOF;
  const size_t cnt = (size_t)B * T * V;
  ok = ok && fwrite(x, sizeof *x, cnt, f) == cnt;
  if (fclose(f) != 0 || !ok) kd_fail(KD_EXIT_IO, "writing %s failed (disk full?)", path);
}

static const char usage[] =
    "usage: kdlogits WEIGHTS_OR_CHECKPOINT.h5 TOKENS.txt OUT.npy\n"
    "\n"
    "Logits of kdtrain's own forward pass (one process, CPU, FP32) of the model in a\n"
    "weights file or checkpoint for the token ids of TOKENS.txt (one sequence per line,\n"
    "ids separated by spaces, all lines the same length), written as a (B, T, V) float32\n"
    ".npy file: the comparison with Hugging Face transformers (doc/checkpoint.md).\n";

int main(int argc, char **argv) {
  kd_set_program("kdlogits");
  /* --help and usage errors before MPI_Init: they need no MPI */
  if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    fputs(usage, stdout);
    return KD_EXIT_OK;
  }
  if (argc != 4) {
    fputs(usage, stderr);
    return KD_EXIT_INPUT;
  }
  MPI_Init(&argc, &argv);
  grid_node_setup(); /* the threads: this process's share of its node's CPUs */
  struct kd_backend be;
  backend_cpu_init(&be, 0);
  struct kd_card card;
  char err[1024];
  if (weights_read_card(argv[1], &card, err, sizeof err)) kd_fail(KD_EXIT_INPUT, "%s", err);
  int B, T;
  int *tokens = read_tokens(argv[2], card.vocab_size, &B, &T);
  if (T > card.max_position_embeddings)
    kd_fail(KD_EXIT_INPUT, "%s: sequences of %d tokens exceed max_position_embeddings = %d",
            argv[2], T, card.max_position_embeddings);

  struct kd_model m;
  model_build(&m, &be, &card, MODEL_FROZEN); /* weights only */
  int st = weights_load(argv[1], &m, m.w, MPI_COMM_WORLD, err, sizeof err);
  if (st) kd_fail(st, "%s", err);
  struct kd_acts a;
  acts_build(&a, &be, &m, B, T);
  layers_forward(&be, &m, &a, tokens);

  /* logits (N, V) = hn (N, C) . head (V, C)^T */
  const size_t N = (size_t)B * T;
  const int C = card.hidden_size, V = card.vocab_size;
  float *logits = be.alloc(&be, KD_MEM_LOSS, N * (size_t)V * sizeof(float));
  be.gemm(&be, 0, 1, (int)N, V, C, 1.0f, a.hn, C, m.pw.head, C, 0.0f, logits, V);
  if (m.card.final_logit_softcapping > 0) /* Gemma's cap c tanh(z / c) on the logits */
    be.softcap_forward(&be, logits, N * (size_t)V, (float)m.card.final_logit_softcapping);
  write_npy(argv[3], logits, B, T, V);
  printf("kdlogits: %s: logits (%d, %d, %d) -> %s\n", argv[1], B, T, V, argv[3]);

  be.free(&be, logits);
  acts_free(&a, &be);
  model_free(&m, &be);
  be.release(&be);
  free(tokens);
  MPI_Finalize();
  return 0;
}
