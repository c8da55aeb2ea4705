/* main.c: command line, MPI start and stop, dispatch to the run; --print-config,
 * --dry-run, --help and --version run as one process without MPI. */
#include "kdtrain_config.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "config.h"
#include "grid.h"
#include "plan.h"
#include "selftest.h"
#include "tcache.h"
#include "train.h"
#include "util.h"
#include "weights.h"

static void usage(FILE *f) {
  fprintf(f, "usage: kdtrain [options] INPUT.nml [group%%key=value ...]\n"
             "\n"
             "Distil a teacher language model into a student (or train one) as set by the\n"
             "Fortran namelist INPUT.nml; group%%key=value words override the file (in the\n"
             "order given). Options, the input and the overrides may come in any order.\n"
             "\n"
             "options:\n"
             "  --print-config  print the complete effective configuration as a namelist, exit\n"
             "  --dry-run       check the input as the run does and print the parallel layout,\n"
             "                  the per-rank memory plan (MiB) and a summary for the ranks of\n"
             "                  the launch (mpiexec -n N), exit; reads the data, the tokenizers\n"
             "                  and the model cards, never the weights; writes nothing\n"
             "  --bytes         with --dry-run: the memory plan in exact bytes (for scripts)\n"
             "  --ranks N       with --dry-run: plan for N ranks from this one process\n"
             "  --device-mem SIZE  with --dry-run: say whether the largest rank fits in SIZE\n"
             "                  per device (80GiB, 141GB, 40960MiB; default memory%%budget_mb)\n"
             "  --without-files with --dry-run: plan from the model cards and the input alone,\n"
             "                  without opening the weights, cache, data or checkpoint files\n"
             "  --search        with --dry-run: list the layouts (tp, pp, dp, micro_batch,\n"
             "                  recompute) that fit the ranks and --device-mem: a first choice\n"
             "                  for speed, then the others, fastest first\n"
             "  --selftest      compare every op of the selected backend with the CPU op\n"
             "  --version       print the version\n"
             "  --help          this text\n"
             "\n"
             "exit status: 0 done, 2 bad input, 3 I/O failure, 4 diverged, 5 stopped by a signal\n"
             "documentation: doc/user-guide.md, doc/input.md\n");
}

/* This process's rank and the world size of the launch (MPICH/Hydra and Slurm's PMI,
 * Open MPI, a Slurm step), read from the launcher's environment without MPI: the
 * single-process commands run before, and instead of, MPI_Init. 0 of 1 without a launcher. */
static int launch_size(int *rank) {
  static const char *const vars[][2] = {{"PMI_SIZE", "PMI_RANK"},
                                        {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"},
                                        {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID"}};
  *rank = 0;
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *size = getenv(vars[i][0]), *r = getenv(vars[i][1]);
    if (size && r && atoi(size) > 0) {
      *rank = atoi(r);
      return atoi(size);
    }
  }
  return 1;
}

/* A launcher that started lsize tasks which MPI did not connect (srun without the MPI
 * plugin MPICH needs: every task is a 1-rank world) would train lsize times alone, each
 * writing the same files: refuse it, exit 2 (the launcher's rank 0 says why). */
static void refuse_copies(int lsize, int lrank) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 1 || lsize <= 1) return;
  if (lrank == 0)
    fprintf(stderr,
            "kdtrain: the launcher started %d tasks, but MPI made each of them a 1-rank job "
            "(MPI_Comm_size = 1): they would train %d times alone and overwrite each other's "
            "output. Under Slurm start MPICH ranks with srun --mpi=pmi2 (or export "
            "SLURM_MPI_TYPE=pmi2, as jobs/slurm.sh does), or use mpiexec\n",
            lsize, lsize);
  MPI_Finalize();
  exit(KD_EXIT_INPUT);
}

/* Bytes of a size word "80GiB", "80G", "141GB", "512MiB" (binary units for K/M/G/T with
 * or without "iB", decimal for "KB".."TB"); -1 when it is not one. */
static double size_bytes(const char *w) {
  char *end;
  const double v = strtod(w, &end);
  if (end == w || !(v > 0)) return -1;
  static const char units[] = "KMGT";
  const char *u = *end ? strchr(units, *end & ~0x20) : NULL;
  if (!*end) return v;
  if (!u) return -1;
  const int dec = strcmp(end + 1, "B") == 0 || strcmp(end + 1, "b") == 0;
  if (!dec && end[1] && strcmp(end + 1, "iB") != 0) return -1;
  double f = 1;
  for (const char *p = units; p <= u; p++)
    f *= dec ? 1000.0 : 1024.0;
  return v * f;
}

