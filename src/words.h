/* words.h: every word-valued configuration key as an enum, with its words, written once.
 * Each list is an X-macro of (enum constant, word) pairs; from it come the enum, the '|'
 * word list the namelist reader parses (KD_..._WORDS: config_load turns each word into its
 * enum once, NL_WORD keys) and the names array used to print a value (kd_..._names). Nothing
 * after the parser compares configuration strings. */
#ifndef KD_WORDS_H
#define KD_WORDS_H

#define KD_WORD_ENUM(e, w) e,
#define KD_WORD_BAR(e, w) "|" w
/* the '|' list of an X-macro list: "|a|b|c" + 1 */
#define KD_WORDS_OF(list) (list(KD_WORD_BAR) + 1)

/* &run mode */
#define KD_RUN_MODE_LIST(X)                                                                        \
  X(KD_MODE_DISTILL, "distill")                                                                    \
  X(KD_MODE_TRAIN, "train")                                                                        \
  X(KD_MODE_EVAL, "eval")                                                                          \
  X(KD_MODE_CACHE, "cache")
enum kd_run_mode { KD_RUN_MODE_LIST(KD_WORD_ENUM) KD_MODE_N };
#define KD_RUN_MODE_WORDS KD_WORDS_OF(KD_RUN_MODE_LIST)
extern const char *const kd_run_mode_names[KD_MODE_N];

/* &run device */
#define KD_DEVICE_LIST(X)                                                                          \
  X(KD_DEV_AUTO, "auto")                                                                           \
  X(KD_DEV_CPU, "cpu")                                                                             \
  X(KD_DEV_CUDA, "cuda")                                                                           \
  X(KD_DEV_DEVSIM, "devsim")
enum kd_device { KD_DEVICE_LIST(KD_WORD_ENUM) KD_DEV_N };
#define KD_DEVICE_WORDS KD_WORDS_OF(KD_DEVICE_LIST)
extern const char *const kd_device_names[KD_DEV_N];

/* &teacher source */
#define KD_TEACHER_SOURCE_LIST(X)                                                                  \
  X(KD_TEACHER_LIVE, "live")                                                                       \
  X(KD_TEACHER_CACHE, "cache")
enum kd_teacher_source { KD_TEACHER_SOURCE_LIST(KD_WORD_ENUM) KD_TEACHER_N };
#define KD_TEACHER_SOURCE_WORDS KD_WORDS_OF(KD_TEACHER_SOURCE_LIST)
extern const char *const kd_teacher_source_names[KD_TEACHER_N];

/* &teacher cache_select: which teacher entries a cache keeps per position */
#define KD_CACHE_SELECT_LIST(X)                                                                    \
  X(TCACHE_TOPK, "topk")                                                                           \
  X(TCACHE_SAMPLE, "sample")
enum tcache_select { KD_CACHE_SELECT_LIST(KD_WORD_ENUM) TCACHE_NSELECT };
#define KD_CACHE_SELECT_WORDS KD_WORDS_OF(KD_CACHE_SELECT_LIST)
extern const char *const kd_cache_select_names[TCACHE_NSELECT];

/* &data format: one reader per format (data_source.c's table is indexed by this enum);
 * 'auto' (no reader): the format the file shows (data_source.c, data_format_detect) */
#define KD_DATA_FORMAT_LIST(X)                                                                     \
  X(KD_DATA_BYTES, "bytes")                                                                        \
  X(KD_DATA_U16, "u16")                                                                            \
  X(KD_DATA_U32, "u32")                                                                            \
  X(KD_DATA_H5, "h5")                                                                              \
  X(KD_DATA_MEGATRON, "megatron")                                                                  \
  X(KD_DATA_LLMC, "llmc")                                                                          \
  X(KD_DATA_ROLLOUTS, "rollouts")                                                                  \
  X(KD_DATA_AUTO, "auto")
enum kd_data_format { KD_DATA_FORMAT_LIST(KD_WORD_ENUM) KD_DATA_NFORMATS };
#define KD_DATA_FORMAT_WORDS KD_WORDS_OF(KD_DATA_FORMAT_LIST)
extern const char *const kd_data_format_names[KD_DATA_NFORMATS];

/* &data samples: what a sample is made of (data.c) */
#define KD_SAMPLES_LIST(X)                                                                         \
  X(KD_SAMPLES_AUTO, "auto")                                                                       \
  X(KD_SAMPLES_STREAM, "stream")                                                                   \
  X(KD_SAMPLES_DOCUMENTS, "documents")
enum kd_samples { KD_SAMPLES_LIST(KD_WORD_ENUM) KD_SAMPLES_N };
#define KD_SAMPLES_WORDS KD_WORDS_OF(KD_SAMPLES_LIST)
extern const char *const kd_samples_names[KD_SAMPLES_N];

/* &loss kind: the distillation divergence (the backends' loss ops take fkl, rkl and jsd; 'uld',
 * the cross-tokenizer distance of sorted probabilities, is computed on the host: uld.h) */
#define KD_LOSS_KIND_LIST(X)                                                                       \
  X(LOSS_FKL, "fkl")                                                                               \
  X(LOSS_RKL, "rkl")                                                                               \
  X(LOSS_JSD, "jsd")                                                                               \
  X(LOSS_ULD, "uld")
enum loss_kind { KD_LOSS_KIND_LIST(KD_WORD_ENUM) LOSS_NKINDS };
#define KD_LOSS_KIND_WORDS KD_WORDS_OF(KD_LOSS_KIND_LIST)
extern const char *const kd_loss_kind_names[LOSS_NKINDS];

