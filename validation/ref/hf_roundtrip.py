#!/usr/bin/env python3
"""Hugging Face round trip of kdconvert and kdtrain's logits (doc/checkpoint.md).

Small random models written by transformers itself (save_pretrained), with a BPE
tokenizer trained here with `tokenizers` on the KJV corpus and saved beside them:

  qwen2    tied, rope_parameters.rope_theta = 1e6, rms_norm_eps = 1e-5, GQA 4/2, fp32
  llama    untied, rope_theta 5e5, rms_norm_eps 1e-5, GQA 4/2, saved in bf16 and in
           shards (exercises the index and the BF16 reader)
  mistral  untied, sliding_window null (computed as Llama)
  llama3   Llama with rope_parameters.rope_type llama3 (factor 8, original length 64 of
           128: the three frequency bands each hold a frequency), 120 positions
  yarn     Llama with rope_type yarn (factor 4, original length 32, beta_fast 16: the ramp
           and the attention factor 0.1 ln 4 + 1), 120 positions
  qwen3    untied, head_dim 24 (hidden 64 / 4 heads would be 16), GQA 4/2, q/k norms
  qwen3_tied  tied, head_dim 32, GQA 4/1
  mistral_sw  Mistral with sliding_window 5 (every layer) on 40-token sequences
  qwen2_sw    Qwen2 with use_sliding_window, sliding_window 6 and max_window_layers 1 of 3
           layers (layer 0 full attention, layers 1 and 2 windowed)
  gemma3   Gemma3ForCausalLM: 4 layers (sliding, sliding, full, sliding) with a window of
           16 on 40 positions, head_dim 24 (hidden 64 / 4 heads would be 16),
           query_pre_attn_scalar 20, linear RoPE (factor 4) on the full layer and a
           local base on the others, GeGLU, (1 + w) norms with random weights, tied
  gemma3_cap  the same with final_logit_softcapping 3 (Gemma 2's cap on the logits)
  gemma3_mm   Gemma3ForConditionalGeneration with a tiny vision tower: its text model is
           imported (the vision tower and projector left out, and said so), its logits on
           text are the multimodal model's

For the windowed cases transformers itself must apply the window (eager or sdpa
attention, not flash): the same weights without the window give other logits.

For each: `kdconvert from-hf`, kdtrain's logits (`kdlogits`) against transformers' in
fp32 (max |diff| / max |logit| below 1e-4), the tokenizer files stored byte for byte in
/tokenizer; the transformers-4 spelling of the same config (top-level rope_theta) gives
the same logits (for llama3 and yarn: top-level rope_theta and the hub's rope_scaling
dict); `kdconvert to-hf --max-shard-size` with a tiny limit (index + shards):
every tensor back bit for bit, transformers loads it (same logits), AutoTokenizer loads
and encodes as the original, and generate() runs. Then the refusals: exit status 2 and
a message naming the key and its value, nothing written.

usage: hf_roundtrip.py KDCONVERT KDLOGITS CORPUS [WORKDIR]
"""
import json, os, shutil, subprocess, sys, tempfile

import h5py
import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
from transformers import (AutoModelForCausalLM, AutoTokenizer, Gemma3Config,
                          Gemma3ForConditionalGeneration, Gemma3TextConfig, LlamaConfig,
                          MistralConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen3Config,
                          SiglipVisionConfig)

TOL = 1e-4
# the RoPE scaling cases: Llama models whose rules change every band at 120 positions
ROPE_SCALED = {
    "llama3": {"rope_type": "llama3", "rope_theta": 2e4, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "rope_theta": 2e4, "factor": 4.0, "beta_fast": 16.0,
             "original_max_position_embeddings": 32},
}
# the sliding-window cases: the window of each model, shorter than the 40-token sequences
SW = {"mistral_sw": 5, "qwen2_sw": 6}
TEXT = "In the beginning God created the heaven and the earth."


def run(cmd, log, expect=0):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log.write(f"$ {' '.join(cmd)}\n{r.stdout}")
    if r.returncode != expect:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}, expected {expect}:\n{r.stdout}")
    return r.stdout