int main(int argc, char **argv) {
  backend_prepare(argv); /* first: it may re-execute this program with a better BLAS kernel */
  int lrank;
  const int lsize = launch_size(&lrank);
  int print_config = 0, dry_run = 0, selftest = 0, plan_ranks = 0, no_files = 0, search = 0;
  int exact = 0;
  double device_bytes = 0;
  const char *input = NULL;
  /* options, the input file and group%key=value words, in any order (overrides apply in
   * the order given): the override words are gathered at the front of argv[1..], a slot
   * the loop has already read */
  char **overrides = argv + 1;
  int noverrides = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--print-config") == 0)
      print_config = 1;
    else if (strcmp(a, "--dry-run") == 0)
      dry_run = 1;
    else if (strcmp(a, "--bytes") == 0)
      exact = 1;
    else if (strcmp(a, "--without-files") == 0)
      no_files = 1;
    else if (strcmp(a, "--search") == 0)
      search = 1;
    else if (strcmp(a, "--selftest") == 0)
      selftest = 1;
    else if ((strcmp(a, "--ranks") == 0 || strcmp(a, "--device-mem") == 0) && i + 1 < argc) {
      const int ranks = a[2] == 'r';
      char *end;
      const long n = strtol(argv[++i], &end, 10);
      const double b = ranks ? 0 : size_bytes(argv[i]);
      if (ranks ? *end || n < 1 || n > 1 << 24 : b <= 0) {
        if (lrank == 0)
          fprintf(stderr, "kdtrain: %s %s: expected %s\n", a, argv[i],
                  ranks ? "a number of ranks (1 or more)" : "a size such as 80GiB or 141GB");
        return KD_EXIT_INPUT;
      }
      if (ranks)
        plan_ranks = (int)n;
      else
        device_bytes = b;
    } else if (strcmp(a, "--version") == 0) {
      if (lrank == 0) printf("kdtrain %s\n", PACKAGE_VERSION);
      return KD_EXIT_OK;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      if (lrank == 0) usage(stdout);
      return KD_EXIT_OK;
    } else if (a[0] == '-') {
      if (lrank == 0) {
        fprintf(stderr, "kdtrain: unknown option '%s'\n", a);
        usage(stderr);
      }
      return KD_EXIT_INPUT;
    } else if (strchr(a, '%') || strchr(a, '=')) { /* an override (a malformed one is named) */
      overrides[noverrides++] = argv[i];
    } else if (!input) {
      input = a;
    } else {
      if (lrank == 0)
        fprintf(stderr,
                "kdtrain: '%s': a second input file (the first is '%s'); expected one INPUT.nml, "
                "options (--help) and group%%key=value words, in any order\n",
                a, input);
      return KD_EXIT_INPUT;
    }
  }
  if ((plan_ranks || device_bytes > 0 || no_files || search || exact) && !dry_run) {
    if (lrank == 0)
      fprintf(stderr, "kdtrain: --ranks, --device-mem, --without-files, --search and --bytes "
                      "plan a job: add --dry-run\n");
    return KD_EXIT_INPUT;
  }
  if (!input) {
    if (lrank == 0) {
      fprintf(stderr, "kdtrain: no input file given\n");
      usage(stderr);
    }
    return KD_EXIT_INPUT;
  }
  /* --print-config and --dry-run write their product to stdout: one process, and no
   * MPI_Init, at which some MPI transports print warnings there. Other ranks end here. */
  const int product = print_config || dry_run;
  if (product && lrank != 0) return KD_EXIT_OK;
  if (!product) {
    MPI_Init(&argc, &argv);
    refuse_copies(lsize, lrank);
    grid_node_setup(); /* the threads per rank, before any OpenMP parallel region */
  }
  static struct kd_config cfg;
  config_without_files(no_files);
  config_load_bcast(&cfg, input, noverrides, overrides);
  if ((cfg.run_mode == KD_MODE_DISTILL || cfg.run_mode == KD_MODE_CACHE) &&
      cfg.teacher.hidden_size == 0 && cfg.teacher_init[0] &&
      !(no_files && config_teacher_cached(&cfg))) {
    /* &teacher gave only init: the card is the one stored in the weights file (a cached
     * teacher planned without files is planned from the cache settings alone) */
    char err[1024];
    if (no_files)
      kd_fail(KD_EXIT_INPUT,
              "%s: &teacher init: --without-files opens no weights file, so the teacher's "
              "card cannot come from '%s'; expected &teacher card (a name in mod/ or a path)",
              cfg.source, cfg.teacher_init);
    if (weights_read_card(cfg.teacher_init, &cfg.teacher, err, sizeof err) != 0)
      kd_fail(KD_EXIT_INPUT, "%s: &teacher init: %s", cfg.source, err);
  }
  if (!no_files) /* teacher%source = 'cache': k, selection, ... from the file */
    tcache_config_apply(&cfg);
  int status = KD_EXIT_OK;
  if (print_config)
    config_print(stdout, &cfg);
  else if (dry_run)
    status = search ? plan_search(&cfg, plan_ranks ? plan_ranks : lsize, device_bytes)
                    : train_dry_run(&cfg, plan_ranks ? plan_ranks : lsize, device_bytes, exact);
  else if (selftest)
    status = selftest_run(&cfg);
  else
    status = train_run(&cfg);
  if (!product)
    MPI_Finalize();
  else if (fflush(stdout) != 0 || ferror(stdout))
    kd_fail(KD_EXIT_IO, "writing to standard output failed");
  return status;
}