/* &optim decay: the learning-rate shape after warmup */
#define KD_DECAY_LIST(X)                                                                           \
  X(KD_DECAY_COSINE, "cosine")                                                                     \
  X(KD_DECAY_LINEAR, "linear")                                                                     \
  X(KD_DECAY_CONSTANT, "constant")
enum kd_decay { KD_DECAY_LIST(KD_WORD_ENUM) KD_DECAY_N };
#define KD_DECAY_WORDS KD_WORDS_OF(KD_DECAY_LIST)
extern const char *const kd_decay_names[KD_DECAY_N];

/* &precision compute */
#define KD_PRECISION_LIST(X)                                                                       \
  X(KD_PREC_BF16, "bf16")                                                                          \
  X(KD_PREC_FP32, "fp32")
enum kd_precision { KD_PRECISION_LIST(KD_WORD_ENUM) KD_PREC_N };
#define KD_PRECISION_WORDS KD_WORDS_OF(KD_PRECISION_LIST)
extern const char *const kd_precision_names[KD_PREC_N];

/* &memory recompute: activation recomputation in the backward pass */
#define KD_RECOMPUTE_LIST(X)                                                                       \
  X(KD_RECOMPUTE_NONE, "none")                                                                     \
  X(KD_RECOMPUTE_FULL, "full")                                                                     \
  X(KD_RECOMPUTE_SELECTIVE, "selective")
enum kd_recompute { KD_RECOMPUTE_LIST(KD_WORD_ENUM) KD_RECOMPUTE_N };
#define KD_RECOMPUTE_WORDS KD_WORDS_OF(KD_RECOMPUTE_LIST)
extern const char *const kd_recompute_names[KD_RECOMPUTE_N];

/* &log level */
#define KD_LOG_LEVEL_LIST(X)                                                                       \
  X(KD_LOG_ERROR, "error")                                                                         \
  X(KD_LOG_WARN, "warn")                                                                           \
  X(KD_LOG_INFO, "info")                                                                           \
  X(KD_LOG_DEBUG, "debug")
enum kd_log_level { KD_LOG_LEVEL_LIST(KD_WORD_ENUM) KD_LOG_N };
#define KD_LOG_LEVEL_WORDS KD_WORDS_OF(KD_LOG_LEVEL_LIST)
extern const char *const kd_log_level_names[KD_LOG_N];

/* &model arch of a model card */
#define KD_ARCH_LIST(X)                                                                            \
  X(KD_ARCH_QWEN2, "qwen2")                                                                        \
  X(KD_ARCH_LLAMA, "llama")                                                                        \
  X(KD_ARCH_QWEN3, "qwen3")                                                                        \
  X(KD_ARCH_GEMMA3, "gemma3")                                                                      \
  X(KD_ARCH_QWEN3_MOE, "qwen3_moe")                                                                \
  X(KD_ARCH_MIXTRAL, "mixtral")                                                                    \
  X(KD_ARCH_OLMO2, "olmo2")                                                                        \
  X(KD_ARCH_PHI3, "phi3")                                                                          \
  X(KD_ARCH_SMOLLM3, "smollm3")
enum kd_arch { KD_ARCH_LIST(KD_WORD_ENUM) KD_ARCH_N };
#define KD_ARCH_WORDS KD_WORDS_OF(KD_ARCH_LIST)
extern const char *const kd_arch_names[KD_ARCH_N];

/* &model hidden_activation of a model card: the gated MLP's activation (silu: SwiGLU,
 * gelu_pytorch_tanh: GeGLU with the tanh approximation) */
#define KD_ACT_LIST(X)                                                                             \
  X(KD_ACT_SILU, "silu")                                                                           \
  X(KD_ACT_GELU_TANH, "gelu_pytorch_tanh")
enum kd_act { KD_ACT_LIST(KD_WORD_ENUM) KD_ACT_N };
#define KD_ACT_WORDS KD_WORDS_OF(KD_ACT_LIST)
extern const char *const kd_act_names[KD_ACT_N];

/* &model rope_type of a model card (config.json's rope_parameters / rope_scaling): the
 * rotary embedding's frequency rule; dynamic and longrope are named to be refused */
#define KD_ROPE_TYPE_LIST(X)                                                                       \
  X(KD_ROPE_DEFAULT, "default")                                                                    \
  X(KD_ROPE_LINEAR, "linear")                                                                      \
  X(KD_ROPE_LLAMA3, "llama3")                                                                      \
  X(KD_ROPE_YARN, "yarn")                                                                          \
  X(KD_ROPE_DYNAMIC, "dynamic")                                                                    \
  X(KD_ROPE_LONGROPE, "longrope")
enum kd_rope_type { KD_ROPE_TYPE_LIST(KD_WORD_ENUM) KD_ROPE_N };
#define KD_ROPE_TYPE_WORDS KD_WORDS_OF(KD_ROPE_TYPE_LIST)
extern const char *const kd_rope_type_names[KD_ROPE_N];

/* &model layer_types of a model card (config.json's attention kind of each layer) */
#define KD_LAYER_TYPE_LIST(X)                                                                      \
  X(KD_LAYER_FULL, "full_attention")                                                               \
  X(KD_LAYER_SLIDING, "sliding_attention")
enum kd_layer_type { KD_LAYER_TYPE_LIST(KD_WORD_ENUM) KD_LAYER_TYPE_N };
#define KD_LAYER_TYPE_WORDS KD_WORDS_OF(KD_LAYER_TYPE_LIST)
extern const char *const kd_layer_type_names[KD_LAYER_TYPE_N];

/* Index of `word` in the '|' list `words`, -1 when it is not there. */
int words_find(const char *words, const char *word);

/* The i-th word of the '|' list `words` into out ("" when i is out of range); returns out. */
const char *words_name(char *out, unsigned long outlen, const char *words, int i);

#endif
