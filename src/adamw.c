/* adamw.c: the AdamW update of the student's FP32 master weights (on this rank's ZeRO-1
 * shard when zero = 1), then the working weights refreshed from them. The element-wise
 * kernel is the backend's (cpu_adamw, the CUDA twin); the schedule and clipping that feed
 * it are optim.c's, the gradient reduction before it zero.c's. */
#include "adamw.h"

#include <math.h>

void adamw_apply(struct kd_update *u, struct kd_backend *be, double lr, float grad_mult, int64_t t,
                 double beta1, double beta2, double eps, double weight_decay) {
  struct kd_model *z = update_state(u);
  const float bc1 = (float)(1.0 - pow(beta1, (double)t));
  const float bc2 = (float)(1.0 - pow(beta2, (double)t));
  for (int k = 0; k < z->nparams; k++) {
    const struct kd_param *p = &z->params[k];
    if (!p->local) continue;
    const float wd = p->decay ? (float)weight_decay : 0.0f;
    be->adamw(be, z->master + p->offset, z->m + p->offset, z->v + p->offset, z->grad + p->offset,
              p->numel, (float)lr, (float)beta1, (float)beta2, (float)eps, wd, bc1, bc2, grad_mult);
  }
  update_refresh_weights(u, be);
}
