/* hfconfig.h: a Hugging Face config.json <-> a kdtrain model card (doc/user-guide.md,
 * "Hugging Face models"). Reading takes every key that changes what the model computes,
 * in the transformers 4 and 5 spellings, and refuses any value kdtrain does not compute;
 * writing produces a config.json that transformers 4 and 5 both load. */
#ifndef KD_HFCONFIG_H
#define KD_HFCONFIG_H

#include <stddef.h>

#include "config.h"

/* What config.json says beyond the card. */
struct hf_extra {
  char model_type[32]; /* as written: qwen2, qwen3, llama, mistral, gemma3_text or gemma3 */
  char dtype[32];      /* torch_dtype / dtype, "" when absent */
  int multimodal;      /* the decoder is the text model of a multimodal model (gemma3): its
                          tensors carry a language-model prefix, the others are left out */
};

/* Read `dir`/config.json into `card` (name and path left empty). 0, or KD_EXIT_INPUT with
 * one message naming the file, the key and its value in `err`. */
int hfconfig_read(struct kd_card *card, struct hf_extra *extra, const char *dir, char *err,
                  size_t errlen);

/* The config.json text for `card` (float32 weights); the caller frees it. NULL, with why in
 * `err`, for a card no supported model_type computes (a llama card whose window differs
 * between layers; one window in every layer is written as model_type mistral). */
char *hfconfig_write(const struct kd_card *card, char *err, size_t errlen);

#endif
