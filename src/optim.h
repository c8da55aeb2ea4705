/* optim.h: learning-rate schedule, gradient clipping, loss scaling. (The AdamW
 * kernel itself is the backend's `adamw` op, driven over the parameter table.) */
#ifndef KD_OPTIM_H
#define KD_OPTIM_H

#include <stdint.h>

#include "config.h"

/* Learning rate of step `step` (1-based): linear warmup from lr/warmup to lr over
 * optim%warmup steps, then decay ('cosine' | 'linear' | 'constant') to min_lr at
 * run%steps. */
double optim_lr(const struct kd_config *cfg, int64_t step);

/* Multiplier applied to the gradient so its global L2 norm is at most `clip`
 * (clip <= 0: no clipping). norm must be finite. */
double optim_clip_coef(double norm, double clip);

/* Loss scaling: none (scale 1), fixed, or dynamic (start 2^16, halve on a
 * non-finite step, double after `growth_interval` finite steps). */
struct kd_scaler {
  double scale;
  int dynamic;
  int growth_interval;
  int64_t good_steps; /* finite steps since the last change */
  int64_t skipped;    /* non-finite steps skipped so far */
};

void scaler_init(struct kd_scaler *s, double loss_scale_cfg);
/* Record one step's outcome; returns 1 if the update must be applied, 0 if skipped. */
int scaler_update(struct kd_scaler *s, int finite);

#endif
