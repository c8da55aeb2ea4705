/* kdgen-ids: the generation engine behind kdgen (src/tools/kdgen.py): continuations of
 * prompts from any kdtrain weights file or checkpoint, with the KV-cache generation of
 * on-policy distillation (src/generate.c), on one rank or under `mpiexec -n N` on any
 * TP x PP x DP layout.
 *
 *   kdgen-ids WEIGHTS.h5 (--ids PROMPTS.txt | --text PROMPTS.txt [--jsonl OUT] [--name WHERE])
 *             [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]
 *             [--eos ID]... [--tp N] [--pp N] [--dp N] [--device auto|cpu|cuda]
 *             [--precision fp32|bf16] [--out FILE] [--remove-ids]
 *             [--then PROGRAM ARGS... | --or-else PROGRAM ARGS...]
 *
 * --ids PROMPTS.txt: one prompt per line, token ids separated by blanks (lines may differ in
 * length). Prints one line per prompt: the generated ids. --text PROMPTS.txt: text, one
 * prompt per line as kdgen reads a text prompt file, encoded by the C tokenizer of the
 * weights file's own /tokenizer as kdgen's Python path (transformers) encodes it (hftok.h),
 * the tokenizer's eos_token as end id unless --eos is given; rank 0 writes each prompt with
 * its continuation as kdgen does (kdgen_text.h): text, or JSONL to OUT. The prompts are
 * split over the data-parallel replicas in order (prompt i keeps its global index, which
 * keys its draws) and gathered back on rank 0. --out, --remove-ids, --then, --or-else and
 * --name serve the front end: rank 0 writes the ids (the text) to FILE, every rank removes
 * its PROMPTS.txt once read, after MPI_Finalize rank 0 becomes PROGRAM (execvp), which turns
 * the ids into text; --or-else PROGRAM: where --text's tokenizer cannot serve (none stored,
 * refused by the C tokenizer, read otherwise by transformers), every rank becomes PROGRAM
 * before MPI starts instead of exiting 2; WHERE names the prompts in messages.
 *
 * The backend is chosen as kdtrain's run%device chooses it (backend_select: 'auto' takes
 * the CUDA device of every rank where the build and the node have one, else the CPU);
 * --precision bf16 holds the weights in BF16 and computes as a bf16 run's teacher does. */
#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu_hw.h"
#include "comm.h"
#include "config.h"
#include "generate.h"
#include "grid.h"
#include "kdgen_text.h"
#include "model.h"
#include "tokenizer.h"
#include "util.h"
#include "weights.h"
#include "words.h"

static const char usage[] =
    "usage: kdgen-ids WEIGHTS.h5 (--ids PROMPTS.txt | --text PROMPTS.txt [--jsonl OUT])\n"
    "                 [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
    "                 [--seed S] [--eos ID]... [--tp N] [--pp N] [--dp N]\n"
    "                 [--device auto|cpu|cuda] [--precision fp32|bf16] [--out FILE]\n"
    "                 [--remove-ids] [--name WHERE]\n"
    "                 [--then PROGRAM ARGS... | --or-else PROGRAM ARGS...]\n"
    "\n"
    "Continue the prompts of PROMPTS.txt with the model of a kdtrain weights file or\n"
    "checkpoint: prefill, then one step per token with a KV cache; the tokens/s on stderr.\n"
    "--ids: one prompt per line, token ids separated by blanks; prints one line of\n"
    "generated ids per prompt (or writes them to FILE). --text: text, one prompt per line\n"
    "(UTF-8; blank lines skipped), encoded by the tokenizer the weights file carries\n"
    "(/tokenizer, read by the C tokenizer as transformers reads it), stopped at its\n"
    "eos_token unless --eos is given; prints each prompt followed by its continuation,\n"
    "blank lines between (or to FILE), or with --jsonl writes one JSON object per prompt\n"
    "(\"prompt\", \"text\", \"ids\") to OUT: what kdgen writes. Temperature 0 (default):\n"
    "greedy; else temperature, top-k (0: all) and top-p (1: all) as transformers filters,\n"
    "draws keyed by (seed, prompt, position): the same ids on any layout. Under mpiexec -n N:\n"
    "tp x pp x dp = N (default pp 1, dp 1 and tp the rest; with --tp given, dp the rest).\n"
    "--device as kdtrain's run%device (auto: CUDA where every rank has a device, else the\n"
    "CPU); --precision bf16: weights in BF16, BF16 compute. Defaults: --max-new-tokens 32,\n"
    "--seed 1, --device auto, --precision fp32. The text front end is kdgen.\n";

