/* words.c: the names arrays of words.h and lookups in its '|' word lists. */
#include "words.h"

#include <stdio.h>
#include <string.h>

#define KD_WORD_NAME(e, w) w,
const char *const kd_run_mode_names[KD_MODE_N] = {KD_RUN_MODE_LIST(KD_WORD_NAME)};
const char *const kd_device_names[KD_DEV_N] = {KD_DEVICE_LIST(KD_WORD_NAME)};
const char *const kd_teacher_source_names[KD_TEACHER_N] = {KD_TEACHER_SOURCE_LIST(KD_WORD_NAME)};
const char *const kd_cache_select_names[TCACHE_NSELECT] = {KD_CACHE_SELECT_LIST(KD_WORD_NAME)};
const char *const kd_data_format_names[KD_DATA_NFORMATS] = {KD_DATA_FORMAT_LIST(KD_WORD_NAME)};
const char *const kd_samples_names[KD_SAMPLES_N] = {KD_SAMPLES_LIST(KD_WORD_NAME)};
const char *const kd_loss_kind_names[LOSS_NKINDS] = {KD_LOSS_KIND_LIST(KD_WORD_NAME)};
const char *const kd_decay_names[KD_DECAY_N] = {KD_DECAY_LIST(KD_WORD_NAME)};
const char *const kd_precision_names[KD_PREC_N] = {KD_PRECISION_LIST(KD_WORD_NAME)};
const char *const kd_recompute_names[KD_RECOMPUTE_N] = {KD_RECOMPUTE_LIST(KD_WORD_NAME)};
const char *const kd_log_level_names[KD_LOG_N] = {KD_LOG_LEVEL_LIST(KD_WORD_NAME)};
const char *const kd_arch_names[KD_ARCH_N] = {KD_ARCH_LIST(KD_WORD_NAME)};
const char *const kd_act_names[KD_ACT_N] = {KD_ACT_LIST(KD_WORD_NAME)};
const char *const kd_rope_type_names[KD_ROPE_N] = {KD_ROPE_TYPE_LIST(KD_WORD_NAME)};
const char *const kd_layer_type_names[KD_LAYER_TYPE_N] = {KD_LAYER_TYPE_LIST(KD_WORD_NAME)};

int words_find(const char *words, const char *word) {
  const size_t n = strlen(word);
  int i = 0;
  for (const char *p = words; p; i++) {
    const char *e = strchr(p, '|');
    const size_t l = e ? (size_t)(e - p) : strlen(p);
    if (l == n && strncmp(p, word, n) == 0) return i;
    p = e ? e + 1 : NULL;
  }
  return -1;
}

const char *words_name(char *out, unsigned long outlen, const char *words, int i) {
  const char *p = i >= 0 ? words : NULL;
  for (int k = 0; k < i && p; k++) {
    p = strchr(p, '|');
    if (p) p++;
  }
  const char *e = p ? strchr(p, '|') : NULL;
  if (!p)
    snprintf(out, outlen, "%s", "");
  else
    snprintf(out, outlen, "%.*s", e ? (int)(e - p) : (int)strlen(p), p);
  return out;
}
