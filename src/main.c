/* main.c: command line, MPI start and stop, dispatch to the run. */
#include "kdtrain_config.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "train.h"
#include "weights.h"
#include "util.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: kdtrain [options] INPUT.nml [group%%key=value ...]\n"
          "\n"
          "Distil a teacher language model into a student (or train one) as set by the\n"
          "Fortran namelist INPUT.nml; trailing group%%key=value words override the file.\n"
          "\n"
          "options:\n"
          "  --print-config  print the complete effective configuration as a namelist, exit\n"
          "  --dry-run       print the parallel layout and the per-rank memory plan, exit\n"
          "  --selftest      compare every op of the selected backend with the CPU op\n"
          "  --version       print the version\n"
          "  --help          this text\n"
          "\n"
          "exit status: 0 done, 2 bad input, 3 I/O failure, 4 diverged, 5 stopped by a signal\n"
          "documentation: doc/user-guide.md, doc/input.md\n");
}

/* Refuse parallel layouts this build cannot run yet (tensor and pipeline parallel). */
static void check_layout(const struct kd_config *cfg) {
  int n;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (cfg->par_tp != 1 || cfg->par_pp != 1)
    kd_fail(KD_EXIT_INPUT, "%s: &parallel tp=%d pp=%d: tensor and pipeline parallelism are not "
            "available in this version; use tp=1 pp=1 (data parallel over all ranks)",
            cfg->source, cfg->par_tp, cfg->par_pp);
  const int dp = cfg->par_dp ? cfg->par_dp : n;
  if (dp != n)
    kd_fail(KD_EXIT_INPUT, "%s: &parallel dp=%d but %d MPI ranks were started (tp*pp*dp must "
            "equal the number of ranks; dp=0 takes all of them)", cfg->source, cfg->par_dp, n);
  if (cfg->par_global_batch % (dp * cfg->par_micro_batch) != 0)
    kd_fail(KD_EXIT_INPUT, "%s: &parallel global_batch=%d is not divisible by micro_batch=%d "
            "times dp=%d", cfg->source, cfg->par_global_batch, cfg->par_micro_batch, dp);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int print_config = 0, dry_run = 0, selftest = 0;
  const char *input = NULL;
  int first_override = argc;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--print-config") == 0) print_config = 1;
    else if (strcmp(a, "--dry-run") == 0) dry_run = 1;
    else if (strcmp(a, "--selftest") == 0) selftest = 1;
    else if (strcmp(a, "--version") == 0) {
      kd_info("kdtrain %s\n", PACKAGE_VERSION);
      MPI_Finalize();
      return 0;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      if (kd_rank() == 0) usage(stdout);
      MPI_Finalize();
      return 0;
    } else if (a[0] == '-') {
      if (kd_rank() == 0) {
        fprintf(stderr, "kdtrain: unknown option '%s'\n", a);
        usage(stderr);
      }
      MPI_Finalize();
      return KD_EXIT_INPUT;
    } else if (!input && !strchr(a, '%')) {
      input = a;
    } else {
      first_override = i;
      break;
    }
  }
  if (!input) {
    if (kd_rank() == 0) {
      fprintf(stderr, "kdtrain: no input file given\n");
      usage(stderr);
    }
    MPI_Finalize();
    return KD_EXIT_INPUT;
  }
  static struct kd_config cfg;
  config_load_bcast(&cfg, input, argc - first_override, argv + first_override);
  if (strcmp(cfg.run_mode, "distill") == 0 && cfg.teacher.hidden_size == 0) {
    /* &teacher gave only init: the card is the one stored in the weights file */
    char err[1024];
    if (weights_read_card(cfg.teacher_init, &cfg.teacher, err, sizeof err) != 0)
      kd_fail(KD_EXIT_INPUT, "%s: &teacher init: %s", cfg.source, err);
  }
  int status = KD_EXIT_OK;
  if (print_config) {
    if (kd_rank() == 0) config_print(stdout, &cfg);
  } else if (selftest) {
    if (kd_rank() == 0)
      fprintf(stderr, "kdtrain --selftest: this kdtrain was built without the CUDA backend "
                      "(no CUDA device to compare with the CPU backend)\n");
    status = KD_EXIT_INPUT;
  } else {
    check_layout(&cfg);
    status = dry_run ? train_dry_run(&cfg) : train_run(&cfg);
  }
  MPI_Finalize();
  return status;
}