/* n rows of ids (len[b] each; the rows freed) as one array right-padded with 0 to the
 * longest, whose length goes to *Tp. */
static int *pad_rows(int **rows, const int *len, int n, int *Tp) {
  int width = 1;
  for (int b = 0; b < n; b++)
    width = len[b] > width ? len[b] : width;
  int *p = kd_calloc((size_t)n * width, sizeof *p);
  for (int b = 0; b < n; b++) {
    memcpy(p + (size_t)b * width, rows[b], (size_t)len[b] * sizeof *p);
    free(rows[b]);
  }
  *Tp = width;
  return p;
}

/* Prompts of `path`: B lines of ids, right-padded with 0 to the longest (Tp). */
static int *read_prompts(const char *path, int vocab, int *B, int *Tp, int **plen) {
  FILE *f = fopen(path, "r");
  if (!f) kd_fail(KD_EXIT_INPUT, "cannot read prompt file %s", path);
  int cap = 16, n = 0;
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
  }
  fclose(f);
  if (!n) kd_fail(KD_EXIT_INPUT, "%s holds no prompt", path);
  int *p = pad_rows(rows, len, n, Tp);
  free(rows);
  *B = n, *plen = len;
  return p;
}

static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --text's prompts on every rank: rank 0 reads and encodes them (gentext_encode; gt keeps their
 * text there), then broadcasts the padded ids; a failure there ends every rank (exit 2, one
 * message). Every rank removes its `path` when `remove`. Collective. */
