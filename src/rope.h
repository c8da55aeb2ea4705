/* rope.h: the rotary embedding of a model card: the default rule, or the inverse
 * frequencies and cos/sin factor of a scaled rule (linear, llama3, yarn) as transformers 5
 * computes them (modeling_rope_utils.py). */
#ifndef KD_ROPE_H
#define KD_ROPE_H

#include "backend/backend.h"
#include "config.h"

/* The rotary embedding of `card` for heads of size hd (even, at most 2 * KD_ROPE_MAX_HALF):
 * its rope_type's frequencies, in FP32 at the steps where transformers computes in FP32.
 * The card's RoPE keys are checked (card_check); dynamic and longrope are refused there. */
struct kd_rope rope_of_card(const struct kd_card *card, int hd);

#endif
