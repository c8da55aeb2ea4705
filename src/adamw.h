/* adamw.h: the AdamW update of the student's FP32 master weights (on this rank's ZeRO-1
 * shard when zero = 1), then the working weights refreshed from them. */
#ifndef KD_ADAMW_H
#define KD_ADAMW_H

#include <stdint.h>

#include "backend/backend.h"
#include "zero.h"

/* AdamW step t (1-based) with learning rate lr on the reduced gradients (update_reduce_grads)
 * multiplied by grad_mult (clipping / loss scale), then refresh the working weights. */
void adamw_apply(struct kd_update *u, struct kd_backend *be, double lr, float grad_mult, int64_t t,
                 double beta1, double beta2, double eps, double weight_decay);

#endif