static int *text_prompts(const char *path, const char *where, struct tokenizer *tk,
                         const struct kd_card *card, const char *weights, int max_new, int remove,
                         struct gentext *gt, int *B, int *Tp, int **plen, double *enc_s,
                         size_t *ntok) {
  int rank, st = 0, dims[2] = {0, 0};
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char err[2048] = "";
  int **rows = NULL, *len = NULL, *p = NULL;
  if (rank == 0) {
    const double t0 = seconds();
    st = gentext_encode(path, where, tk, card, weights, max_new, gt, &rows, &len, ntok, err,
                        sizeof err);
    *enc_s = seconds() - t0;
    if (!st) p = pad_rows(rows, len, gt->n, &dims[1]), dims[0] = gt->n;
    if (st && rows)
      for (int b = 0; b < gt->n; b++)
        free(rows[b]);
    free(rows);
  }
  if (remove) unlink(path);
  MPI_Bcast(&st, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (st) {
    MPI_Bcast(err, (int)sizeof err, MPI_CHAR, 0, MPI_COMM_WORLD);
    kd_fail_all(st, "%s", err);
  }
  MPI_Bcast(dims, 2, MPI_INT, 0, MPI_COMM_WORLD);
  *B = dims[0], *Tp = dims[1];
  if (rank != 0) {
    p = kd_malloc((size_t)*B * *Tp * sizeof *p);
    len = kd_malloc((size_t)*B * sizeof *len);
  }
  MPI_Bcast(len, *B, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Bcast(p, comm_count((size_t)*B * *Tp), MPI_INT, 0, MPI_COMM_WORLD);
  *plen = len;
  return p;
}

/* --ids's output on rank 0: a line of generated ids per prompt, to `path` (NULL: standard
 * output). */
static void ids_write(const char *path, const int *out, const int *nout, int B, int max_new) {
  FILE *f = path ? fopen(path, "w") : stdout;
  if (!f) kd_fail(KD_EXIT_IO, "cannot write %s", path);
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < nout[b]; t++)
      fprintf(f, "%s%d", t ? " " : "", out[(size_t)b * max_new + t]);
    fputc('\n', f);
  }
  if (fflush(f) != 0 || ferror(f) || (path && fclose(f) != 0))
    kd_fail(KD_EXIT_IO, "writing %s failed", path ? path : "to standard output");
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

/* The command line. */
struct args {
  const char *ids, *text, *out, *jsonl, *name;
  char **then, **or_else; /* the rest of the command line after --then / --or-else */
  int tp, pp, dp, remove_ids, bf16;
  enum kd_device device;
  struct kd_gen_opts o;
};

/* Read the options after WEIGHTS.h5 into *a: -1, or the exit status of a bad command line
 * (the usage printed). */
static int parse_args(int argc, char **argv, struct args *a) {
  *a = (struct args){.pp = 1, .device = KD_DEV_AUTO};
  a->o = (struct kd_gen_opts){.s = {0.0f, 0, 1.0f}, .max_new = 32, .seed = 1};
  struct kd_gen_opts *o = &a->o;
  for (int i = 2; i < argc; i++) {
    const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(k, "--remove-ids")) {
      a->remove_ids = 1;
      continue;
    }
    if ((!strcmp(k, "--then") || !strcmp(k, "--or-else")) && v) {
      *(k[2] == 't' ? &a->then : &a->or_else) = argv + i + 1;
      break;
    }
    if (!v || k[0] != '-') {
      fputs(usage, stderr);
      return KD_EXIT_INPUT;
    }
    i++;
    if (!strcmp(k, "--ids"))
      a->ids = v;
    else if (!strcmp(k, "--text"))
      a->text = v;
    else if (!strcmp(k, "--out"))
      a->out = v;
    else if (!strcmp(k, "--jsonl"))
      a->jsonl = v;
    else if (!strcmp(k, "--name"))
      a->name = v;
    else if (!strcmp(k, "--max-new-tokens"))
      o->max_new = (int)number(k, v, 1, 1 << 20);
    else if (!strcmp(k, "--temperature"))
      o->s.temperature = (float)number(k, v, 0, 1e6);
    else if (!strcmp(k, "--top-k"))
      o->s.top_k = (int)number(k, v, 0, 1 << 30);
    else if (!strcmp(k, "--top-p"))
      o->s.top_p = (float)number(k, v, 1e-6, 1);
    else if (!strcmp(k, "--seed"))
      o->seed = (uint64_t)number(k, v, 0, 9e15);
    else if (!strcmp(k, "--eos") && o->neos < KD_GEN_MAX_EOS)
      o->eos[o->neos++] = (int)number(k, v, 0, 1 << 30);
    else if (!strcmp(k, "--tp"))
      a->tp = (int)number(k, v, 1, 1 << 20);
    else if (!strcmp(k, "--pp"))
      a->pp = (int)number(k, v, 1, 1 << 20);
    else if (!strcmp(k, "--dp"))
      a->dp = (int)number(k, v, 1, 1 << 20);
    else if (!strcmp(k, "--device")) {
      const int d = words_find(KD_DEVICE_WORDS, v);
      if (d < 0) {
        fprintf(stderr, "kdgen-ids: --device '%s': expected one of auto, cpu, cuda\n", v);
        return KD_EXIT_INPUT;
      }
      a->device = (enum kd_device)d;
    } else if (!strcmp(k, "--precision")) {
      const int p = words_find(KD_PRECISION_WORDS, v);
      if (p < 0) {
        fprintf(stderr, "kdgen-ids: --precision '%s': expected fp32 or bf16\n", v);
        return KD_EXIT_INPUT;
      }
      a->bf16 = p == KD_PREC_BF16;
    } else {
      fprintf(stderr, "kdgen-ids: unknown option '%s'\n", k);
      fputs(usage, stderr);
      return KD_EXIT_INPUT;
    }
  }
  if (argc < 2 || !a->ids == !a->text || (a->ids && (a->jsonl || a->name || a->or_else)) ||
      (a->text && a->then) || (a->jsonl && a->out)) {
    fputs(usage, stderr);
    return KD_EXIT_INPUT;
  }
  return -1;
}

