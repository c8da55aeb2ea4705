/* rope.c: the inverse frequencies of the rotary embedding's scaled rules, step for step as
 * transformers 5 computes them (modeling_rope_utils.py: _compute_linear_scaling_,
 * _compute_llama3_, _compute_yarn_parameters): FP32 where it works on FP32 tensors (a
 * Python scalar meets them as FP32), double where it works on Python floats. */
#include "rope.h"

#include <math.h>

#include "util.h"

#define ROPE_PI 3.14159265358979323846 /* math.pi */

/* transformers' base frequencies base ** (2i / dim) for i < half, FP32 exponent; the power
 * itself taken in double and rounded once. */
static float base_freq(double base, int i, int dim) {
  const float e = (float)(2 * i) / (float)dim;
  return (float)pow((double)(float)base, (double)e);
}

/* llama3: frequencies of wavelength above original/low_freq_factor divided by factor,
 * below original/high_freq_factor kept, smoothly interpolated in between. */
static void llama3_freqs(struct kd_rope *r, const struct kd_card *c, int hd) {
  const double old = c->original_max_position_embeddings > 0 ? c->original_max_position_embeddings
                                                             : c->max_position_embeddings;
  const float low_wl = (float)(old / c->low_freq_factor);
  const float high_wl = (float)(old / c->high_freq_factor);
  const float factor = (float)c->factor, lowf = (float)c->low_freq_factor;
  const float span = (float)(c->high_freq_factor - c->low_freq_factor);
  for (int i = 0; i < r->half; i++) {
    const float inv = 1.0f / base_freq(c->rope_theta, i, hd);
    const float wavelen = (float)(2 * ROPE_PI) / inv;
    const float inv_llama = wavelen > low_wl ? inv / factor : inv;
    const float smooth = ((float)old / wavelen - lowf) / span;
    const float smoothed = (1.0f - smooth) * inv_llama / factor + smooth * inv_llama;
    const int medium = !(wavelen < high_wl) && !(wavelen > low_wl);
    r->inv_freq[i] = medium ? smoothed : inv_llama;
  }
}

/* yarn's dimension at which a frequency makes `rotations` turns over `len` positions. */
static double yarn_dim(double rotations, int dim, double base, double len) {
  return dim * log(len / (rotations * 2 * ROPE_PI)) / (2 * log(base));
}

/* yarn's mscale: 0.1 * m * ln(scale) + 1 above scale 1. */
static double yarn_mscale(double scale, double m) {
  return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

/* yarn: interpolated (divided by factor) below dimension `low`, extrapolated (kept) above
 * `high`, a linear ramp between; cos and sin times the attention factor. */
static void yarn_freqs(struct kd_rope *r, const struct kd_card *c, int hd) {
  const double base = c->rope_theta, factor = c->factor;
  const double old = c->original_max_position_embeddings > 0 ? c->original_max_position_embeddings
                                                             : c->max_position_embeddings;
  double af = c->attention_factor;
  if (af <= 0)
    af = c->mscale > 0 && c->mscale_all_dim > 0
             ? yarn_mscale(factor, c->mscale) / yarn_mscale(factor, c->mscale_all_dim)
             : yarn_mscale(factor, 1.0);
  r->attn_scale = (float)af;
  double low = yarn_dim(c->beta_fast, hd, base, old), high = yarn_dim(c->beta_slow, hd, base, old);
  if (c->truncate) low = floor(low), high = ceil(high);
  low = low > 0 ? low : 0;
  high = high < hd - 1 ? high : hd - 1;
  if (low == high) high += 0.001; /* transformers' guard against a zero-width ramp */
  const float lo = (float)low, width = (float)(high - low), f = (float)factor;
  for (int i = 0; i < r->half; i++) {
    const float pos = base_freq(base, i, hd);
    const float extrap = 1.0f / pos, interp = 1.0f / (f * pos);
    float ramp = ((float)i - lo) / width;
    ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
    const float keep = 1.0f - ramp; /* the extrapolation factor */
    r->inv_freq[i] = interp * (1.0f - keep) + extrap * keep;
  }
}

struct kd_rope rope_of_card(const struct kd_card *c, int hd) {
  struct kd_rope r = kd_rope_plain((float)c->rope_theta);
  if (c->rope_type == KD_ROPE_DEFAULT) return r;
  KD_CHECK(hd % 2 == 0 && hd / 2 <= KD_ROPE_MAX_HALF,
           "rope: head size %d: expected an even size of at most %d", hd, 2 * KD_ROPE_MAX_HALF);
  r.scaled = 1;
  r.half = hd / 2;
  if (c->rope_type == KD_ROPE_LINEAR) {
    for (int i = 0; i < r.half; i++)
      r.inv_freq[i] = 1.0f / base_freq(c->rope_theta, i, hd) / (float)c->factor;
  } else if (c->rope_type == KD_ROPE_LLAMA3) {
    llama3_freqs(&r, c, hd);
  } else if (c->rope_type == KD_ROPE_YARN) {
    yarn_freqs(&r, c, hd);
  } else {
    KD_CHECK(0, "rope: rope_type '%s' is not computed (card_check refuses it)",
             kd_rope_type_names[c->rope_type]);
  }
  return r;
}
