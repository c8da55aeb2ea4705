/* test_config.c: the namelist reader (every value spelling, comments, &end, repeat
 * counts, case), command-line overrides, defaults, model card search, the print ->
 * load round trip and the messages of bad input. */
#include <check.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_run.h"
#include "config.h"
#include "util.h"

static char dir[256], err[4096];
static struct kd_config cfg;

/* Write `text` to dir/name and return the path (static buffer). */
static const char *put(const char *name, const char *text) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
  return path;
}

/* Load `text` with the cards and data given on the command line, plus `extra` words. */
static int load(const char *text, int nextra, const char **extra) {
  static char train[600];
  char *words[16] = {"teacher%card=test-teacher", "student%card='test-student'", train};
  snprintf(train, sizeof train, "data%%train=%s/train.bin", dir);
  for (int i = 0; i < nextra; i++)
    words[3 + i] = (char *)extra[i];
  return config_load(&cfg, put("in.nml", text), 3 + nextra, words, err, sizeof err);
}

/* Bad `text` must give KD_EXIT_INPUT and a message holding every word of `want`. */
static void bad(const char *text, const char *want[]) {
  ck_assert_int_eq(load(text, 0, NULL), KD_EXIT_INPUT);
  for (int i = 0; want[i]; i++)
    ck_assert_msg(strstr(err, want[i]), "message '%s' lacks '%s' (input: %s)", err, want[i], text);
}
#define BAD(text, ...) bad(text, (const char *[]){__VA_ARGS__, NULL})

/* cfg printed by config_print reads back (config_load) to the identical struct. */
static void print_reads_back(void) {
  struct kd_config first = cfg;
  char path[512];
  snprintf(path, sizeof path, "%s/printed.nml", dir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  config_print(f, &cfg);
  fclose(f);
  memset(&cfg, 0x5a, sizeof cfg);
  ck_assert_msg(config_load(&cfg, path, 0, NULL, err, sizeof err) == 0, "%s", err);
  memset(first.source, 0, sizeof first.source), memset(cfg.source, 0, sizeof cfg.source);
  ck_assert_int_eq(memcmp(&first, &cfg, sizeof cfg), 0);
}

START_TEST(test_defaults) {
  config_defaults(&cfg);
  ck_assert_int_eq(cfg.run_mode, KD_MODE_DISTILL);
  ck_assert_int_eq(cfg.run_steps, 100);
  ck_assert_int_eq(cfg.run_seed, 1234);
  ck_assert_str_eq(cfg.run_out_dir, "out");
  ck_assert_str_eq(cfg.student_init, "random");
  ck_assert_int_eq(cfg.par_global_batch, 8);
  ck_assert_int_eq(cfg.data_seq_len, 256);
  ck_assert(cfg.loss_beta == 0.5 && cfg.loss_t2_scale == 1);
  ck_assert(cfg.optim_lr == 3e-4 && cfg.optim_min_lr == 3e-5 && cfg.optim_eps == 1e-8);
  ck_assert_int_eq(cfg.prec_compute, KD_PREC_BF16);
  ck_assert_int_eq(cfg.mem_offload, 0);
  ck_assert_int_eq(cfg.ckpt_keep, 3);
  ck_assert_str_eq(cfg.ckpt_resume, "auto");
  ck_assert_int_eq(cfg.log_level, KD_LOG_INFO);
  /* an empty file plus the required keys: defaults pass validation, paths are resolved */
  ck_assert_msg(load("", 0, NULL) == 0, "%s", err);
  char cwd[256], want[600];
  ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
  snprintf(want, sizeof want, "%s/out/checkpoints", cwd);
  ck_assert_str_eq(cfg.ckpt_dir, want);
  snprintf(want, sizeof want, "%s/out/metrics.csv", cwd);
  ck_assert_str_eq(cfg.log_metrics, want);
  ck_assert_int_eq(cfg.student.hidden_size, 16);
  ck_assert_int_eq(cfg.teacher.num_attention_heads, 4);
}
END_TEST

START_TEST(test_values) {
  const char *reals[][2] = {{"1e-3", "0.001"}, {"1.0d-3", "0.001"}, {"1.D0", "1"},
                            {".5", "0.5"},     {"1.5E+00", "1.5"},  {"2.", "2"},
                            {"+3", "3"},       {"1*0.25", "0.25"},  {"5.0Q-1", "0.5"}};
  char text[128];
  for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
    snprintf(text, sizeof text, "&loss temperature = %s /\n", reals[i][0]);
    ck_assert_msg(load(text, 0, NULL) == 0, "%s: %s", reals[i][0], err);
    ck_assert_msg(cfg.loss_temperature == strtod(reals[i][1], NULL), "%s", reals[i][0]);
  }
  const char *logicals[][2] = {{"T", "1"},      {"F", "0"},       {".t.", "1"},  {".f.", "0"},
                               {".TRUE.", "1"}, {".false.", "0"}, {"true", "1"}, {"f", "0"}};
  for (size_t i = 0; i < sizeof logicals / sizeof logicals[0]; i++) {
    snprintf(text, sizeof text, "&memory offload = %s /\n", logicals[i][0]);
    ck_assert_msg(load(text, 0, NULL) == 0, "%s: %s", logicals[i][0], err);
    ck_assert_int_eq(cfg.mem_offload, atoi(logicals[i][1]));
  }
  /* strings: both quotes, doubled quotes, case of choices, several pairs per line,
   * comments, commas/blanks/newlines as separators, &end, upper case names */
  ck_assert_msg(load("! leading comment\n"
                     "&RUN Mode = 'TRAIN', steps=7 seed= 3 ! trailing comment\n"
                     "  out_dir = \"o\"\"u'\"   /\n"
                     "&Loss kind='jsd', alpha = 0.25, temperature = , ! null: unchanged\n"
                     "   beta = 0.75, /\n"
                     "&optim lr = 2e-4 min_lr = 0.0 &end\n"
                     "&log metrics = 'a''b.csv' /\n",
                     0, NULL) == 0,
                "%s", err);
  ck_assert_int_eq(cfg.run_mode, KD_MODE_TRAIN);
  ck_assert_int_eq(cfg.run_steps, 7);
  ck_assert_int_eq(cfg.run_seed, 3);
  ck_assert_ptr_nonnull(strstr(cfg.run_out_dir, "/o\"u'"));
  ck_assert_ptr_nonnull(strstr(cfg.log_metrics, "/a'b.csv"));
  ck_assert_int_eq(cfg.loss_kind, LOSS_JSD);
  ck_assert(cfg.loss_alpha == 0.25 && cfg.loss_beta == 0.75 && cfg.optim_lr == 2e-4);
  ck_assert(cfg.loss_temperature == 1.0);
  ck_assert_str_eq(cfg.teacher.name, ""); /* mode 'train': no teacher card is read */
}
END_TEST

