"""Reference continuations for validation/e2e/test_generate.sh: transformers' own greedy
generate() (do_sample=False, the KV cache of each model class) of random models of the
families of ref_step.py (their configurations: non-default sizes, windows shorter than
prompt + continuation, Gemma's pad id 0 and soft caps as set there).

    gen_ref.py WORK NEW FAMILY...

For each FAMILY: WORK/FAMILY/hf (the model), WORK/FAMILY/prompts.txt (three prompts of
different lengths, ids separated by blanks) and WORK/FAMILY/greedy.txt (NEW generated ids
per prompt). No end id stops generation (eos_token_id None)."""
import os
import sys
import zlib

import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_step import FAMILIES  # noqa: E402


def main():
    hf_logging.disable_progress_bar()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    work, new = sys.argv[1], int(sys.argv[2])
    for fam in sys.argv[3:]:
        torch.manual_seed(zlib.crc32(("gen" + fam).encode()) % 100000)
        cfg = FAMILIES[fam][0]("student")
        model = AutoModelForCausalLM.from_config(cfg).float().eval()
        with torch.no_grad():  # peaked logits: a clear largest logit at every step
            for name, p in model.named_parameters():
                if "norm" not in name and not name.endswith("bias"):
                    p.normal_(0, 0.5)
        d = os.path.join(work, fam)
        os.makedirs(d, exist_ok=True)
        model.save_pretrained(os.path.join(d, "hf"))
        model.generation_config.eos_token_id = None
        g = torch.Generator().manual_seed(5)
        prompts = [torch.randint(1, cfg.vocab_size, (n,), generator=g) for n in (5, 11, 1)]
        with open(os.path.join(d, "prompts.txt"), "w") as fp, \
                open(os.path.join(d, "greedy.txt"), "w") as fg:
            for p in prompts:
                out = model.generate(p[None], max_new_tokens=new, min_new_tokens=new,
                                     do_sample=False, pad_token_id=0)
                fp.write(" ".join(str(int(t)) for t in p) + "\n")
                fg.write(" ".join(str(int(t)) for t in out[0, len(p):]) + "\n")
        print(f"{fam}: {len(prompts)} prompts, {new} greedy ids each (transformers generate)")


if __name__ == "__main__":
    main()
