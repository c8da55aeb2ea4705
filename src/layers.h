/* layers.h: forward and backward of the whole decoder stack for one micro-batch,
 * orchestrating backend ops. The activations of a model live in `struct kd_acts`;
 * a frozen model (the teacher) keeps one layer's working set only. What a trained
 * model keeps for backward follows its memory policy (mdl->mem, doc/memory.md):
 * recompute 'none' | 'full' | 'selective', offloaded layer inputs, tiled MLP. */
#ifndef KD_LAYERS_H
#define KD_LAYERS_H

#include "acts.h"
#include "backend/backend.h"
#include "layers_moe.h"
#include "model.h"

/* The layout sizes of `mdl`'s stage for micro-batches of B sequences of T tokens. */
void acts_dims_of(struct acts_dims *d, const struct kd_model *mdl, int B, int T);

/* The mixture-of-experts sizes of d (a stage of `layers` layers from layer0 of `card`;
 * effn: an expert's intermediate size on this rank). */
void acts_dims_experts(struct acts_dims *d, const struct kd_card *card, int layer0, int effn);

/* Floats after the hidden states in a pipeline message of a trained model of card c: its
 * load-balancing sums (per expert routed rows and probability sums, and the token rows, as
 * doubles); 0 for a card without sparse layers. The gradient workspace dres has them too. */
size_t acts_aux_floats(const struct kd_card *c);

/* Rows of one MLP tile: the sequence is cut into ceil(T / C) tiles. */
int acts_tile_rows(int T, int C);

/* Add to bytes[cat] what acts_build_shared allocates for `d` (owns_ws: with the
 * shared working set and gradient workspace). The memory planner's activation term. */
void acts_plan(const struct acts_dims *d, int owns_ws, size_t bytes[KD_MEM_NCAT]);

/* Allocate activations of this rank's pipeline stage for micro-batches of B
 * sequences of T tokens. */
void acts_build(struct kd_acts *a, struct kd_backend *be, const struct kd_model *mdl, int B, int T);
/* The same, sharing the working set and gradient workspace of `share` (another
 * in-flight micro-batch of the same stage: backward passes run one at a time). */
void acts_build_shared(struct kd_acts *a, struct kd_backend *be, const struct kd_model *mdl, int B,
                       int T, const struct kd_acts *share);
void acts_free(struct kd_acts *a, struct kd_backend *be);

/* Where the stage's input hidden state (N, C) goes when it is not the first stage
 * (consumed by the next layers_forward). */
float *acts_stage_input(const struct kd_acts *a);
/* The stage's output hidden state (N, C) when it is not the last stage. */
float *acts_stage_output(const struct kd_acts *a, const struct kd_model *mdl);

/* The documents of the next micro-batch of a: pos (B*T host ints, each row's position in
 * its document: struct kd_attn's pos), uploaded and kept for its backward; NULL: the rows
 * of a sequence are one stream (position t). */
void acts_set_pos(struct kd_backend *be, struct kd_acts *a, const int *pos);

/* Forward of this rank's stage for one micro-batch: from tokens (B*T) on the first
 * stage, else from acts_stage_input; leaves the final normed hidden state in a->hn
 * on the last stage, else acts_stage_output. Training models keep what backward
 * needs. Collective over mdl->tp_comm. */
void layers_forward(struct kd_backend *be, const struct kd_model *mdl, struct kd_acts *a,
                    const int *tokens);

/* Backward of this rank's stage, from a->dhn (gradient w.r.t. a->hn, complete over
 * TP) on the last stage, else from a->dres (gradient w.r.t. the stage output);
 * recomputes what the forward did not keep (bitwise the same values), accumulates
 * into mdl->grad and leaves the gradient w.r.t. the stage input in a->dres on
 * stages after the first. Collective over mdl->tp_comm. */
void layers_backward(struct kd_backend *be, struct kd_model *mdl, struct kd_acts *a);

#endif
