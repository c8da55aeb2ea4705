#!/usr/bin/env python3
"""torch_gemm: torch.mm at the shapes of validation/perf/gemm_kd, FP32 and bfloat16, for
the side-by-side GEMM table (validation/perf/gemm_table).

    torch_gemm.py [--threads T] [--reps R] name:ta:tb:M:N:K:beta ...

Each shape is C (M x N) = op(A) op(B) (+ C when beta is 1), op a transposed view where ta /
tb say so (the operand stored as kdtrain stores it), computed by torch.mm(out=C) or
C.addmm_: in float32, and in bfloat16 (operands and C bfloat16, FP32 accumulation inside:
what autocast runs). One warm-up call, then R timed calls; one line per shape and
precision, as gemm_kd prints them:

    gemm NAME ta tb M N K fp32|bf16 T median_gflops best_gflops cpu_gflops

(cpu_gflops: the median by the process's CPU time / T, at most the wall time).
"""
import argparse
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("shapes", nargs="+")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(1)
    for spec in a.shapes:
        name, ta, tb, M, N, K, beta = spec.split(":")
        ta, tb, M, N, K, beta = int(ta), int(tb), int(M), int(N), int(K), float(beta)
        A32 = torch.rand((K, M) if ta else (M, K), generator=g) - 0.5
        B32 = torch.rand((N, K) if tb else (K, N), generator=g) - 0.5
        C32 = torch.rand((M, N), generator=g) - 0.5
        flop = 2.0 * M * N * K
        for prec, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            A, B, C = A32.to(dt), B32.to(dt), C32.to(dt)
            opA, opB = (A.t() if ta else A), (B.t() if tb else B)
            wall, cpu = [], []
            for r in range(a.reps + 1):
                t0, c0 = time.perf_counter(), time.process_time()
                if beta:
                    C.addmm_(opA, opB)
                else:
                    torch.mm(opA, opB, out=C)
                dt_w = time.perf_counter() - t0
                dt_c = (time.process_time() - c0) / a.threads
                if r:
                    wall.append(flop / dt_w / 1e9)
                    cpu.append(flop / min(dt_c, dt_w) / 1e9)
            print(f"gemm {name} {ta} {tb} {M} {N} {K} {prec} {a.threads} "
                  f"{statistics.median(wall):.1f} {max(wall):.1f} {statistics.median(cpu):.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