START_TEST(test_overrides) {
  const char *w[] = {"optim%lr=1e-4",    "parallel%tp=2", "loss%kind='rkl'",
                     "log%level=debug",  "Run%Steps=5",   "memory%tiled_mlp=.true.",
                     "run%out_dir=x/y z"};
  ck_assert_msg(load("&optim lr = 1e-3 /\n&loss kind = 'jsd' /\n", 7, w) == 0, "%s", err);
  ck_assert(cfg.optim_lr == 1e-4);
  ck_assert_int_eq(cfg.par_tp, 2);
  ck_assert_int_eq(cfg.loss_kind, LOSS_RKL);
  ck_assert_int_eq(cfg.log_level, KD_LOG_DEBUG);
  ck_assert_int_eq(cfg.run_steps, 5);
  ck_assert_int_eq(cfg.mem_tiled_mlp, 1);
  ck_assert_ptr_nonnull(strstr(cfg.run_out_dir, "/x/y z"));
  const char *b1[] = {"optm%lr=1"}, *b2[] = {"optim%lr=abc"}, *b3[] = {"loss%kind=fkx"};
  ck_assert_int_eq(load("", 1, b1), KD_EXIT_INPUT);
  ck_assert_ptr_nonnull(strstr(err, "command line 'optm%lr=1'"));
  ck_assert_ptr_nonnull(strstr(err, "did you mean '&optim'"));
  ck_assert_int_eq(load("", 1, b2), KD_EXIT_INPUT);
  ck_assert_ptr_nonnull(strstr(err, "&optim lr: 'abc' is not a number"));
  ck_assert_int_eq(load("", 1, b3), KD_EXIT_INPUT);
  ck_assert_ptr_nonnull(strstr(err, "did you mean 'fkl'"));
}
END_TEST

