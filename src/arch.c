/* arch.c: the arch table (arch.h): one row of traits per model family, as transformers'
 * modelling code of each family computes it. */
#include "arch.h"

const struct kd_arch_traits kd_arch_traits[KD_ARCH_N] = {
    /* Qwen2 / Qwen2.5: biases on q/k/v, the window switched by use_sliding_window */
    [KD_ARCH_QWEN2] = {.act = KD_ACT_SILU, .attention_bias = 1, .window = KD_WINDOW_SWITCHED},
    /* Llama 2/3.x and Mistral */
    [KD_ARCH_LLAMA] = {.act = KD_ACT_SILU, .window = KD_WINDOW_EVERY_LAYER},
    /* Qwen3: per-head q/k norms */
    [KD_ARCH_QWEN3] = {.qk_norm = KD_QKN_HEAD, .act = KD_ACT_SILU, .window = KD_WINDOW_SWITCHED},
    /* Gemma 3: (1 + w) norms around attention and MLP, scaled embedding, GeGLU, scaled and
     * soft-capped scores, five sliding layers to one full */
    [KD_ARCH_GEMMA3] = {.qk_norm = KD_QKN_HEAD,
                        .norm_place = KD_NORM_SANDWICH,
                        .norm_offset = 1,
                        .embed_scale = 1,
                        .act = KD_ACT_GELU_TANH,
                        .window = KD_WINDOW_EVERY_LAYER,
                        .window_period = 6,
                        .attn_keys = 1},
    /* Qwen3-MoE: Qwen3's attention, experts every decoder_sparse_step-th layer */
    [KD_ARCH_QWEN3_MOE] = {.qk_norm = KD_QKN_HEAD,
                           .act = KD_ACT_SILU,
                           .window = KD_WINDOW_SWITCHED_ALL,
                           .moe = KD_MOE_SPARSE_STEP},
    /* OLMo 2: norms after attention and MLP only, q/k norms over the whole projection */
    [KD_ARCH_OLMO2] = {.qk_norm = KD_QKN_PROJ,
                       .norm_place = KD_NORM_POST,
                       .act = KD_ACT_SILU,
                       .window = KD_WINDOW_EVERY_LAYER},
    /* Mixtral: Mistral's attention, experts in every layer */
    [KD_ARCH_MIXTRAL] = {.act = KD_ACT_SILU,
                         .window = KD_WINDOW_EVERY_LAYER,
                         .moe = KD_MOE_EVERY_LAYER,
                         .norm_topk_prob = 1},
    /* Phi-3: Llama's math (its checkpoints fuse q/k/v and gate/up: the converter splits
     * them), sliding_window in every layer as Mistral's */
    [KD_ARCH_PHI3] = {.act = KD_ACT_SILU, .window = KD_WINDOW_EVERY_LAYER},
    /* SmolLM3: Llama's math without RoPE in some layers (no_rope_layers), the window switched
     * by use_sliding_window in the layers layer_types marks */
    [KD_ARCH_SMOLLM3] = {.act = KD_ACT_SILU, .window = KD_WINDOW_SWITCHED, .nope_keys = 1},
};
