#!/usr/bin/env python3
"""Model families end to end against transformers' own classes (validation/e2e/test_families.sh
drives it): one FAMILIES entry per family, the shell test one kd_ref_step per entry.

  families_ref.py KDCONVERT KDLOGITS WORK SEQ_LEN ROWS

For each family of FAMILIES, in WORK/FAMILY:
  * ref_step.py's models and reference step: a random teacher and student written by
    transformers' class (save_pretrained, fp32; the entry's `config`, registered in
    ref_step.FAMILIES), tokens.h5 and ref.txt (PyTorch's loss, loss_kd, loss_ce and gradient
    norm of one distillation step), the entry's `contrast` changing that step by more than
    10 x 1e-4; ROWS gets the entry's `step` row for kd_ref_step (validation/lib.sh), which
    runs kdtrain's step on 1 rank, tp 2 and pp 2;
  * for the teacher and the student: the checkpoint holds the family's fused tensors
    (`fused`: model.layers.L.FILE made of the rows of model.layers.L.PART...) and none of
    their parts; `kdconvert from-hf`; in the weights file the parts, one after the other,
    are the fused tensor bit for bit; kdtrain's logits (kdlogits) against transformers'
    (fp32, max |diff| / max |logit| below 1e-4; the maximum |diff| printed); `kdconvert
    to-hf`: the same tensor names (the fused ones fused again), every tensor bit for bit,
    config.json's `keys` back as written, and transformers' logits of the reloaded model
    equal to the original's;
  * `refusals`: config.json changes (or, with a callable, a change of the checkpoint's
    tensors) that `kdconvert from-hf` must refuse with exit status 2, naming the key and
    its value (or the message's text), writing nothing; `ignored`: config.json changes
    transformers computes nothing different for: the same weights file tensors.

A new family is one FAMILIES entry (and the word and traits it needs in src/).
"""
import json
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM, Olmo2Config, Phi3Config, SmolLM3Config)
from transformers.utils import logging as hf_logging  # noqa: E402

import ref_step  # noqa: E402
from hf_roundtrip import TOL, logits_of, rel, run  # noqa: E402
from ref_step import rope, sizes  # noqa: E402


def phi3(window):
    """Phi3ForCausalLM teacher and student (GQA 4/2; tied student; pad_token_id an id the
    token file holds: its embedding row has no gradient), sliding_window per role or None."""
    def config(role):
        shape = sizes(128, 64, 96, 2, 4, 2) if role == "teacher" else sizes(128, 32, 64, 2, 4, 2)
        return Phi3Config(**shape, tie_word_embeddings=role == "student", pad_token_id=3,
                          bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-5,
                          sliding_window=window[role] if window else None,
                          rope_parameters=rope("default", 1e4))
    return config


PHI3_FUSED = {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                            "self_attn.v_proj.weight"),
              "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}


