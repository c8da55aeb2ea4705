/* kdgen-ids: the generation engine behind kdgen (src/tools/kdgen.py, which tokenises):
 * continuations of token-id prompts from any kdtrain weights file or checkpoint, with the
 * KV-cache generation of on-policy distillation (src/generate.c), on one rank or under
 * `mpiexec -n N` on any TP x PP x DP layout.
 *
 *   kdgen-ids WEIGHTS.h5 --ids PROMPTS.txt [--max-new-tokens N] [--temperature T] [--top-k K]
 *             [--top-p P] [--seed S] [--eos ID]... [--tp N] [--pp N] [--dp N]
 *             [--device auto|cpu|cuda] [--precision fp32|bf16]
 *             [--out FILE] [--remove-ids] [--then PROGRAM ARGS...]
 *
 * PROMPTS.txt: one prompt per line, token ids separated by blanks (lines may differ in
 * length). Prints one line per prompt: the generated ids. The prompts are split over the
 * data-parallel replicas in order (prompt i keeps its global index, which keys its draws)
 * and gathered back on rank 0. --out, --remove-ids and --then serve the text front end:
 * rank 0 writes the ids to FILE, every rank removes its PROMPTS.txt once read, and after
 * MPI_Finalize rank 0 becomes PROGRAM (execvp), which turns the ids into text.
 *
 * The backend is chosen as kdtrain's run%device chooses it (backend_select: 'auto' takes
 * the CUDA device of every rank where the build and the node have one, else the CPU);
 * --precision bf16 holds the weights in BF16 and computes as a bf16 run's teacher does. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu_hw.h"
#include "comm.h"
#include "config.h"
#include "generate.h"
#include "grid.h"
#include "model.h"
#include "util.h"
#include "weights.h"
#include "words.h"

static const char usage[] =
    "usage: kdgen-ids WEIGHTS.h5 --ids PROMPTS.txt [--max-new-tokens N] [--temperature T]\n"
    "                 [--top-k K] [--top-p P] [--seed S] [--eos ID]... [--tp N] [--pp N]\n"
    "                 [--dp N] [--device auto|cpu|cuda] [--precision fp32|bf16]\n"
    "                 [--out FILE] [--remove-ids] [--then PROGRAM ARGS...]\n"
    "\n"
    "Continue the prompts of PROMPTS.txt (one per line, token ids separated by blanks) with\n"
    "the model of a kdtrain weights file or checkpoint: prefill, then one step per token\n"
    "with a KV cache; prints one line of generated ids per prompt (or writes them to FILE)\n"
    "and the tokens/s on stderr. Temperature 0 (default): greedy; else temperature, top-k\n"
    "(0: all) and top-p (1: all) as transformers filters, draws keyed by (seed, prompt,\n"
    "position): the same ids on any layout. Under mpiexec -n N: tp x pp x dp = N (default\n"
    "pp 1, dp 1 and tp the rest; with --tp given, dp the rest). --device as kdtrain's\n"
    "run%device (auto: CUDA where every rank has a device, else the CPU); --precision bf16:\n"
    "weights in BF16, BF16 compute. Defaults: --max-new-tokens 32, --seed 1, --device auto,\n"
    "--precision fp32. The text front end is kdgen.\n";

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

/* Every replica's ids on world rank 0 (out, nout of all B prompts, in prompt order): a
 * gather over the dp group of the ranks of tp rank 0 and stage 0 (world rank 0 among them). */
static void gather_replicas(const struct kd_grid *g, int *out, int *nout, int B, int max_new) {
  if (g->dp == 1 || g->tp_rank != 0 || g->pp_rank != 0) return;
  int *cnt = kd_malloc((size_t)g->dp * 4 * sizeof(int)), *disp = cnt + g->dp;
  int *rcnt = disp + g->dp, *rdisp = rcnt + g->dp;
  for (int d = 0; d < g->dp; d++) {
    long long s, n;
    grid_block(B, g->dp, d, &s, &n);
    cnt[d] = (int)n, disp[d] = (int)s;
    rcnt[d] = comm_count((size_t)n * max_new), rdisp[d] = comm_count((size_t)s * max_new);
  }
  const int me = g->dp_rank, root = g->dp_rank == 0;
  MPI_Gatherv(root ? MPI_IN_PLACE : out + (size_t)disp[me] * max_new, rcnt[me], MPI_INT, out, rcnt,
              rdisp, MPI_INT, 0, g->dp_comm);
  MPI_Gatherv(root ? MPI_IN_PLACE : nout + disp[me], cnt[me], MPI_INT, nout, cnt, disp, MPI_INT, 0,
              g->dp_comm);
  free(cnt);
}

