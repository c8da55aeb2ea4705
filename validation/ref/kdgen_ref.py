"""Reference text for validation/e2e/test_kdgen.sh: transformers' own greedy generate()
of a random Qwen2 model with a real byte-level BPE tokenizer (trained here on the start of
input/corpus/kjv-train.txt, with a chat template), decoded by that tokenizer.

    kdgen_ref.py WORK NEW

Writes WORK/hf (model + tokenizer files, for kdconvert from-hf), WORK/prompts.txt (text
prompts, one per line), WORK/chat.jsonl (a "prompt" object and a "messages" chat whose
assistant turn is dropped), and what kdgen must write for them: WORK/want_prompts.jsonl,
WORK/want_chat.jsonl (prompt, text, ids per line) and WORK/want_stdout.txt (the text
output of the first prompt: prompt + continuation). Each prompt is generated alone (batch
1) with the tokenizer's eos as end id, NEW new ids at most; the eos row of the LM head is
1.2 times the row of the 5th id the first prompt gave, so eos comes where that id would
(the first prompt ends early: the end id path is tested)."""
import json
import os
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging


def main():
    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    work, new = sys.argv[1], int(sys.argv[2])
    src = os.environ["KD_SRCDIR"]
    with open(os.path.join(src, "input/corpus/kjv-train.txt"), encoding="utf-8") as f:
        lines = f.read().split("\n")[:4000]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>")
    fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                          "{{ m['content'] }}<|im_end|>\n{% endfor %}"
                          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    hf = os.path.join(work, "hf")
    fast.save_pretrained(hf)
    tok = AutoTokenizer.from_pretrained(hf)

    torch.manual_seed(11)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, tie_word_embeddings=False,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    model = Qwen2ForCausalLM(cfg).float().eval()
    with torch.no_grad():  # peaked logits: a clear largest logit at every step
        for name, p in model.named_parameters():
            if "norm" not in name and not name.endswith("bias"):
                p.normal_(0, 0.5)

    def generate(text, special):
        ids = tok(text, add_special_tokens=special)["input_ids"]
        out = model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
        made = [int(t) for t in out[0, len(ids):]]
        return {"prompt": text, "text": tok.decode(made, skip_special_tokens=True), "ids": made}

    prompts = ["In the beginning God", "And the earth was without form,", "Jesus wept."]
    with torch.no_grad():  # eos where the 5th id of prompt 1 was: an end before NEW ids
        head = model.lm_head.weight
        head[tok.eos_token_id] = 1.2 * head[generate(prompts[0], True)["ids"][4]]
    model.save_pretrained(hf)
    with open(os.path.join(work, "prompts.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(prompts) + "\n")
    want = [generate(p, True) for p in prompts]
    chat = [{"prompt": "Let there be light"},
            {"messages": [{"role": "user", "content": "Who made the heaven?"},
                          {"role": "assistant", "content": "God made it."}]}]
    with open(os.path.join(work, "chat.jsonl"), "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(c) + "\n" for c in chat))
    rendered = tok.apply_chat_template(chat[1]["messages"][:1], tokenize=False,
                                       add_generation_prompt=True)
    want_chat = [generate(chat[0]["prompt"], True), generate(rendered, False)]
    for name, rows in (("want_prompts.jsonl", want), ("want_chat.jsonl", want_chat)):
        with open(os.path.join(work, name), "w", encoding="utf-8") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    with open(os.path.join(work, "want_stdout.txt"), "w", encoding="utf-8") as f:
        f.write(want[0]["prompt"] + want[0]["text"] + "\n")
    ends = sum(r["ids"][-1] == tok.eos_token_id for r in want + want_chat)
    print(f"kdgen_ref: vocabulary {len(tok)}, {len(want) + len(want_chat)} prompts, "
          f"{ends} ended by eos (transformers generate, greedy)")


if __name__ == "__main__":
    main()
