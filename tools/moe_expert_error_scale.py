"""The float32 routed-expert paths' error against the size of the terms (model.moe.experts.experts_magnitude),
and that of a path 1e-5 off: what model/tolerances.py's MOE_EXPERT_PATHS float32 bound is sized from.

    PYTHONPATH=. .venv/bin/python tools/moe_expert_error_scale.py --seed 1 --cases 250

Prints each path's largest error over the cases (against ||reference|| and against the terms), and the spread
of the 1e-5-off path's error against the terms. The first case is one whose output nearly cancels.
"""
from __future__ import annotations

import argparse
import random

import torch

from model.moe import EXPERT_PATHS
from model.moe.experts import experts_magnitude, experts_reference
from tests.numerics.compare import poisoned_like, relative_error
from tests.numerics.moe_cases import ROUTING_PATTERNS, MoECase, make_hidden, make_moe_weights, make_routing

NEARLY_CANCELS = MoECase(tokens=1, experts=26, top_k=1, hidden=9, intermediate=1, shared_intermediate=1,
                         pattern="random", seed=230)


def random_cases(rng: random.Random, n: int) -> list[MoECase]:
    cases = []
    for _ in range(n):
        experts = rng.randint(1, 64)
        top_k = rng.randint(1, min(8, max(1, experts // 2)))
        inter = rng.randint(1, 48)
        pattern = rng.choice(ROUTING_PATTERNS) if experts >= 2 * top_k else "random"
        cases.append(MoECase(tokens=rng.choice([1, 2, 3, rng.randint(1, 24)]), experts=experts, top_k=top_k,
                             hidden=rng.randint(4, 48), intermediate=inter, shared_intermediate=inter,
                             pattern=pattern, seed=rng.randint(0, 2**31)))
    return cases


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cases", type=int, default=250)
    a = p.parse_args()
    paths = [n for n, path in EXPERT_PATHS.items() if path.supports(1, torch.float32, "cpu")]
    worst_ref, worst_terms, off = dict.fromkeys(paths, 0.0), dict.fromkeys(paths, 0.0), []
    for case in [NEARLY_CANCELS, *random_cases(random.Random(a.seed), a.cases)]:
        w, x = make_moe_weights(case, torch.float32), make_hidden(case, torch.float32)
        weights, ids = make_routing(case)
        ref = experts_reference(x, w.w13, w.w2, weights, ids, poisoned_like(x.shape, torch.float64, "cpu"))
        terms = experts_magnitude(x, w.w13, w.w2, weights, ids)
        for name in paths:
            path = EXPERT_PATHS[name]
            if path.supports(case.tokens, torch.float32, "cpu"):
                out = path.fn(x, w.w13, w.w2, weights, ids, poisoned_like(x.shape, torch.float32, "cpu"))
                worst_ref[name] = max(worst_ref[name], relative_error(out, ref))
                worst_terms[name] = max(worst_terms[name], relative_error(out, ref, scale=terms))
        good = EXPERT_PATHS["sorted"].fn(x, w.w13, w.w2, weights, ids, poisoned_like(x.shape, torch.float32, "cpu"))
        off.append(relative_error(good * (1 + 1e-5), ref, scale=terms))
    print(f"{1 + a.cases} cases, float32; largest error per path")
    for name in paths:
        print(f"  {name:16s} against ||reference|| {worst_ref[name]:.2e}   against the terms {worst_terms[name]:.2e}")
    off.sort()
    print(f"a path 1e-5 off, against the terms: min {off[0]:.2e}, median {off[len(off) // 2]:.2e}, max {off[-1]:.2e}")


if __name__ == "__main__":
    main()