def train_tokenizer(corpus, work):
    """A byte-level BPE tokenizer trained on the corpus, as a transformers tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([corpus], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")


def make_model(kind, vocab):
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rms_norm_eps=1e-5)
    if kind == "qwen2":
        cfg = Qwen2Config(**common, tie_word_embeddings=True,
                          rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    elif kind == "llama":
        cfg = LlamaConfig(**common, tie_word_embeddings=False,
                          rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    elif kind in ROPE_SCALED:
        cfg = LlamaConfig(**common, tie_word_embeddings=False,
                          rope_parameters=dict(ROPE_SCALED[kind]))
    elif kind == "qwen3":
        cfg = Qwen3Config(**common, head_dim=24, tie_word_embeddings=False,
                          rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    elif kind == "qwen3_tied":
        cfg = Qwen3Config(**dict(common, num_key_value_heads=1), head_dim=32,
                          tie_word_embeddings=True,
                          rope_parameters={"rope_type": "default", "rope_theta": 3e4})
    elif kind == "mistral_sw":
        cfg = MistralConfig(**common, tie_word_embeddings=False, sliding_window=SW[kind],
                            rope_parameters={"rope_type": "default", "rope_theta": 2e4})
    elif kind == "qwen2_sw":
        cfg = Qwen2Config(**dict(common, num_hidden_layers=3), tie_word_embeddings=False,
                          use_sliding_window=True, sliding_window=SW[kind], max_window_layers=1,
                          rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        assert cfg.layer_types == ["full_attention"] + 2 * ["sliding_attention"], cfg.layer_types
    else:
        cfg = MistralConfig(**common, tie_word_embeddings=False, sliding_window=None,
                            rope_parameters={"rope_type": "default", "rope_theta": 2e4})
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # transformers zero-initialises biases and ones the norms
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def logits_of(kdlogits, h5, ids, work, tag, log):
    tok = os.path.join(work, f"tokens_{tag}.txt")
    with open(tok, "w") as f:
        for row in ids.tolist():
            f.write(" ".join(map(str, row)) + "\n")
    npy = os.path.join(work, f"logits_{tag}.npy")
    run([kdlogits, h5, tok, npy], log)
    return torch.from_numpy(np.load(npy))


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def case(conv, kdlogits, work, kind, tokenizer, log):
    torch.manual_seed({"qwen2": 0, "llama": 1, "mistral": 2, "llama3": 3, "yarn": 4, "qwen3": 5,
                       "qwen3_tied": 6, "mistral_sw": 7, "qwen2_sw": 8}[kind])
    model = make_model(kind, len(tokenizer))
    src = os.path.join(work, f"hf_{kind}")
    bf16 = kind == "llama"
    if bf16:  # stored in bf16 and sharded; the reference is its fp32 upcast
        model = model.to(torch.bfloat16)
        model.save_pretrained(src, max_shard_size="100KB")
        # reloaded, not .float(): to(bfloat16) also rounded the RoPE inv_freq buffer
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
        assert os.path.exists(os.path.join(src, "model.safetensors.index.json"))
    else:
        model.save_pretrained(src)
    tokenizer.save_pretrained(src)
    cfg = json.load(open(os.path.join(src, "config.json")))
    assert "rope_parameters" in cfg and cfg["rope_parameters"]["rope_theta"] != 1e4, cfg

    h5 = os.path.join(work, f"{kind}.h5")
    run([conv, "from-hf", src, h5], log)
    ids = torch.randint(0, len(tokenizer), (2, 120) if kind in ROPE_SCALED else (3, 40))
    kd = logits_of(kdlogits, h5, ids, work, kind, log)
    with torch.no_grad():
        ref = model(ids).logits
    assert kd.shape == ref.shape, (kd.shape, ref.shape)
    r1 = rel(kd, ref)
    print(f"{kind}: kdtrain vs transformers logits (fp32, {tuple(ref.shape)}): {r1:.3e}")
    assert r1 < TOL, f"{kind}: logits differ by {r1:.3e} > {TOL}"
    if kind in ROPE_SCALED:  # the scaling matters at this length: default RoPE is far off
        plain = LlamaConfig.from_pretrained(src)
        plain.rope_parameters = {"rope_type": "default",
                                 "rope_theta": ROPE_SCALED[kind]["rope_theta"]}
        unscaled = AutoModelForCausalLM.from_config(plain).eval()
        unscaled.load_state_dict(model.state_dict())
        with torch.no_grad():
            r0 = rel(unscaled(ids).logits, ref)
        print(f"{kind}: the same weights with default RoPE differ by {r0:.3e}")
        assert r0 > 10 * TOL, f"{kind}: the scaling changes the logits by {r0:.3e} only"
    if kind in SW:  # transformers applies the window: without it the logits differ
        assert model.config._attn_implementation in ("eager", "sdpa"), \
            model.config._attn_implementation
        assert ids.shape[1] > SW[kind]
        full = type(model.config).from_pretrained(src)
        full.sliding_window = None
        if kind == "qwen2_sw":
            full.use_sliding_window = False
            full.layer_types = ["full_attention"] * full.num_hidden_layers
        unwindowed = AutoModelForCausalLM.from_config(full).eval()
        unwindowed.load_state_dict(model.state_dict())
        with torch.no_grad():
            r0 = rel(unwindowed(ids).logits, ref)
            # and the eager implementation gives the windowed logits too
            eager = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32,
                                                         attn_implementation="eager").eval()
            re = rel(eager(ids).logits, ref)
        print(f"{kind}: transformers ({model.config._attn_implementation}) without the window "
              f"differs by {r0:.3e}; eager with it by {re:.1e}")
        assert r0 > 10 * TOL, f"{kind}: the window changes the logits by {r0:.3e} only"
        assert re < TOL, f"{kind}: eager and {model.config._attn_implementation} differ: {re:.3e}"
        if kind == "qwen2_sw":  # and which layers have it matters: all of them is another model
            every = type(model.config).from_pretrained(src)
            every.layer_types = ["sliding_attention"] * every.num_hidden_layers
            windowed = AutoModelForCausalLM.from_config(every).eval()
            windowed.load_state_dict(model.state_dict())
            with torch.no_grad():
                ra = rel(windowed(ids).logits, ref)
            print(f"{kind}: the window in every layer (layer 0 too) differs by {ra:.3e}")
            assert ra > 10 * TOL, f"{kind}: windowing layer 0 changes the logits by {ra:.3e} only"
        # token for token: each position's logits within TOL of its own largest logit
        per = ((kd - ref).abs().amax(-1) / ref.abs().amax(-1)).max().item()
        print(f"{kind}: worst single position {per:.3e}")
        assert per < TOL, f"{kind}: a position differs by {per:.3e}"
        # the first positions (all within the window) are those of full attention
        with torch.no_grad():
            head = unwindowed(ids[:, :SW[kind]]).logits
        assert rel(kd[:, :SW[kind]], head) < TOL, f"{kind}: the positions within the window"

    # the tokenizer files, byte for byte
    with h5py.File(h5, "r") as f:
        stored = {k: bytes(f["tokenizer"][k][()]) for k in f["tokenizer"]}
    assert "tokenizer.json" in stored, sorted(stored)
    for k, v in stored.items():
        assert open(os.path.join(src, k), "rb").read() == v, k
    print(f"{kind}: /tokenizer holds {sorted(stored)} byte for byte")

    # the transformers-4 spelling of the same config gives the same weights file
    if kind == "qwen2" or kind in ROPE_SCALED:
        old = os.path.join(work, f"hf_{kind}_tf4")
        shutil.copytree(src, old)
        c4 = dict(cfg)
        rp = dict(c4.pop("rope_parameters"))
        c4["rope_theta"] = rp.pop("rope_theta")
        if kind in ROPE_SCALED:
            c4["rope_scaling"] = rp
        c4["torch_dtype"] = c4.pop("dtype", "float32")
        json.dump(c4, open(os.path.join(old, "config.json"), "w"))
        run([conv, "from-hf", old, os.path.join(work, f"{kind}_tf4.h5")], log)
        kd4 = logits_of(kdlogits, os.path.join(work, f"{kind}_tf4.h5"), ids, work, "tf4", log)
        assert torch.equal(kd4, kd), "transformers-4 spelling gives other logits"
        print(f"{kind}: transformers-4 config spelling (top-level rope_theta"
              f"{', rope_scaling' if kind in ROPE_SCALED else ''}): same logits")

    # back to Hugging Face, in shards
    back = os.path.join(work, f"hf_back_{kind}")
    out = run([conv, "to-hf", "--max-shard-size", "60KB", h5, back], log)
    index = json.load(open(os.path.join(back, "model.safetensors.index.json")))
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors", files
    b = {}
    for fn in files:
        b.update(load_file(os.path.join(back, fn)))
    total = sum(t.numel() * 4 for t in b.values())
    assert index["metadata"]["total_size"] == total
    a = model.state_dict()
    if model.config.tie_word_embeddings:
        a.pop("lm_head.weight")  # tied: kdtrain stores only the embedding
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    for k in a:
        assert torch.equal(a[k].float(), b[k]), k
    print(f"{kind}: {len(a)} tensors bit for bit in {len(files)} shards after HF -> kdtrain -> HF")
    again = AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    assert again.config.rope_parameters["rope_theta"] == cfg["rope_parameters"]["rope_theta"]
    for k, v in ROPE_SCALED.get(kind, {}).items():
        assert again.config.rope_parameters[k] == v, (k, again.config.rope_parameters)
    assert again.config.rms_norm_eps == 1e-5
    if kind in SW or kind in ("qwen2", "qwen3", "mistral"):  # the same window in each layer
        sw_back, sw = (getattr(c, "sliding_window", None) for c in (again.config, model.config))
        assert sw_back == sw, (sw_back, sw)  # a Mistral without a window comes back as Llama
        assert getattr(again.config, "layer_types", None) == \
            getattr(model.config, "layer_types", None), again.config
        print(f"{kind}: sliding_window {sw_back}, layer_types "
              f"{getattr(again.config, 'layer_types', None)} back as written by transformers")
    with torch.no_grad():
        r2 = rel(again(ids).logits, ref)
    print(f"{kind}: logits of the reloaded model: {r2:.3e}")
    assert r2 == 0.0
    tk = AutoTokenizer.from_pretrained(back)
    assert tk(TEXT)["input_ids"] == tokenizer(TEXT)["input_ids"]
    enc = tk(TEXT, return_tensors="pt")
    gen = again.generate(**enc, max_new_tokens=5, do_sample=False, pad_token_id=tk.eos_token_id)
    assert gen.shape[1] == enc["input_ids"].shape[1] + 5, gen.shape
    print(f"{kind}: AutoTokenizer encodes as the original; generate() -> {tk.decode(gen[0][-5:])!r}")
    return max(r1, 0.0), src


GEMMA = ("gemma3", "gemma3_cap", "gemma3_mm")


def make_gemma(kind, vocab):
    text = dict(vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                query_pre_attn_scalar=20, max_position_embeddings=128, rms_norm_eps=1e-6,
                sliding_window=16, tie_word_embeddings=True,
                layer_types=["sliding_attention", "sliding_attention", "full_attention",
                             "sliding_attention"],
                rope_parameters={
                    "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                final_logit_softcapping=3.0 if kind == "gemma3_cap" else None)
    if kind == "gemma3_mm":
        vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=2, image_size=28, patch_size=14)
        cfg = Gemma3Config(text_config=Gemma3TextConfig(**text), vision_config=vision,
                           mm_tokens_per_image=4)
        model = Gemma3ForConditionalGeneration(cfg).eval()
    else:
        model = AutoModelForCausalLM.from_config(Gemma3TextConfig(**text)).eval()
    with torch.no_grad():  # transformers zero-initialises the (1 + w) norms
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def gemma_case(conv, kdlogits, work, kind, tokenizer, log):
    """Gemma 3: from-hf, the logits, to-hf (a Gemma3ForCausalLM) with the same logits."""
    torch.manual_seed({"gemma3": 7, "gemma3_cap": 8, "gemma3_mm": 9}[kind])
    model = make_gemma(kind, len(tokenizer))
    src = os.path.join(work, f"hf_{kind}")
    model.save_pretrained(src)
    tokenizer.save_pretrained(src)
    h5 = os.path.join(work, f"{kind}.h5")
    out = run([conv, "from-hf", src, h5], log)
    ids = torch.randint(0, len(tokenizer), (3, 40))
    kd = logits_of(kdlogits, h5, ids, work, kind, log)
    if kind == "gemma3_mm":  # saved as the Hub's files are: language_model.model.*
        assert "importing its text model only" in out and "language_model.model." in out, out
        print(f"{kind}: {out.splitlines()[0]}")
        # transformers 5's in-memory names (model.language_model.*) import the same
        other = os.path.join(work, f"hf_{kind}_tf5names")
        shutil.copytree(src, other)
        t = load_file(os.path.join(src, "model.safetensors"))
        renamed = {k.replace("language_model.model.", "model.language_model.", 1)
                   .replace("language_model.lm_head.", "lm_head.", 1): v for k, v in t.items()}
        assert any(k.startswith("model.language_model.") for k in renamed), sorted(renamed)[:5]
        save_file(renamed, os.path.join(other, "model.safetensors"), metadata={"format": "pt"})
        h5b = os.path.join(work, f"{kind}_tf5names.h5")
        out = run([conv, "from-hf", other, h5b], log)
        assert "the tensors under model.language_model." in out, out
        kd5 = logits_of(kdlogits, h5b, ids, work, f"{kind}_tf5", log)
        assert torch.equal(kd5, kd), "model.language_model.* names give other logits"
        print(f"{kind}: the same tensors named model.language_model.*: the same logits")
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    assert kd.shape == ref.shape, (kd.shape, ref.shape)
    r1 = rel(kd, ref)
    print(f"{kind}: kdtrain vs transformers logits (fp32, {tuple(ref.shape)}): {r1:.3e}")
    assert r1 < TOL, f"{kind}: logits differ by {r1:.3e} > {TOL}"
    if kind == "gemma3":  # the windows and the local RoPE base matter at this length
        full = Gemma3TextConfig.from_pretrained(src)
        full.layer_types = ["full_attention"] * full.num_hidden_layers
        unwindowed = AutoModelForCausalLM.from_config(full).eval()
        unwindowed.load_state_dict(model.state_dict())
        with torch.no_grad():
            r0 = rel(unwindowed(ids).logits, ref)
        print(f"{kind}: the same weights with full attention and global RoPE everywhere differ "
              f"by {r0:.3e}")
        assert r0 > 10 * TOL, f"{kind}: the windows change the logits by {r0:.3e} only"

    back = os.path.join(work, f"hf_back_{kind}")
    run([conv, "to-hf", h5, back], log)
    again = AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    assert type(again).__name__ == "Gemma3ForCausalLM", type(again)
    b = load_file(os.path.join(back, "model.safetensors"))
    a = model.state_dict()
    if kind == "gemma3_mm":  # the text model under its language-model prefix
        pre = "model.language_model."
        a = {"model." + k[len(pre):]: v for k, v in a.items() if k.startswith(pre)}
    a.pop("lm_head.weight", None)  # tied: kdtrain stores only the embedding
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    for k in a:
        assert torch.equal(a[k].float(), b[k]), k
    with torch.no_grad():
        r2 = rel(again(ids).logits, ref)
    print(f"{kind}: {len(a)} tensors bit for bit after HF -> kdtrain -> HF; the reloaded "
          f"Gemma3ForCausalLM's logits: {r2:.3e}")
    assert r2 == 0.0
    return r1


def gemma_refusals(conv, work, src, log):
    """Gemma 3 config.json values kdtrain does not compute (or transformers ignores)."""
    base = json.load(open(os.path.join(src, "config.json")))
    rp = base["rope_parameters"]
    cases = [
        ("hidden_activation", '"gelu"', {"hidden_activation": "gelu"}),
        ("attn_logit_softcapping", "50", {"attn_logit_softcapping": 50.0}),
        ("use_bidirectional_attention", "true", {"use_bidirectional_attention": True}),
        ("rope_parameters.sliding_attention.rope_type", '"linear"',
         {"rope_parameters": dict(rp, sliding_attention={"rope_type": "linear", "factor": 2.0,
                                                         "rope_theta": 1e4})}),
        ("layer_types[1]", '"chunked_attention"',
         {"layer_types": ["sliding_attention", "chunked_attention", "full_attention",
                          "sliding_attention"]}),
        ("text_config", "(absent)", {"model_type": "gemma3",
                                     "architectures": ["Gemma3ForConditionalGeneration"]}),
    ]
    for key, value, change in cases:
        d = os.path.join(work, "refuse")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        json.dump(dict(base, **change), open(os.path.join(d, "config.json"), "w"))
        out = os.path.join(work, "refused.h5")
        msg = run([conv, "from-hf", d, out], log, expect=2)
        want = f'"{key}" = {value}'
        assert want in msg and "config.json" in msg, f"message for {key} lacks {want!r}:\n{msg}"
        assert not os.path.exists(out) and not os.path.exists(out + ".tmp"), "wrote output"
        print(f"refused {key} = {value}")


def refusals(conv, work, src, log):
    """config.json values kdtrain does not compute: exit 2 naming key and value."""
    base = json.load(open(os.path.join(src, "config.json")))
    cases = [
        ("rope_parameters.rope_type", '"dynamic"',
         {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e6, "factor": 4.0}}),
        ("rope_scaling.type", '"longrope"',
         {"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}}),
        ("rope_scaling.rope_type", '"su"', {"rope_scaling": {"rope_type": "su", "factor": 2.0}}),
        ("rope_parameters.low_freq_factor", "(absent)",
         {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e6, "factor": 8.0,
                              "high_freq_factor": 4.0}}),
        ("rope_scaling.factor", "0", {"rope_scaling": {"rope_type": "linear", "factor": 0}}),
        ("sliding_window", "0", {"use_sliding_window": True, "sliding_window": 0}),
        ("use_sliding_window", '"yes"', {"use_sliding_window": "yes"}),
        ("max_window_layers", "-1", {"use_sliding_window": True, "sliding_window": 8,
                                     "max_window_layers": -1}),
        ("layer_types[1]", '"sliding_attention"',
         {"layer_types": ["full_attention", "sliding_attention"]}),
        ("layer_types[0]", '"chunked_attention"',
         {"layer_types": ["chunked_attention", "full_attention"]}),
        ("layer_types", '["full_attention"]', {"layer_types": ["full_attention"]}),
        ("layer_types[1]", '"sliding_attention"',
         {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
          "layer_types": ["full_attention", "sliding_attention"]}),
        ("model_type", '"gpt2"', {"model_type": "gpt2"}),
        ("hidden_act", '"gelu"', {"hidden_act": "gelu"}),
        ("head_dim", "15", {"head_dim": 15}),
        ("mlp_bias", "true", {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                              "mlp_bias": True}),
        ("layer_types[0]", '"full_attention"',
         {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 64,
          "layer_types": ["full_attention", "sliding_attention"]}),
        ("sliding_window", "2.5", {"model_type": "mistral", "architectures": ["MistralForCausalLM"],
                                   "sliding_window": 2.5}),
        ("partial_rotary_factor", "0.5",
         {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                              "partial_rotary_factor": 0.5}}),
    ]
    for key, value, change in cases:
        d = os.path.join(work, "refuse")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        cfg = dict(base, **change)
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        out = os.path.join(work, "refused.h5")
        msg = run([conv, "from-hf", d, out], log, expect=2)
        want = f'"{key}" = {value}'
        assert want in msg and "config.json" in msg, f"message for {key} lacks {want!r}:\n{msg}"
        assert not os.path.exists(out) and not os.path.exists(out + ".tmp"), "wrote output"
        print(f"refused {key} = {value}")


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    conv, kdlogits, corpus = sys.argv[1:4]
    work = sys.argv[4] if len(sys.argv) > 4 else tempfile.mkdtemp(prefix="kd_hf_")
    log = open(os.path.join(work, "log.txt"), "w")
    tokenizer = train_tokenizer(corpus, work)
    worst, src = 0.0, None
    for kind in ("qwen2", "llama", "mistral", "llama3", "yarn", "qwen3", "qwen3_tied",
                 "mistral_sw", "qwen2_sw"):
        r, s = case(conv, kdlogits, work, kind, tokenizer, log)
        worst, src = max(worst, r), src or s
    for kind in GEMMA:
        worst = max(worst, gemma_case(conv, kdlogits, work, kind, tokenizer, log))
    gemma_refusals(conv, work, os.path.join(work, "hf_gemma3"), log)
    refusals(conv, work, src, log)
    print(f"hf round trip passed (worst logits relative difference {worst:.3e})")


if __name__ == "__main__":
    main()