START_TEST(test_cards) {
  struct kd_card card;
  char path[600], cwd[256];
  ck_assert_msg(config_load_card(&card, "qwen2.5-0.5b", NULL, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(card.vocab_size, 151936);
  ck_assert_int_eq(card.hidden_size, 896);
  ck_assert_int_eq(card.num_key_value_heads, 2);
  ck_assert(card.rope_theta == 1e6 && card.rms_norm_eps == 1e-6);
  ck_assert(card.tie_word_embeddings && card.attention_bias);
  ck_assert_int_eq(card.max_position_embeddings, 32768);
  ck_assert_msg(config_load_card(&card, "qwen2.5-1.5b", NULL, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(card.intermediate_size, 8960);
  /* KDTRAIN_MOD_PATH comes first; arch-dependent attention_bias default; a path */
  put("test-student.nml", "&model arch='llama' vocab_size=8 hidden_size=8 intermediate_size=4\n"
                          "num_hidden_layers=1 num_attention_heads=2 num_key_value_heads=1 /\n");
  setenv("KDTRAIN_MOD_PATH", dir, 1);
  ck_assert_msg(config_load_card(&card, "test-student", NULL, err, sizeof err) == 0, "%s", err);
  unsetenv("KDTRAIN_MOD_PATH");
  ck_assert_int_eq(card.vocab_size, 8);
  ck_assert_int_eq(card.attention_bias, 0);
  ck_assert(card.rope_theta == 10000.0);
  ck_assert_int_eq(card.max_position_embeddings, 4096);
  snprintf(path, sizeof path, "%s/test-student.nml", dir);
  ck_assert_str_eq(card.path, path);
  ck_assert_int_eq(config_load_card(&card, path, NULL, err, sizeof err), 0);
  ck_assert_int_eq(card.arch, KD_ARCH_LLAMA);
  /* next to the input file, by a relative path */
  snprintf(path, sizeof path, "%s/in.nml", dir);
  ck_assert_int_eq(config_load_card(&card, "./test-student.nml", path, err, sizeof err), 0);
  ck_assert_int_eq(card.vocab_size, 8);
  ck_assert_int_eq(config_load_card(&card, "test-student", NULL, err, sizeof err), 0);
  ck_assert_int_eq(card.vocab_size, 256); /* the repository's card again */
  ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
  ck_assert_int_eq(config_load_card(&card, "qwen2.5-05b", NULL, err, sizeof err), KD_EXIT_INPUT);
  ck_assert_ptr_nonnull(strstr(err, "did you mean 'qwen2.5-0.5b'"));
  ck_assert_ptr_nonnull(strstr(err, KD_SRC_MODDIR));
  /* card_print reads back to the same card */
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  card_print(f, &card);
  fclose(f);
  struct kd_card again;
  ck_assert_msg(config_load_card(&again, path, NULL, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(again.hidden_size, card.hidden_size);
  memset(again.path, 0, sizeof again.path), memset(card.path, 0, sizeof card.path);
  memset(again.name, 0, sizeof again.name), memset(card.name, 0, sizeof card.name);
  ck_assert_int_eq(memcmp(&again, &card, sizeof card), 0);
}
END_TEST

/* The RoPE scaling keys of a card: read, printed back, and the rules not computed refused
 * naming rope_type. */
START_TEST(test_rope_cards) {
  const char *shape = "&model arch='llama' vocab_size=8 hidden_size=8 intermediate_size=4\n"
                      "num_hidden_layers=1 num_attention_heads=2 num_key_value_heads=1\n";
  char text[600], path[600];
  struct kd_card card, again;
  snprintf(text, sizeof text,
           "%srope_theta=5e5 rope_type='llama3' factor=32.0 low_freq_factor=1.0\n"
           "high_freq_factor=4.0 original_max_position_embeddings=8192 /\n",
           shape);
  ck_assert_msg(config_load_card(&card, put("l3.nml", text), NULL, err, sizeof err) == 0, "%s",
                err);
  ck_assert(card.rope_type == KD_ROPE_LLAMA3 && card.factor == 32.0);
  ck_assert(card.high_freq_factor == 4.0 && card.original_max_position_embeddings == 8192);
  ck_assert(card.beta_fast == 32.0 && card.truncate == 1 && card.attention_factor == 0.0);
  snprintf(path, sizeof path, "%s/l3-printed.nml", dir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  card_print(f, &card);
  fclose(f);
  ck_assert_msg(config_load_card(&again, path, NULL, err, sizeof err) == 0, "%s", err);
  memset(again.path, 0, sizeof again.path), memset(card.path, 0, sizeof card.path);
  memset(again.name, 0, sizeof again.name), memset(card.name, 0, sizeof card.name);
  ck_assert_int_eq(memcmp(&again, &card, sizeof card), 0);
  const char *bad[][2] = {
      {"rope_type='dynamic' factor=2.0", "'dynamic' is not computed"},
      {"rope_type='longrope'", "'longrope' is not computed"},
      {"rope_type='su'", "expected one of"},
      {"rope_type='llama3' low_freq_factor=4.0", "high_freq_factor"},
      {"rope_type='yarn' factor=0", "factor"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    snprintf(text, sizeof text, "%s%s /\n", shape, bad[k][0]);
    ck_assert_int_eq(config_load_card(&card, put("bad.nml", text), NULL, err, sizeof err),
                     KD_EXIT_INPUT);
    ck_assert_msg(strstr(err, bad[k][1]), "%s: '%s' lacks '%s'", bad[k][0], err, bad[k][1]);
    ck_assert_msg(k == 3 || k == 4 || strstr(err, "rope_type"), "%s: '%s' does not name the key",
                  bad[k][0], err);
  }
}
END_TEST

/* The sliding-window keys of a card: transformers 5's rules (Qwen2/Qwen3: use_sliding_window
 * and max_window_layers, or layer_types; llama / Mistral: every layer), printed back (runs of a
 * layer type as r*'word'), and the inconsistent ones refused naming the key. */
START_TEST(test_window_cards) {
  const char *shape = "&model vocab_size=8 hidden_size=8 intermediate_size=4\n"
                      "num_attention_heads=2 num_key_value_heads=1\n";
  char text[1200], path[600];
  struct kd_card card, again;
  snprintf(text, sizeof text,
           "%sarch='qwen2' num_hidden_layers=20 use_sliding_window=.true. sliding_window=7\n"
           "max_window_layers=13 /\n",
           shape);
  ck_assert_msg(config_load_card(&card, put("q2.nml", text), NULL, err, sizeof err) == 0, "%s",
                err);
  for (int l = 0; l < 20; l++)
    ck_assert_int_eq(card_layer_window(&card, l), l >= 13 ? 7 : 0);
  card.use_sliding_window = 0; /* the window is off without the switch (qwen) */
  ck_assert_int_eq(card_layer_window(&card, 19), 0);
  snprintf(text, sizeof text,
           "%sarch='qwen3' num_hidden_layers=20 use_sliding_window=.true. sliding_window=3\n"
           "layer_types = 2*'sliding_attention', 'full_attention', 16*'sliding_attention',\n"
           "  'full_attention' /\n",
           shape);
  ck_assert_msg(config_load_card(&card, put("q3.nml", text), NULL, err, sizeof err) == 0, "%s",
                err);
  ck_assert_int_eq(card.n_layer_types, 20);
  for (int l = 0; l < 20; l++)
    ck_assert_int_eq(card_layer_window(&card, l), l == 2 || l == 19 ? 0 : 3);
  snprintf(path, sizeof path, "%s/q3-printed.nml", dir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  card_print(f, &card);
  fclose(f);
  ck_assert_msg(config_load_card(&again, path, NULL, err, sizeof err) == 0, "%s", err);
  memset(again.path, 0, sizeof again.path), memset(card.path, 0, sizeof card.path);
  memset(again.name, 0, sizeof again.name), memset(card.name, 0, sizeof card.name);
  ck_assert_int_eq(memcmp(&again, &card, sizeof card), 0);
  snprintf(text, sizeof text, "%sarch='llama' num_hidden_layers=3 sliding_window=5 /\n", shape);
  ck_assert_msg(config_load_card(&card, put("mi.nml", text), NULL, err, sizeof err) == 0, "%s",
                err);
  for (int l = 0; l < 3; l++)
    ck_assert_int_eq(card_layer_window(&card, l), 5);
  snprintf(text, sizeof text, "%sarch='qwen2' num_hidden_layers=3 /\n", shape);
  ck_assert_int_eq(config_load_card(&card, put("none.nml", text), NULL, err, sizeof err), 0);
  ck_assert(card.max_window_layers == 28 && card.n_layer_types == 0);
  for (int l = 0; l < 3; l++)
    ck_assert_int_eq(card_layer_window(&card, l), 0);
  const char *bad[][3] = {
      {"arch='qwen2' use_sliding_window=.true. sliding_window=4 "
       "layer_types='full_attention','sliding_attention'",
       "layer_types", "2 values for num_hidden_layers = 3"},
      {"arch='qwen2' layer_types=3*'chunked_attention'", "layer_types", "expected one of"},
      {"arch='llama' sliding_window=0", "sliding_window", "expected at least 1"},
      {"arch='llama' sliding_window=-2", "sliding_window", "out of range"},
      {"arch='qwen2' use_sliding_window=.true.", "use_sliding_window", "without a window"},
      {"arch='llama' use_sliding_window=.true. sliding_window=4", "use_sliding_window",
       "qwen2 and qwen3"},
      {"arch='qwen3' sliding_window=4 layer_types=3*'sliding_attention'", "layer_types",
       "layer 0 is 'sliding_attention' but the card has no window"},
      {"arch='qwen2' layer_types=1025*'full_attention'", "layer_types", "at most 512"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    snprintf(text, sizeof text, "%snum_hidden_layers=3 %s /\n", shape, bad[k][0]);
    ck_assert_int_eq(config_load_card(&card, put("bad.nml", text), NULL, err, sizeof err),
                     KD_EXIT_INPUT);
    ck_assert_msg(strstr(err, bad[k][1]) && strstr(err, bad[k][2]), "%s: '%s' lacks '%s' or '%s'",
                  bad[k][0], err, bad[k][1], bad[k][2]);
  }
}
END_TEST

START_TEST(test_round_trip) {
  const char *w[] = {"optim%lr=0.1", "loss%temperature=3.3333333333333335"};
  ck_assert_msg(load("&run steps = 12345678901, seed = 0 /\n"
                     "&optim weight_decay = 0.3, beta1 = 0.8999999999999999, eps = 1.D-12 /\n"
                     "&data format = 'u16', valid_batches = 3, seq_len = 200 /\n"
                     "&checkpoint every = 5, keep = 0, resume = 'none' on_signal = F /\n"
                     "&log metrics = 'a ''quoted'' \"name\"' /\n"
                     "&precision loss_scale = 0 compute = 'fp32' /\n",
                     2, w) == 0,
                "%s", err);
  print_reads_back();
  ck_assert(cfg.optim_beta1 == 0.8999999999999999 && cfg.run_steps == 12345678901LL);
}
END_TEST

START_TEST(test_bad) {
  BAD("&optm lr = 1 /\n", "in.nml:1:", "unknown group '&optm'", "did you mean '&optim'");
  BAD("\n&optim lrr = 1 /\n", "in.nml:2:", "&optim: unknown key 'lrr'", "did you mean 'lr'");
  BAD("&loss lr = 1 /\n", "belongs to &optim");
  BAD("&run steps = 1.5 /\n", "&run steps", "not an integer");
  BAD("&run steps = '5' /\n", "&run steps", "got the string");
  BAD("&optim lr = 1.0e /\n", "&optim lr", "not a number");
  BAD("&memory offload = yes /\n", "&memory offload", "not a logical");
  BAD("&optim lr = -1e-3 /\n", "out of range", "lr >= 0");
  BAD("&loss temperature = 0 /\n", "temperature > 0");
  BAD("&loss alpha = 1.0000001 /\n", "0 <= alpha <= 1");
  BAD("&loss beta = 0 /\n", "0 < beta < 1");
  BAD("&data seq_len = 0 /\n", "&data seq_len", "seq_len >= 1");
  BAD("&parallel tp = 0 /\n", "&parallel tp", "tp >= 1");
  BAD("&parallel zero = 2 /\n", "0 <= zero <= 1");
  BAD("&parallel pp = 3000000000 /\n", "&parallel pp", "out of range");
  BAD("&loss kind = 'fkx' /\n", "'fkx' is not allowed", "did you mean 'fkl'");
  BAD("&run out_dir = 'abc /\n", "in.nml:1:", "unterminated string");
  BAD("&run\n steps = 3\n", "in.nml:1:", "&run: group not closed");
  BAD("&run /\n&run /\n", "in.nml:2:", "twice (first at line 1)");
  BAD("&run steps = 1\n steps = 2 /\n", "in.nml:2:", "&run steps: given twice");
  BAD("&loss alpha = 3*0.5 /\n", "3 values given");
  BAD("&loss alpha = 0*0.5 /\n", "repeat count");
  BAD("&loss alpha = /\n", "no value");
  BAD("&run device = cpu /\n", "not quoted");
  BAD("&parallel micro_batch = 3 /\n", "&parallel global_batch", "micro_batch = 3");
  BAD("&parallel dp = 3 /\n", "micro_batch * dp");
  BAD("&parallel ep = 0 /\n", "&parallel ep", "ep >= 1");
  BAD("&parallel dp = 2, ep = 3 /\n", "in.nml:1:", "&parallel ep",
      "3 does not divide the data-parallel size dp = 2", "expected a divisor of dp");
  BAD("&parallel\n ep = 2 /\n", "in.nml:2:", "&parallel ep",
      "ep = 2 needs a mixture-of-experts card", "'test-student'", "'test-teacher'");
  /* dp from the ranks (the layout check): ep must divide it too */
  ck_assert_int_eq(load("&run seed = 1 /\n", 0, NULL), 0);
  cfg.par_ep = 3;
  ck_assert_int_eq(config_check_ep(&cfg, 4, err, sizeof err), KD_EXIT_INPUT);
  ck_assert_msg(strstr(err, "&parallel ep: 3 does not divide the data-parallel size dp = 4 (dp = "
                            "ranks / (tp * pp))"),
                "%s", err);
  cfg.par_ep = 1;
  ck_assert_int_eq(config_check_ep(&cfg, 3, err, sizeof err), 0);
  BAD("&optim min_lr = 1e-3 /\n", "&optim min_lr", "min_lr <= lr");
  BAD("&data seq_len = 257 /\n", "max_position_embeddings = 256");
  BAD("&data valid = 'missing.bin' /\n", "&data valid", "not found");
  BAD("&student init = 'nope.h5' /\n", "&student init", "not found");
  BAD("&run mode = 'eval' /\n", "&data valid", "missing");
  const char *nt[] = {"teacher%card="};
  ck_assert_int_eq(load("&run mode='distill' /\n", 1, nt), KD_EXIT_INPUT);
  ck_assert_ptr_nonnull(strstr(err, "&teacher card: missing"));
  ck_assert_int_eq(config_load(&cfg, "/nonexistent/x.nml", 0, NULL, err, sizeof err),
                   KD_EXIT_INPUT);
  ck_assert_ptr_nonnull(strstr(err, "/nonexistent/x.nml: cannot read"));
}
END_TEST

/* Load `text` alone (no data%train word), from dir. */
static int load_plain(const char *text, int nextra, const char **extra) {
  char *words[16] = {"teacher%card=test-teacher", "student%card='test-student'"};
  for (int i = 0; i < nextra; i++)
    words[2 + i] = (char *)extra[i];
  return config_load(&cfg, put("in.nml", text), 2 + nextra, words, err, sizeof err);
}

START_TEST(test_lists) {
  char text[2048], a[600], b[600];
  snprintf(a, sizeof a, "%s/train.bin", dir);
  snprintf(b, sizeof b, "%s/second.bin", dir);
  put("second.bin", "more bytes\n");
  put("mg.bin", "megatron tokens\n"); /* a Megatron prefix: mg.bin exists, mg does not */
  /* a blend in the file: strings and reals, a repeat count, continuation lines */
  snprintf(text, sizeof text, "&data train = '%s',\n  '%s', '%s' weights = 0.5, 2*0.25 /\n", a, b,
           a);
  ck_assert_msg(load_plain(text, 0, NULL) == 0, "%s", err);
  ck_assert_int_eq(cfg.data_ntrain, 3);
  ck_assert_str_eq(cfg.data_train[1], b);
  ck_assert_int_eq(cfg.data_nweights, 3);
  ck_assert(cfg.data_weights[0] == 0.5 && cfg.data_weights[1] == 0.25 &&
            cfg.data_weights[2] == 0.25);
  /* no weights: equal weights, one per file */
  snprintf(text, sizeof text, "&data train = '%s', '%s' /\n", a, b);
  ck_assert_msg(load_plain(text, 0, NULL) == 0, "%s", err);
  ck_assert_int_eq(cfg.data_nweights, 2);
  ck_assert(cfg.data_weights[0] == 1.0 && cfg.data_weights[1] == 1.0);
  /* one file: one weight; relative paths resolved from the current directory */
  const char *rel[] = {"data%train=train.bin"};
  char cwd[512];
  ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
  ck_assert_int_eq(chdir(dir), 0);
  int rc = load_plain("", 1, rel);
  ck_assert_int_eq(chdir(cwd), 0);
  ck_assert_msg(rc == 0, "%s", err);
  ck_assert_int_eq(cfg.data_ntrain, 1);
  ck_assert_str_eq(cfg.data_train[0], a);
  ck_assert_int_eq(cfg.data_nweights, 1);
  /* command-line lists replace the file's */
  char w1[1300];
  snprintf(w1, sizeof w1, "data%%train='%s','%s'", b, a);
  const char *cl[] = {w1, "data%weights=3.0,1"};
  snprintf(text, sizeof text, "&data train = '%s' /\n", a);
  ck_assert_msg(load_plain(text, 2, cl) == 0, "%s", err);
  ck_assert_int_eq(cfg.data_ntrain, 2);
  ck_assert_str_eq(cfg.data_train[0], b);
  ck_assert(cfg.data_weights[0] == 3.0 && cfg.data_weights[1] == 1.0);
  /* the blend prints and reads back identically */
  print_reads_back();
  /* a Megatron dataset named by its prefix */
  snprintf(text, sizeof text, "&data train = '%s/mg', format = 'megatron' /\n", dir);
  ck_assert_msg(load_plain(text, 0, NULL) == 0, "%s", err);
  snprintf(text, sizeof text, "&data train = '%s/mg', format = 'u16' /\n", dir);
  ck_assert_int_eq(load_plain(text, 0, NULL), KD_EXIT_INPUT);
  ck_assert_ptr_nonnull(strstr(err, "not found"));
  /* bad lists */
  snprintf(text, sizeof text, "&data train = '%s', '%s' weights = 1.0 /\n", a, b);
  ck_assert_int_eq(load_plain(text, 0, NULL), KD_EXIT_INPUT);
  ck_assert_msg(strstr(err, "in.nml:1: &data weights: 1 weights for 2 train files"), "%s", err);
  snprintf(text, sizeof text, "&data train = 17*'%s' /\n", a);
  ck_assert_int_eq(load_plain(text, 0, NULL), KD_EXIT_INPUT);
  ck_assert_msg(strstr(err, "&data train: 17 values given; expected at most 16"), "%s", err);
  snprintf(text, sizeof text, "&data train = '%s', '%s' weights = 1.0, 0 /\n", a, b);
  ck_assert_int_eq(load_plain(text, 0, NULL), KD_EXIT_INPUT);
  ck_assert_msg(strstr(err, "&data weights: 0 is out of range; expected weights > 0"), "%s", err);
  snprintf(text, sizeof text, "&data train = '%s', '%s/nope.bin' /\n", a, dir);
  ck_assert_int_eq(load_plain(text, 0, NULL), KD_EXIT_INPUT);
  ck_assert_msg(strstr(err, "nope.bin' not found"), "%s", err);
  snprintf(text, sizeof text, "&data train = '%s', '' /\n", a);
  ck_assert_int_eq(load_plain(text, 0, NULL), KD_EXIT_INPUT);
  ck_assert_msg(strstr(err, "value 2 is empty"), "%s", err);
}
END_TEST

/* The one list of card keys (card_keys.h): the /config positions are each number once, the
 * namelist table is the list (but the name), and card_key_present decides what a card prints
 * by each key's rule (the card text holds exactly the present keys). */
START_TEST(test_card_keys) {
  int seen[KD_CARD_NKEYS] = {0};
  for (int p = 0; p < KD_CARD_NKEYS; p++) {
    const int i = kd_card_file_order[p];
    ck_assert_int_lt(i, KD_CARD_NKEYS);
    ck_assert_int_eq(seen[i]++, 0);
    ck_assert_int_eq(kd_card_keys[i].pos, p);
  }
  ck_assert_str_eq(kd_card_keys[kd_card_file_order[0]].name, "name");
  ck_assert_str_eq(kd_card_keys[kd_card_file_order[1]].name, "arch");
  for (int i = 0; i < KD_CARD_NKEYS; i++)
    ck_assert_ptr_eq(card_key_named(kd_card_keys[i].name), &kd_card_keys[i]);
  ck_assert_ptr_null(card_key_named("num_local_experts"));
  /* what each rule holds, on a qwen2 card */
  struct kd_card c;
  ck_assert_msg(config_load_card(&c, "test-student", NULL, err, sizeof err) == 0, "%s", err);
#define HAS(key) card_key_present(card_key_named(key), &c)
  ck_assert(HAS("name") && HAS("arch") && HAS("vocab_size") && HAS("attention_bias"));
  ck_assert(!HAS("head_dim") && !HAS("sliding_window") && !HAS("pad_token_id"));
  ck_assert(!HAS("layer_types") && !HAS("rope_type") && !HAS("truncate"));
  ck_assert(!HAS("query_pre_attn_scalar") && !HAS("num_experts") && !HAS("mlp_only_layers"));
  ck_assert(!HAS("no_rope_layers") && !HAS("no_rope_layer_interval"));
  c.head_dim = 8, c.max_window_layers = 3, c.rope_type = KD_ROPE_LINEAR;
  ck_assert(HAS("head_dim") && HAS("max_window_layers") && !HAS("use_sliding_window"));
  ck_assert(HAS("rope_type") && HAS("factor") && HAS("mscale_all_dim") && HAS("truncate"));
  c.n_layer_types = 3, c.n_no_rope_layers = 3;
  ck_assert(HAS("layer_types") && !HAS("no_rope_layers"));
  /* a mixture of experts: every MoE key, mlp_only_layers only with values */
  ck_assert_msg(config_load_card(&c, "test-moe-student", NULL, err, sizeof err) == 0, "%s", err);
  ck_assert(HAS("num_experts") && HAS("decoder_sparse_step") && HAS("mlp_only_layers"));
  ck_assert(!HAS("hidden_activation"));
  c.n_mlp_only_layers = 0;
  ck_assert(HAS("router_aux_loss_coef") && !HAS("mlp_only_layers"));
  /* Gemma 3: its keys at their defaults too */
  ck_assert_msg(config_load_card(&c, "test-gemma3-student", NULL, err, sizeof err) == 0, "%s", err);
  ck_assert(HAS("hidden_activation") && HAS("attn_logit_softcapping") && !HAS("num_experts"));
#undef HAS
  /* the card text: a line for each present key of the namelist, none for the others */
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  ck_assert_ptr_nonnull(f);
  card_print(f, &c);
  fclose(f);
  for (int i = 0; i < KD_CARD_NKEYS; i++) {
    const struct kd_card_key *k = &kd_card_keys[i];
    char line[96];
    snprintf(line, sizeof line, "\n  %s = ", k->name);
    const int want = k->type != KD_CARD_STR && card_key_present(k, &c);
    ck_assert_msg(!strstr(text, line) == !want, "%s: printed %d, present %d", k->name,
                  strstr(text, line) != NULL, want);
  }
  free(text);
}
END_TEST

/* transformers' SmolLM3Config: no_rope_layers = [int((i + 1) % interval != 0) for i in
 * range(num_hidden_layers)] when the list is not given. */
static int smollm3_rope(int layer, int interval) {
  return (layer + 1) % interval != 0;
}

/* Layers without RoPE: SmolLM3's rule (card_nope_rule) for a family with the NoPE keys, RoPE
 * in every layer of the others; the keys refused on a card of a family without them, and a
 * list of another length than the layers refused. */
START_TEST(test_nope_layers) {
  struct kd_card c;
  ck_assert_msg(config_load_card(&c, "test-student", NULL, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(c.no_rope_layer_interval, 4); /* SmolLM3Config's default */
  ck_assert_int_eq(c.n_no_rope_layers, 0);
  c.num_hidden_layers = 12;
  for (int interval = 1; interval <= 5; interval++) {
    c.no_rope_layer_interval = interval;
    for (int l = 0; l < c.num_hidden_layers; l++)
      ck_assert_int_eq(card_nope_rule(&c, l), smollm3_rope(l, interval));
  }
  c.no_rope_layer_interval = 4;
  ck_assert_int_eq(card_nope_rule(&c, 3), 0);
  ck_assert(card_nope_rule(&c, -1) && card_nope_rule(&c, 12) && card_nope_rule(&c, 15));
  /* the list, when given, whatever the interval says */
  const int list[12] = {0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0};
  memcpy(c.no_rope_layers, list, sizeof list);
  c.n_no_rope_layers = 12;
  for (int l = 0; l < 12; l++)
    ck_assert_int_eq(card_nope_rule(&c, l), list[l]);
  /* every family: RoPE in every layer without the trait, SmolLM3's rule with it */
  for (int a = 0; a < KD_ARCH_N; a++) {
    c.arch = (enum kd_arch)a;
    for (int l = 0; l < 12; l++)
      ck_assert_int_eq(card_layer_rope(&c, l),
                       kd_arch_traits[a].nope_keys ? card_nope_rule(&c, l) : 1);
  }
  char why[512];
  c.arch = KD_ARCH_QWEN2, c.n_no_rope_layers = 11;
  ck_assert_str_eq(card_check(&c, why, sizeof why), "no_rope_layers");
  ck_assert_msg(strstr(why, "11 values for num_hidden_layers = 12"), "%s", why);
  c.n_no_rope_layers = 12, c.no_rope_layers[5] = 2;
  ck_assert_str_eq(card_check(&c, why, sizeof why), "no_rope_layers");
  /* given on a card of a family without the keys: refused, as the MoE keys are */
  const char *shape = "&model arch='qwen2' vocab_size=8 hidden_size=8 intermediate_size=4\n"
                      "num_hidden_layers=2 num_attention_heads=2 num_key_value_heads=1\n";
  const char *given[] = {"no_rope_layers = 1, 0", "no_rope_layer_interval = 2"};
  for (int k = 0; k < 2; k++) {
    char text[600];
    snprintf(text, sizeof text, "%s%s /\n", shape, given[k]);
    ck_assert_int_eq(config_load_card(&c, put("nope.nml", text), NULL, err, sizeof err),
                     KD_EXIT_INPUT);
    ck_assert_msg(strstr(err, "a NoPE key (layers without RoPE) on a 'qwen2' card"), "%s", err);
    ck_assert_msg(strstr(err, k ? "&model no_rope_layer_interval:" : "&model no_rope_layers:"),
                  "%s", err);
  }
}
END_TEST

static Suite *config_suite(void) {
  Suite *s = suite_create("config");
  TCase *tc = tcase_create("config");
  tcase_add_test(tc, test_defaults);
  tcase_add_test(tc, test_values);
  tcase_add_test(tc, test_overrides);
  tcase_add_test(tc, test_cards);
  tcase_add_test(tc, test_rope_cards);
  tcase_add_test(tc, test_window_cards);
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_bad);
  tcase_add_test(tc, test_lists);
  tcase_add_test(tc, test_card_keys);
  tcase_add_test(tc, test_nope_layers);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  snprintf(dir, sizeof dir, "%s/kdconfig.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  char train[300];
  snprintf(train, sizeof train, "%s/train.bin", dir);
  FILE *f = fopen(train, "w");
  if (!f || fputs("some bytes\n", f) < 0 || fclose(f)) return perror(train), 1;
  int failed = check_run(config_suite());
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  MPI_Finalize();
  return failed ? 1 : 0;
}
