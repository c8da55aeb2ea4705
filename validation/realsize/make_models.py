#!/usr/bin/env python3
"""Random-weight Hugging Face model directories with the real Qwen2.5 or Qwen3
configurations and a byte-level BPE tokenizer trained locally on the embedded corpus.

    make_models.py OUTDIR CORPUS [PAIR]

PAIR qwen2.5 (the default) writes OUTDIR/tok (the tokenizer alone), OUTDIR/qwen2.5-1.5b
(teacher, vocabulary padded to 151936), OUTDIR/qwen2.5-1.5b-v152064 (the same teacher
padded to 152064, as Qwen2.5-7B and larger are) and OUTDIR/qwen2.5-0.5b (student).
PAIR qwen3 writes OUTDIR/tok, OUTDIR/qwen3-1.7b (teacher) and OUTDIR/qwen3-0.6b
(student), by transformers' Qwen3 classes. Weights are stored in BF16 as the published
checkpoints are, by transformers' own save_pretrained."""
import os
import sys
import time

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

# The published config.json values (Qwen/Qwen2.5-1.5B, Qwen/Qwen2.5-0.5B, Qwen/Qwen2.5-7B)
COMMON = dict(hidden_act="silu", rope_theta=1000000.0, rms_norm_eps=1e-6,
              max_position_embeddings=32768, use_sliding_window=False,
              sliding_window=32768, attention_dropout=0.0,
              bos_token_id=151643, eos_token_id=151643)
CONFIGS = {
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         max_window_layers=21, tie_word_embeddings=True),
    "qwen2.5-1.5b-v152064": dict(vocab_size=152064, hidden_size=1536, intermediate_size=8960,
                                 num_hidden_layers=28, num_attention_heads=12,
                                 num_key_value_heads=2, max_window_layers=21,
                                 tie_word_embeddings=True),
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         max_window_layers=21, tie_word_embeddings=True),
}
# The published config.json values of Qwen/Qwen3-1.7B and Qwen/Qwen3-0.6B (doc/models.md)
QWEN3_COMMON = dict(hidden_act="silu", rope_theta=1000000.0, rms_norm_eps=1e-6,
                    max_position_embeddings=40960, head_dim=128, attention_bias=False,
                    use_sliding_window=False, sliding_window=None, max_window_layers=28,
                    attention_dropout=0.0, tie_word_embeddings=True,
                    bos_token_id=151643, eos_token_id=151645)
QWEN3_CONFIGS = {
    "qwen3-1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8),
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8),
}
PAIRS = {"qwen2.5": (Qwen2Config, Qwen2ForCausalLM, COMMON, CONFIGS),
         "qwen3": (Qwen3Config, Qwen3ForCausalLM, QWEN3_COMMON, QWEN3_CONFIGS)}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_tokenizer(corpus, out):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([corpus], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", model_max_length=32768)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def main():
    out, corpus = sys.argv[1], sys.argv[2]
    pair = sys.argv[3] if len(sys.argv) > 3 else "qwen2.5"
    config_class, model_class, common, configs = PAIRS[pair]
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    tok = make_tokenizer(corpus, os.path.join(out, "tok"))
    eod = tok.convert_tokens_to_ids("<|endoftext|>")
    print(f"tokenizer: {len(tok)} ids, trained in {time.time() - t0:.1f} s", flush=True)
    torch.manual_seed(0)
    for name, cfg in configs.items():
        t0 = time.time()
        c = config_class(**common, **cfg)
        c.bos_token_id = c.eos_token_id = eod
        model = model_class._from_config(c, dtype=torch.bfloat16)
        d = os.path.join(out, name)
        model.save_pretrained(d)
        tok.save_pretrained(d)
        n = sum(p.numel() for p in model.parameters())
        print(f"{name}: {n / 1e9:.3f} B parameters, written in {time.time() - t0:.1f} s",
              flush=True)
        del model


if __name__ == "__main__":
    main()
