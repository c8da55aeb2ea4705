/* main.c: command line, MPI start and stop, dispatch to the run. */
#include "kdtrain_config.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "selftest.h"
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
    status = selftest_run(&cfg);
  } else {
    status = dry_run ? train_dry_run(&cfg) : train_run(&cfg);
  }
  MPI_Finalize();
  return status;
}
