#!/usr/bin/env python3
"""The RoPE inverse frequencies and attention scaling of transformers 5
(modeling_rope_utils.ROPE_INIT_FUNCTIONS) for the configurations of
validation/unit/test_rope.c, printed as the C header validation/unit/rope_ref.h that the
test compares rope.c against. Run it again (with transformers 5) when a case is added:

  python3 validation/ref/rope_ref.py > validation/unit/rope_ref.h
"""
import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

# name, head_dim, max_position_embeddings, rope_parameters (rope_theta included)
CASES = [
    ("linear", 64, 4096, {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}),
    ("llama3.2-1b", 64, 131072,
     {"rope_type": "llama3", "rope_theta": 5e5, "factor": 32.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    ("llama3.1-8b", 128, 131072,
     {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    ("llama3-small", 16, 128,
     {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    ("yarn-qwen", 128, 131072,
     {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
      "original_max_position_embeddings": 32768}),
    ("yarn-small", 16, 128,
     {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "beta_fast": 16.0,
      "beta_slow": 1.0, "original_max_position_embeddings": 32}),
    ("yarn-mscale", 64, 163840,
     {"rope_type": "yarn", "rope_theta": 1e4, "factor": 40.0, "mscale": 0.707,
      "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
      "original_max_position_embeddings": 4096}),
    ("yarn-attention-factor", 32, 8192,
     {"rope_type": "yarn", "rope_theta": 5e4, "factor": 2.0, "attention_factor": 1.5,
      "truncate": False, "original_max_position_embeddings": 2048}),
]


def cfloat(v):
    """v as a C float literal that reads back as the same float32."""
    t = f"{v:.9g}"
    return t + ("f" if "." in t or "e" in t else ".0f")


ENUM = {"linear": "KD_ROPE_LINEAR", "llama3": "KD_ROPE_LLAMA3", "yarn": "KD_ROPE_YARN"}


def main():
    print("/* rope_ref.h: written by validation/ref/rope_ref.py from transformers "
          f"{transformers.__version__}'s\n * ROPE_INIT_FUNCTIONS; do not edit. */\n// clang-format off")
    print("struct rope_ref {\n  const char *name;\n  enum kd_rope_type type;\n  int head_dim, max_pos, orig;\n"
          "  double theta, factor, low, high, beta_fast, beta_slow, attention_factor, mscale,\n"
          "      mscale_all_dim;\n  int truncate;\n  double scaling;\n  float inv_freq[256];\n};")
    print("static const struct rope_ref rope_refs[] = {")
    for name, hd, maxpos, rp in CASES:
        cfg = LlamaConfig(hidden_size=hd * 4, num_attention_heads=4, head_dim=hd,
                          max_position_embeddings=maxpos, rope_parameters=dict(rp))
        inv, scaling = ROPE_INIT_FUNCTIONS[rp["rope_type"]](cfg, "cpu")
        inv = inv.float().tolist()
        assert len(inv) == hd // 2
        print(f'    {{"{name}", {ENUM[rp["rope_type"]]}, {hd}, {maxpos}, '
              f'{rp.get("original_max_position_embeddings", 0)}, {rp["rope_theta"]!r}, '
              f'{rp.get("factor", 1.0)!r}, {rp.get("low_freq_factor", 1.0)!r}, '
              f'{rp.get("high_freq_factor", 4.0)!r}, {float(rp.get("beta_fast", 32.0))!r}, '
              f'{float(rp.get("beta_slow", 1.0))!r}, {rp.get("attention_factor", 0.0)!r}, '
              f'{rp.get("mscale", 0.0)!r}, {rp.get("mscale_all_dim", 0.0)!r}, '
              f'{int(rp.get("truncate", True))}, {float(scaling)!r},')
        print("     {" + ", ".join(cfloat(v) for v in inv) + "}},")
    print("};\n// clang-format on")


if __name__ == "__main__":
    main()