int main(int argc, char **argv) {
  kd_set_program("kdgen-ids");
  if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    fputs(usage, stdout);
    return KD_EXIT_OK;
  }
  struct args a;
  const int bad = parse_args(argc, argv, &a);
  if (bad >= 0) return bad;
  struct kd_gen_opts o = a.o;
  int eos = -1;
  struct tokenizer *tk =
      a.text ? gentext_tokenizer(argv[1], &eos, a.or_else, a.remove_ids ? a.text : NULL) : NULL;
  if (tk && !o.neos && eos >= 0) o.eos[o.neos++] = eos; /* kdgen.py's --eos */
  int tp = a.tp, pp = a.pp, dp = a.dp, bf16 = a.bf16;
  enum kd_device device = a.device;
  MPI_Init(&argc, &argv);
  struct kd_backend be;
  char err[1024], note[512];
  const int node_rank = grid_node_setup(); /* collective: the threads per rank too */
  if (backend_select(&be, device, bf16, node_rank, note, sizeof note, err, sizeof err))
    kd_fail(KD_EXIT_INPUT, "--device %s: %s", kd_device_names[device], err);
  struct kd_card card;
  if (weights_read_card(argv[1], &card, err, sizeof err)) kd_fail(KD_EXIT_INPUT, "%s", err);
  int B, Tp, *plen, *prompts;
  struct gentext gt = {0};
  double enc_s = 0, dec_s = 0;
  size_t ntok = 0;
  const char *where = a.name ? a.name : a.text;
  if (tk) {
    prompts = text_prompts(a.text, where, tk, &card, argv[1], o.max_new, a.remove_ids, &gt, &B, &Tp,
                           &plen, &enc_s, &ntok);
  } else {
    prompts = read_prompts(a.ids, card.vocab_size, &B, &Tp, &plen);
    if (a.remove_ids) unlink(a.ids);
    if (Tp + o.max_new > card.max_position_embeddings)
      kd_fail(KD_EXIT_INPUT, "%s: prompts of %d ids and %d new exceed max_position_embeddings = %d",
              a.ids, Tp, o.max_new, card.max_position_embeddings);
  }
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
    const double t1 = seconds();
    if (tk)
      gentext_write(tk, &gt, out, nout, o.max_new, a.out, a.jsonl);
    else
      ids_write(a.out, out, nout, B, o.max_new);
    dec_s = seconds() - t1;
    char threads[192];
    kd_threads_describe(threads, sizeof threads);
    fprintf(stderr,
            "kdgen: %llu tokens for %d prompt(s) in %.2f s: %.1f tokens/s (%d rank(s): tp %d, "
            "pp %d, dp %d; %s, %s; %s)\n",
            sum, B, dt, sum / (dt > 0 ? dt : 1e-9), world, g.tp, g.pp, g.dp, be.name,
            bf16 ? "bf16" : "fp32", threads);
    if (tk)
      fprintf(stderr,
              "kdgen: the C tokenizer encoded %zu prompt tokens in %.3f s; %llu ids decoded "
              "and written in %.3f s\n",
              ntok, enc_s, sum, dec_s);
  }
  const int rank = g.rank;
  model_free(&m, &be);
  grid_free(&g);
  comm_release(&be); /* a device backend's host staging of MPI messages */
  be.release(&be);
  free(prompts), free(plen), free(out), free(nout);
  tokenizer_free(tk);
  gentext_free(&gt);
  MPI_Finalize();
  if (a.then && rank == 0) { /* the front end takes over (its exit status is kdgen's) */
    execvp(a.then[0], a.then);
    kd_fail(KD_EXIT_IO, "cannot run %s", a.then[0]);
  }
  return 0;
}
