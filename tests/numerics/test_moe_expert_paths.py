"""Every registered routed-expert path equals the float64 reference, for every dtype it declares."""
from __future__ import annotations

import pytest
import torch

from model.moe import EXPERT_PATHS
from model import tolerances
from tests.numerics.compare import cpu_supports, poisoned_like
from tests.numerics.moe_cases import MoECase, check_expert_path, make_hidden, make_moe_weights, make_routing

DTYPES = [torch.float64, torch.float32, torch.bfloat16] + ([torch.float16] if cpu_supports(torch.float16) else [])

# Cases kept on purpose: the smallest possible block, and every routing pattern at the largest shape.
EDGE_CASES = (
    MoECase(tokens=1, experts=1, top_k=1, hidden=4, intermediate=1, shared_intermediate=1, pattern="random", seed=0),
    MoECase(tokens=300, experts=64, top_k=8, hidden=64, intermediate=48, shared_intermediate=48, pattern="ties", seed=1),
    MoECase(tokens=300, experts=64, top_k=8, hidden=64, intermediate=48, shared_intermediate=48, pattern="empty_experts", seed=2),
    MoECase(tokens=257, experts=64, top_k=1, hidden=32, intermediate=16, shared_intermediate=16, pattern="one_expert", seed=3),
    # An output that nearly cancels (found by hypothesis; every float32 path read 3.7e-6 against ||reference||):
    # the error is measured against the size of the terms, so the case no longer decides the verdict.
    MoECase(tokens=1, experts=26, top_k=1, hidden=9, intermediate=1, shared_intermediate=1, pattern="random", seed=230),
)


def _supported(path, dtype) -> bool:
    return path.supports(path.min_tokens, dtype, "cpu")


PATH_DTYPES = [
    pytest.param(name, dtype, id=f"{name}-{str(dtype).removeprefix('torch.')}")
    for name, path in sorted(EXPERT_PATHS.items())
    for dtype in DTYPES
    if _supported(path, dtype)
]


def test_every_registered_path_has_a_tolerance_for_each_dtype_it_supports():
    missing = [
        (name, dtype)
        for name, path in EXPERT_PATHS.items()
        for dtype in DTYPES
        if _supported(path, dtype) and dtype not in tolerances.MOE_EXPERT_PATHS.get(name, {})
    ]
    assert not missing, f"add tolerances for {missing} to model/tolerances.py"


@pytest.mark.parametrize(("name", "dtype"), PATH_DTYPES)
def test_expert_path_equals_float64_reference(name, dtype):
    path = EXPERT_PATHS[name]
    examples = tuple(c for c in EDGE_CASES if path.supports(c.tokens, dtype, "cpu"))
    check_expert_path(path, dtype, tolerances.expert_path_tolerance(name, dtype), examples=examples)


@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", sorted(EXPERT_PATHS))
def test_non_finite_token_propagates_to_its_row_only(name, bad_value):
    path = EXPERT_PATHS[name]
    tokens = 1 if path.max_tokens == 1 else 6
    if not path.supports(tokens, torch.float32, "cpu"):
        # The Triton paths run on the CPU only through the interpreter (test_moe_triton_interpreter.py).
        pytest.skip(f"{name} cannot run float32 on this CPU")
    case = MoECase(tokens, experts=8, top_k=2, hidden=16, intermediate=8, shared_intermediate=8, pattern="random", seed=7)
    dtype = torch.float32
    w = make_moe_weights(case, dtype)
    x = make_hidden(case, dtype)
    weights, ids = make_routing(case)
    bad_row = tokens - 1
    x[bad_row, 3] = bad_value
    out = path.fn(x, w.w13, w.w2, weights, ids, poisoned_like(x.shape, dtype, "cpu"))
    assert not torch.isfinite(out[bad_row]).any(), f"{name} masked a {bad_value} in token {bad_row}: {out[bad_row]}"
    assert torch.isfinite(out[:bad_row]).all(), f"{name} leaked {bad_value} from token {bad_row} into other tokens"
