/* words.h: every word-valued configuration key as an enum, beside its word list.
 * config_load turns each word into its enum once (namelist NL_WORD keys: the value
 * stored is the index of the word in the list); nothing after the parser compares
 * configuration strings. The order of a word list is the order of its enum: add a
 * word to both, at the same place. Printing uses the same list (words_name). */
#ifndef KD_WORDS_H
#define KD_WORDS_H

/* &run mode */
enum kd_run_mode { KD_MODE_DISTILL, KD_MODE_TRAIN, KD_MODE_EVAL, KD_MODE_CACHE, KD_MODE_N };
#define KD_RUN_MODE_WORDS "distill|train|eval|cache"

/* &run device */
enum kd_device { KD_DEV_AUTO, KD_DEV_CPU, KD_DEV_CUDA, KD_DEV_DEVSIM, KD_DEV_N };
#define KD_DEVICE_WORDS "auto|cpu|cuda|devsim"

/* &teacher source */
enum kd_teacher_source { KD_TEACHER_LIVE, KD_TEACHER_CACHE, KD_TEACHER_N };
#define KD_TEACHER_SOURCE_WORDS "live|cache"

/* &teacher cache_select: which teacher entries a cache keeps per position */
enum tcache_select { TCACHE_TOPK, TCACHE_SAMPLE, TCACHE_NSELECT };
#define KD_CACHE_SELECT_WORDS "topk|sample"

/* &data format: one reader per format (data_source.c's table is indexed by this enum) */
enum kd_data_format {
  KD_DATA_BYTES,
  KD_DATA_U16,
  KD_DATA_U32,
  KD_DATA_H5,
  KD_DATA_MEGATRON,
  KD_DATA_LLMC,
  KD_DATA_NFORMATS
};
#define KD_DATA_FORMAT_WORDS "bytes|u16|u32|h5|megatron|llmc"

/* &loss kind: the distillation divergence (the backends' loss ops take it too) */
enum loss_kind { LOSS_FKL, LOSS_RKL, LOSS_JSD, LOSS_NKINDS };
#define KD_LOSS_KIND_WORDS "fkl|rkl|jsd"

/* &optim decay: the learning-rate shape after warmup */
enum kd_decay { KD_DECAY_COSINE, KD_DECAY_LINEAR, KD_DECAY_CONSTANT, KD_DECAY_N };
#define KD_DECAY_WORDS "cosine|linear|constant"

/* &precision compute */
enum kd_precision { KD_PREC_BF16, KD_PREC_FP32, KD_PREC_N };
#define KD_PRECISION_WORDS "bf16|fp32"

/* &memory recompute: activation recomputation in the backward pass */
enum kd_recompute { KD_RECOMPUTE_NONE, KD_RECOMPUTE_FULL, KD_RECOMPUTE_SELECTIVE, KD_RECOMPUTE_N };
#define KD_RECOMPUTE_WORDS "none|full|selective"

/* &log level */
enum kd_log_level { KD_LOG_ERROR, KD_LOG_WARN, KD_LOG_INFO, KD_LOG_DEBUG, KD_LOG_N };
#define KD_LOG_LEVEL_WORDS "error|warn|info|debug"

/* &model arch of a model card */
enum kd_arch { KD_ARCH_QWEN2, KD_ARCH_LLAMA, KD_ARCH_N };
#define KD_ARCH_WORDS "qwen2|llama"

/* The i-th word of a '|' list `words` (as given: lists are short) into out; "" when i is
 * out of range. Returns out. */
const char *words_name(char *out, unsigned long outlen, const char *words, int i);

/* Index of `word` in the '|' list `words`, -1 when it is not there. */
int words_find(const char *words, const char *word);

#endif
