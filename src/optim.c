/* optim.c: learning-rate schedule, gradient-clipping coefficient and the loss
 * scaler. Pure host arithmetic: the same on every rank. */
#include "optim.h"

#include <math.h>
#include <string.h>

static const double optim_pi = 3.14159265358979323846;

double optim_lr(const struct kd_config *cfg, int64_t step) {
  double lr = cfg->optim_lr, min_lr = cfg->optim_min_lr;
  int64_t warmup = cfg->optim_warmup > 0 ? cfg->optim_warmup : 0;
  if (step < 1) step = 1;
  if (step <= warmup) return lr * (double)step / (double)warmup;
  if (cfg->optim_decay == KD_DECAY_CONSTANT) return lr;
  int64_t span = cfg->run_steps - warmup;
  double p = (double)(step - warmup) / (double)(span > 1 ? span : 1);
  if (p < 0.0) p = 0.0;
  if (p > 1.0) p = 1.0;
  switch (cfg->optim_decay) {
  case KD_DECAY_LINEAR:
    return lr - (lr - min_lr) * p;
  case KD_DECAY_COSINE:
  default:
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(optim_pi * p));
  }
}

double optim_clip_coef(double norm, double clip) {
  if (clip > 0.0 && norm > clip) return clip / norm;
  return 1.0;
}

void scaler_init(struct kd_scaler *s, double loss_scale_cfg) {
  memset(s, 0, sizeof *s);
  s->growth_interval = 1000;
  if (loss_scale_cfg == 0.0) {
    s->dynamic = 1;
    s->scale = 65536.0;
  } else {
    s->scale = loss_scale_cfg; /* 1: no scaling; any other value: fixed */
  }
}

int scaler_update(struct kd_scaler *s, int finite) {
  if (!finite) {
    s->skipped++;
    s->good_steps = 0;
    if (s->dynamic) s->scale = s->scale * 0.5 < 1.0 ? 1.0 : s->scale * 0.5;
    return 0;
  }
  if (s->dynamic && ++s->good_steps >= s->growth_interval) {
    s->scale *= 2.0;
    s->good_steps = 0;
  }
  return 1;
}
