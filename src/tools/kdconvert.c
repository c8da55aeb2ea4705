/* kdconvert: Hugging Face model directory <-> kdtrain weights file (doc/checkpoint.md).
 *
 *   kdconvert from-hf HF_DIR OUT.h5 [CARD.nml]   config.json + *.safetensors + tokenizer
 *                                                 files -> weights file and a mod/-style
 *                                                 card (default OUT.nml)
 *   kdconvert to-hf [--max-shard-size SIZE] IN.h5 OUT_DIR
 *                                                 weights file or checkpoint -> config.json,
 *                                                 F32 safetensors (sharded above SIZE) and
 *                                                 the tokenizer files, for transformers
 *
 * Both directions stream tensor by tensor: one tensor in float32 is the most ever held.
 * The parameter table's names are the Hugging Face names, so tensors map one to one. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grid.h"
#include "tools/convert.h"
#include "util.h"

static const char usage[] =
    "usage: kdconvert from-hf HF_DIR OUT.h5 [CARD.nml]\n"
    "       kdconvert to-hf [--max-shard-size SIZE] WEIGHTS_OR_CHECKPOINT.h5 OUT_DIR\n"
    "\n"
    "from-hf  reads config.json (Qwen2, Qwen3, Llama or Mistral), the\n"
    "         safetensors weights (F32, BF16 or F16; one file or an index of shards) and the\n"
    "         tokenizer files, and writes a kdtrain weights file (float32) holding the\n"
    "         tokenizer under /tokenizer, plus its model card (default: OUT.nml).\n"
    "to-hf    writes config.json, model.safetensors (float32) or, above SIZE, shards\n"
    "         model-0000i-of-0000N.safetensors with model.safetensors.index.json, and the\n"
    "         stored tokenizer files. SIZE: bytes, or a number with KB, MB, GB (powers of\n"
    "         1000) or KiB, MiB, GiB; default 5GB as transformers' save_pretrained.\n"
    "\n"
    "Exit status: 0 done, 2 bad input (nothing written), 3 I/O failure.\n";

int main(int argc, char **argv) {
  kd_set_program("kdconvert");
  MPI_Init(&argc, &argv);
  grid_node_setup(); /* the threads: this process's share of its node's CPUs */
  int st = KD_EXIT_INPUT, size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    fputs(usage, stdout);
    st = 0;
  } else if (size != 1) {
    if (kd_rank() == 0) fprintf(stderr, "kdconvert: runs on one rank (started on %d)\n", size);
  } else if (argc >= 4 && argc <= 5 && !strcmp(argv[1], "from-hf")) {
    char card[1200];
    size_t n = strlen(argv[3]);
    if (n >= 3 && !strcmp(argv[3] + n - 3, ".h5")) n -= 3; /* OUT.h5 -> OUT.nml */
    if (argc == 5)
      snprintf(card, sizeof card, "%s", argv[4]);
    else
      snprintf(card, sizeof card, "%.*s.nml", (int)n, argv[3]);
    st = convert_from_hf(argv[2], argv[3], card);
  } else if (argc >= 4 && !strcmp(argv[1], "to-hf")) {
    int64_t limit = (int64_t)5 * 1000 * 1000 * 1000;
    int a = 2;
    if (argc == 6 && !strcmp(argv[2], "--max-shard-size")) {
      limit = convert_parse_size(argv[3]);
      if (limit <= 0)
        kd_fail(KD_EXIT_INPUT,
                "--max-shard-size '%s': expected a positive size such as 2GB, "
                "500MB, 1GiB or a byte count",
                argv[3]);
      a = 4;
    }
    if (argc == a + 2)
      st = convert_to_hf(argv[a], argv[a + 1], limit);
    else
      fputs(usage, stderr);
  } else {
    fputs(usage, stderr);
  }
  MPI_Finalize();
  return st;
}
