"""Reference for validation/unit/test_moe.c: transformers' own Qwen3MoeSparseMoeBlock
(router: softmax, top-k, renormalised when norm_topk_prob; experts: SwiGLU, fused
gate_up_proj (E, 2I, C) and down_proj (E, C, I) as transformers 5 holds them) on random
weights and inputs, with the load-balancing loss of load_balancing_loss_func over two
calls of the router (two "layers" sharing it), and the gradients of
    L = sum(out1 * R1) + sum(out2 * R2) + coef * aux
with respect to both inputs and every weight.

    moe_ref.py OUT.txt

OUT.txt: "N C I E k norm coef" then, one per line: x1, x2, R1, R2, gate.weight,
gate_up_proj, down_proj, out1, out2, aux (one number), dx1, dx2, dgate, dgate_up, ddown."""
import sys

import torch
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe import modeling_qwen3_moe as m

torch.manual_seed(3)
rows = []
for norm in (True, False):
    N, C, I, E, k, coef = 13, 24, 16, 8, 2, 0.01
    cfg = Qwen3MoeConfig(hidden_size=C, moe_intermediate_size=I, num_experts=E,
                         num_experts_per_tok=k, norm_topk_prob=norm, hidden_act="silu")
    blk = m.Qwen3MoeSparseMoeBlock(cfg).float()
    with torch.no_grad():
        blk.gate.weight.normal_(0, 0.5)
        blk.experts.gate_up_proj.normal_(0, 0.3)
        blk.experts.down_proj.normal_(0, 0.3)
    x1 = torch.randn(1, N, C, requires_grad=True)
    x2 = torch.randn(1, N, C, requires_grad=True)
    R1, R2 = torch.randn(1, N, C), torch.randn(1, N, C)
    o1, o2 = blk(x1), blk(x2)
    g1, _, _ = blk.gate(x1.reshape(-1, C))
    g2, _, _ = blk.gate(x2.reshape(-1, C))
    aux = m.load_balancing_loss_func((g1, g2), E, k)
    L = (o1 * R1).sum() + (o2 * R2).sum() + coef * aux
    L.backward()
    t = [x1, x2, R1, R2, blk.gate.weight, blk.experts.gate_up_proj, blk.experts.down_proj,
         o1, o2, aux, x1.grad, x2.grad, blk.gate.weight.grad, blk.experts.gate_up_proj.grad,
         blk.experts.down_proj.grad]
    rows.append((f"{N} {C} {I} {E} {k} {int(norm)} {coef!r}",
                 [" ".join(f"{v:.9g}" for v in a.detach().reshape(-1).tolist()) for a in t]))
with open(sys.argv[1], "w") as f:
    f.write(f"{len(rows)}\n")
    for head, lines in rows:
        f.write(head + "\n" + "\n".join(lines) + "\n")