int main(int argc, char **argv) {
  kd_set_program("kdgen-ids");
  if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    fputs(usage, stdout);
    return KD_EXIT_OK;
  }
  const char *ids_path = NULL, *out_path = NULL;
  char **then = NULL;
  int tp = 0, pp = 1, dp = 0, remove_ids = 0, bf16 = 0;
  enum kd_device device = KD_DEV_AUTO;
  struct kd_gen_opts o = {.s = {0.0f, 0, 1.0f}, .max_new = 32, .seed = 1};
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--remove-ids")) {
      remove_ids = 1;
      continue;
    }
    if (!strcmp(a, "--then") && v) {
      then = argv + i + 1;
      break;
    }
    if (!v || a[0] != '-') {
      fputs(usage, stderr);
      return KD_EXIT_INPUT;
    }
    i++;
    if (!strcmp(a, "--ids"))
      ids_path = v;
    else if (!strcmp(a, "--out"))
      out_path = v;
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
    else if (!strcmp(a, "--tp"))
      tp = (int)number(a, v, 1, 1 << 20);
    else if (!strcmp(a, "--pp"))
      pp = (int)number(a, v, 1, 1 << 20);
    else if (!strcmp(a, "--dp"))
      dp = (int)number(a, v, 1, 1 << 20);
    else if (!strcmp(a, "--device")) {
      const int d = words_find(KD_DEVICE_WORDS, v);
      if (d < 0) {
        fprintf(stderr, "kdgen-ids: --device '%s': expected one of auto, cpu, cuda\n", v);
        return KD_EXIT_INPUT;
      }
      device = (enum kd_device)d;
    } else if (!strcmp(a, "--precision")) {
      const int p = words_find(KD_PRECISION_WORDS, v);
      if (p < 0) {
        fprintf(stderr, "kdgen-ids: --precision '%s': expected fp32 or bf16\n", v);
        return KD_EXIT_INPUT;
      }
      bf16 = p == KD_PREC_BF16;
    } else {
      fprintf(stderr, "kdgen-ids: unknown option '%s'\n", a);
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
  char err[1024], note[512];
  const int node_rank = grid_node_setup(); /* collective: the threads per rank too */
  if (backend_select(&be, device, bf16, node_rank, note, sizeof note, err, sizeof err))
    kd_fail(KD_EXIT_INPUT, "--device %s: %s", kd_device_names[device], err);
  struct kd_card card;
  if (weights_read_card(argv[1], &card, err, sizeof err)) kd_fail(KD_EXIT_INPUT, "%s", err);
  int B, Tp, *plen;
  int *prompts = read_prompts(ids_path, card.vocab_size, &B, &Tp, &plen);
  if (remove_ids) unlink(ids_path);
  if (Tp + o.max_new > card.max_position_embeddings)
    kd_fail(KD_EXIT_INPUT, "%s: prompts of %d ids and %d new exceed max_position_embeddings = %d",
            ids_path, Tp, o.max_new, card.max_position_embeddings);
  int world;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (!tp) tp = world / pp / (dp ? dp : 1); /* --tp not given: the ranks left */
  if (tp < 1) tp = 1;
  struct kd_grid g;
  if (model_check_layout(&card, "model", tp, pp, err, sizeof err) ||
      grid_init(&g, tp, pp, dp, err, sizeof err))
    kd_fail(KD_EXIT_INPUT, "%s on %d rank(s): %s", argv[1], world, err);
  struct kd_model m;
  model_build_grid(&m, &be, &card, bf16 ? MODEL_FROZEN16 : MODEL_FROZEN, 0, &g);
  int st = weights_load(argv[1], &m, m.w, MPI_COMM_WORLD, err, sizeof err);
  if (st) kd_fail(st, "%s", err);
  int *out = kd_calloc((size_t)B * o.max_new, sizeof *out), *nout = kd_calloc((size_t)B, 4);
  long long first, mine; /* this replica's prompts: first .. first + mine - 1 */
  grid_block(B, g.dp, g.dp_rank, &first, &mine);
  o.grid = &g;
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  size_t made = 0;
  if (mine > 0)
    made = gen_run(&be, &m, prompts + first * Tp, plen + first, (int)mine, Tp, &o, first,
                   out + first * o.max_new, nout + first);
  MPI_Barrier(MPI_COMM_WORLD);
  const double dt = MPI_Wtime() - t0;
  gather_replicas(&g, out, nout, B, o.max_new);
  /* one count per replica: its first rank's */
  unsigned long long one = g.tp_rank == 0 && g.pp_rank == 0 ? made : 0, sum = 0;
  MPI_Reduce(&one, &sum, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  if (g.rank == 0) {
    FILE *f = out_path ? fopen(out_path, "w") : stdout;
    if (!f) kd_fail(KD_EXIT_IO, "cannot write %s", out_path);
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < nout[b]; t++)
        fprintf(f, "%s%d", t ? " " : "", out[(size_t)b * o.max_new + t]);
      fputc('\n', f);
    }
    if (fflush(f) != 0 || ferror(f) || (out_path && fclose(f) != 0))
      kd_fail(KD_EXIT_IO, "writing %s failed", out_path ? out_path : "to standard output");
    char threads[192];
    kd_threads_describe(threads, sizeof threads);
    fprintf(stderr,
            "kdgen: %llu tokens for %d prompt(s) in %.2f s: %.1f tokens/s (%d rank(s): tp %d, "
            "pp %d, dp %d; %s, %s; %s)\n",
            sum, B, dt, sum / (dt > 0 ? dt : 1e-9), world, g.tp, g.pp, g.dp, be.name,
            bf16 ? "bf16" : "fp32", threads);
  }
  const int rank = g.rank;
  model_free(&m, &be);
  grid_free(&g);
  comm_release(&be); /* a device backend's host staging of MPI messages */
  be.release(&be);
  free(prompts), free(plen), free(out), free(nout);
  MPI_Finalize();
  if (then && rank == 0) { /* the front end takes over (its exit status is kdgen's) */
    execvp(then[0], then);
    kd_fail(KD_EXIT_IO, "cannot run %s", then[0]);
  }
  return 0;
}
