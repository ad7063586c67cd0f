"""The float32 GDN layer's error tail over random seeds: what model/tolerances.py's GDN_LAYER and
GDN_HANDOVER bounds are sized from.

    PYTHONPATH=. .venv/bin/python tools/gdn_error_tail.py --seconds 60

For random (seed, T, split) cases of tests/numerics/test_gdn_layer.py's `layer_case`, it prints the median,
P99 and max of two relative errors: the serving paths' layer against the all-reference float64 layer, and a
prefill split at `split` with the state handed over against one pass.
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import time

import torch

from model.gdn import gdn_layer
from tests.numerics.compare import relative_error
from tests.numerics.test_gdn_layer import layer_case

F32, F64 = torch.float32, torch.float64
TOKENS = (2, 3, 4, 8, 17, 64, 65, 140)  # both sides of a 64-token chunk, and the test's largest T


def _float64(obj):
    return dataclasses.replace(obj, **{f.name: getattr(obj, f.name).to(F64) for f in dataclasses.fields(obj)
                                       if torch.is_tensor(getattr(obj, f.name))})


def measure(seconds: float, seed: int) -> dict[str, list[float]]:
    rng = random.Random(seed)
    errors: dict[str, list[float]] = {"layer vs float64 reference": [], "split prefill vs one pass": []}
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        case, tokens = rng.randrange(2**31), rng.choice(TOKENS)
        split = rng.randrange(1, tokens)
        w, x, state = layer_case(case, 1, tokens, F32)
        ref, _ = gdn_layer(x.to(F64), _float64(w), _float64(state), rule="recurrent_reference",
                           conv="reference", norm="reference")
        whole, _ = gdn_layer(x, w, state)
        first, mid = gdn_layer(x[:, :split], w, state)
        second, _ = gdn_layer(x[:, split:], w, mid)
        errors["layer vs float64 reference"].append(relative_error(whole.to(F64), ref))
        errors["split prefill vs one pass"].append(relative_error(torch.cat([first, second], 1), whole))
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to draw cases (default 60)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the case draw (default 1)")
    a = parser.parse_args()
    for name, values in measure(a.seconds, a.seed).items():
        v = sorted(values)
        n = len(v)
        print(f"{name}: n {n}, median {v[n // 2]:.2e}, P99 {v[int(n * 0.99)]:.2e}, max {v[-1]:.2e}")


if __name__ == "__main__":
    main()