def unfused(tensors):
    """Phi-3's fused tensors stored as their parts (a checkpoint transformers cannot read)."""
    out = {}
    for name, t in tensors.items():
        if name.endswith("self_attn.qkv_proj.weight"):
            q = t.shape[0] // 2  # the sizes above: 4 query heads and 2 + 2 key/value heads
            for part, rows in (("q_proj", t[:q]), ("k_proj", t[q:q + q // 2]),
                               ("v_proj", t[q + q // 2:])):
                out[name.replace("qkv_proj", part)] = rows.contiguous()
        else:
            out[name] = t
    return out


PHI3_REFUSALS = [
    ("rope_scaling.type", '"longrope"',  # Phi-3-mini-128k's (transformers 4 spelling)
     {"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}}),
    ("rope_scaling.type", '"su"', {"rope_scaling": {"type": "su", "short_factor": [1.0] * 4,
                                                     "long_factor": [2.0] * 4}}),
    ("rope_parameters.rope_type", '"yarn"',  # longrope to Phi3Config
     {"rope_parameters": rope("yarn", 1e4, factor=2.0)}),
    ("rope_parameters.rope_type", '"linear"', {"rope_parameters": rope("linear", 1e4, factor=2.0)}),
    # Phi-4-mini's (top level: Phi3Config takes it when rope_parameters does not hold it)
    ("partial_rotary_factor", "0.75", {"partial_rotary_factor": 0.75,
                                       "rope_parameters": rope("default", 1e4)}),
    ("partial_rotary_factor", "0.5", {"rope_parameters": rope("default", 1e4,
                                                              partial_rotary_factor=0.5)}),
    ("hidden_act", '"gelu_new"', {"hidden_act": "gelu_new"}),
    ("pad_token_id", "(absent)", {"pad_token_id": None}),  # Phi3Config's 32000: no such row
    ("layer_types[1]", '"full_attention"', {"sliding_window": 8, "layer_types": [
        "sliding_attention", "full_attention"]}),
    ("model.layers.0.self_attn.qkv_proj.weight", "transformers reads no such tensor", unfused),
]
# transformers' Phi3 reads these keys and computes nothing different (dropout is off in
# eval, kdtrain has none; original_max_position_embeddings is longrope's; attention_bias is
# not Phi3's)
PHI3_IGNORED = {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attention_dropout": 0.1,
                "original_max_position_embeddings": 2048, "attention_bias": True}

def olmo2(role):
    """Olmo2ForCausalLM teacher and student: norms after attention and MLP only, q/k norms
    over the whole projection (GQA 4/2: k_norm half q_norm's width), a tied student, a
    padding id the token file holds."""
    shape = sizes(128, 48, 96, 3, 4, 2) if role == "teacher" else sizes(128, 32, 64, 2, 4, 2)
    return Olmo2Config(**shape, pad_token_id=3, bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-5,
                       tie_word_embeddings=role == "student", rope_parameters=rope("default", 1e4))


# transformers' Olmo2 has an o_proj bias with attention_bias, which kdtrain does not compute
OLMO2_REFUSALS = [("attention_bias", "true", {"attention_bias": True})]

def smollm3(role):
    """SmolLM3ForCausalLM teacher and student: no RoPE in every no_rope_layer_interval-th
    layer (the teacher by the interval's rule, 3: layer 2 of 3; the student by an explicit
    no_rope_layers), GQA, a tied student."""
    if role == "teacher":
        return SmolLM3Config(**sizes(128, 48, 96, 3, 4, 2), no_rope_layer_interval=3,
                             pad_token_id=3, bos_token_id=1, eos_token_id=2,
                             tie_word_embeddings=False, rope_parameters=rope("default", 1e4))
    return SmolLM3Config(**sizes(128, 32, 64, 2, 4, 2), no_rope_layers=[0, 1], pad_token_id=3,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
                         rope_parameters=rope("default", 1e4))


# SmolLM3's o_proj and MLP biases are not computed by kdtrain
SMOLLM3_REFUSALS = [("attention_bias", "true", {"attention_bias": True}),
                    ("mlp_bias", "true", {"mlp_bias": True})]

# FAMILY -> its entry: config (role -> transformers config: teacher and student share the
# vocabulary; heads, kv heads, vocabulary and intermediate sizes divide by 2, >= 2 layers),
# contrast (config.json changes that switch the family's feature off, or None), step
# (KIND ALPHA TEMPERATURE BETA T2_SCALE LAYOUT of kd_ref_step), fused ({FILE: PARTS} of
# each layer), keys (config.json keys to-hf gives back), refusals and ignored (above).
FAMILIES = {
    "phi3": dict(config=phi3(None), contrast=None, step="fkl 0.5 2.0 0.5 T pp",
                 fused=PHI3_FUSED, keys=("sliding_window", "tie_word_embeddings", "pad_token_id",
                                         "rms_norm_eps", "num_key_value_heads"),
                 refusals=PHI3_REFUSALS, ignored=PHI3_IGNORED),
    # a window of 8 (teacher) and 6 (student) tokens in every layer, on 32 positions
    "phi3_sw": dict(config=phi3({"teacher": 8, "student": 6}), contrast={"sliding_window": None},
                    step="jsd 0.6 2.0 0.4 T pp", fused=PHI3_FUSED,
                    keys=("sliding_window", "tie_word_embeddings", "pad_token_id")),
    "olmo2": dict(config=olmo2, contrast=None, step="fkl 0.5 2.0 0.5 T pp", fused={},
                  keys=("tie_word_embeddings", "pad_token_id", "rms_norm_eps",
                        "num_key_value_heads"), refusals=OLMO2_REFUSALS),
    # the contrast: RoPE in every layer changes the step
    "smollm3": dict(config=smollm3, contrast={"no_rope_layers": None, "no_rope_layer_interval":
                                              1000}, step="rkl 0.6 2.0 0.5 T pp", fused={},
                    keys=("no_rope_layers", "tie_word_embeddings", "pad_token_id"),
                    refusals=SMOLLM3_REFUSALS),
}


def fused_checks(src, h5, fused):
    """The checkpoint holds the fused tensors, not their parts; the weights file the parts,
    whose rows one after the other are the fused tensor bit for bit."""
    st = load_file(os.path.join(src, "model.safetensors"))
    layers = {int(k.split(".")[2]) for k in st if k.startswith("model.layers.")}
    with h5py.File(h5, "r") as f:
        params = {k: f["params"][k][()] for k in f["params"]}
    for layer in sorted(layers):
        for name, parts in fused.items():
            full = f"model.layers.{layer}.{name}"
            assert full in st, f"{src}: no {full}: {sorted(st)[:8]}"
            pnames = [f"model.layers.{layer}.{p}" for p in parts]
            assert not set(pnames) & set(st), f"{src}: holds {pnames}"
            assert full not in params, f"{h5}: holds {full}"
            cat = np.concatenate([params[p] for p in pnames])
            assert np.array_equal(cat, st[full].numpy()), f"{h5}: {pnames} are not {full}"
    return len(layers) * len(fused)


def roles(conv, kdlogits, work, fam, entry, T, log):
    """from-hf, the logits, to-hf of the family's teacher and student; the worst logits
    difference (relative, absolute)."""
    worst = (0.0, 0.0)
    for role in ("teacher", "student"):
        src = os.path.join(work, fam, f"hf_{role}")
        h5 = os.path.join(work, fam, f"logits_{role}.h5")
        run([conv, "from-hf", src, h5], log)
        n = fused_checks(src, h5, entry["fused"])
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
        ids = torch.randint(0, model.config.vocab_size, (3, T + 8))
        kd = logits_of(kdlogits, h5, ids, os.path.join(work, fam), role, log)
        with torch.no_grad():
            ref = model(ids).logits
        assert kd.shape == ref.shape, (kd.shape, ref.shape)
        r1, a1 = rel(kd, ref), (kd - ref).abs().max().item()
        print(f"{fam} {role}: {n} fused tensors split; kdtrain vs transformers logits (fp32, "
              f"{tuple(ref.shape)}): max |diff| {a1:.3e}, relative {r1:.3e}")
        assert r1 < TOL, f"{fam} {role}: logits differ by {r1:.3e} > {TOL}"
        worst = (max(worst[0], r1), max(worst[1], a1))

        back = os.path.join(work, fam, f"hf_back_{role}")
        run([conv, "to-hf", h5, back], log)
        st, bt = (load_file(os.path.join(d, "model.safetensors")) for d in (src, back))
        assert set(st) == set(bt), sorted(set(st) ^ set(bt))[:8]
        for k in st:
            assert torch.equal(st[k].float(), bt[k]), k
        fused_checks(back, h5, entry["fused"])
        again = AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
        assert type(again) is type(model), type(again)
        for key in entry["keys"]:
            assert getattr(again.config, key) == getattr(model.config, key), \
                (key, getattr(again.config, key), getattr(model.config, key))
        with torch.no_grad():
            r2 = rel(again(ids).logits, ref)
        print(f"{fam} {role}: to-hf: {len(st)} tensors bit for bit under the checkpoint's "
              f"names ({', '.join(entry['fused'])} fused again), {', '.join(entry['keys'])} "
              f"back; the reloaded {type(again).__name__}'s logits differ by {r2:.1e}")
        assert r2 == 0.0
    return worst


def params_of(h5):
    with h5py.File(h5, "r") as f:
        return {k: f["params"][k][()] for k in f["params"]}


def refusals(conv, work, fam, entry, log):
    """config.json values (or tensors) kdconvert refuses: exit 2 naming the key, nothing
    written; keys transformers computes nothing different for: the same tensors."""
    src = os.path.join(work, fam, "hf_student")
    base = json.load(open(os.path.join(src, "config.json")))
    d, out = os.path.join(work, "refuse"), os.path.join(work, "refused.h5")
    for key, value, change in entry.get("refusals", []):
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        if callable(change):  # the checkpoint's tensors changed
            st = load_file(os.path.join(src, "model.safetensors"))
            save_file(change(st), os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
            want = [key, value]
        else:
            cfg = {k: v for k, v in dict(base, **change).items() if v is not None}
            json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
            want = [f'"{key}" = {value}', "config.json"]
        msg = run([conv, "from-hf", d, out], log, expect=2)
        assert all(w in msg for w in want), f"{fam}: message for {key} lacks {want}:\n{msg}"
        assert not os.path.exists(out) and not os.path.exists(out + ".tmp"), "wrote output"
        print(f"{fam}: refused: {msg.strip().splitlines()[-1][:160]}")
    if entry.get("ignored"):
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        json.dump(dict(base, **entry["ignored"]), open(os.path.join(d, "config.json"), "w"))
        run([conv, "from-hf", d, out], log)
        a, b = params_of(out), params_of(os.path.join(work, fam, "logits_student.h5"))
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
        print(f"{fam}: {json.dumps(entry['ignored'])}: imported, the same tensors")
        os.remove(out)  # the next family's refusals must find nothing written


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    conv, kdlogits, work, T, rows = sys.argv[1:]
    T = int(T)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with open(rows, "w") as f:
        for fam, entry in FAMILIES.items():
            ref_step.FAMILIES[fam] = (entry["config"], entry["contrast"])
            f.write(f"{fam} {entry['step']}\n")
    print("== the models (transformers) and the reference steps (PyTorch)")
    ref_step.run(work, T, rows)
    worst = (0.0, 0.0)
    with open(os.path.join(work, "families.log"), "w") as log:
        for fam, entry in FAMILIES.items():
            print(f"== {fam}: kdconvert from-hf, kdlogits, to-hf")
            torch.manual_seed(ref_step.seed_of(fam))
            w = roles(conv, kdlogits, work, fam, entry, T, log)
            worst = (max(worst[0], w[0]), max(worst[1], w[1]))
            refusals(conv, work, fam, entry, log)
    print(f"families: logits within {worst[0]:.3e} relative, {worst[1]:.3e} absolute of "
          f"transformers'")


if __name__ == "__main__":
    main()
