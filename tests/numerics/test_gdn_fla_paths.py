"""fla-core's GDN paths on a machine without CUDA: registered, unavailable with a reason, never needing fla.

Their numerics run gpu-marked in test_gdn_paths_gpu.py; here the CPU suite checks the registry's honesty and
that a CPU run never imports fla (fla-core is an optional extra, absent from CPU environments).
"""
from __future__ import annotations

import sys

import pytest
import torch

from model.gdn import GDN_RULE_PATHS, GDNState, gdn_layer, run_gdn_rule
from model.gdn import fla_paths
from tests.numerics.gdn_attention_cases import TINY_GDN, generator, random_gdn_weights, randn, rule_inputs

FLA_PATHS = ("fla_chunk", "fla_recurrent")


@pytest.fixture
def fla_blocked(monkeypatch):
    """`import fla` fails as on a CPU install without the extra (a None entry in sys.modules blocks it)."""
    monkeypatch.setitem(sys.modules, "fla", None)
    fla_paths._fla_import_error.cache_clear()
    yield
    fla_paths._fla_import_error.cache_clear()


@pytest.mark.parametrize("name", FLA_PATHS)
def test_fla_paths_are_registered_and_unavailable_on_cpu_with_the_reason(name):
    path = GDN_RULE_PATHS[name]
    for dtype in path.dtypes:
        why = path.unavailable_reason("cpu", dtype)
        assert why is not None and "CUDA" in why, f"{name} {dtype} on cpu: {why!r}"
        assert not path.supports(1, dtype, "cpu")


@pytest.mark.parametrize("name", FLA_PATHS)
def test_running_an_fla_path_on_cpu_raises_with_the_reason(name):
    q, k, v, g, beta = rule_inputs(generator(0), 1, 3, TINY_GDN, GDN_RULE_PATHS[name].dtypes[-1])
    with pytest.raises(ValueError, match="need a CUDA device"):
        run_gdn_rule(name, q, k, v, g, beta)


@pytest.mark.parametrize("name", FLA_PATHS)
def test_without_fla_installed_a_cuda_device_gets_the_install_hint(name, fla_blocked):
    """The other reason: on a CUDA device without fla-core (no GPU is needed to ask)."""
    why = GDN_RULE_PATHS[name].unavailable_reason(torch.device("cuda"), torch.bfloat16)
    assert why is not None and "fla-core cannot be imported" in why and "[gpu]" in why, why


def test_a_cpu_layer_runs_without_fla(fla_blocked):
    """The whole GDN layer on CPU, prefill then a decode step, with fla unimportable: the dispatcher never
    reaches for it and the paths' availability checks never import it."""
    gen = generator(1)
    w = random_gdn_weights(gen, TINY_GDN, torch.float32)
    state = GDNState.zeros(1, TINY_GDN, torch.float32)
    y, state = gdn_layer(randn(gen, 1, 5, TINY_GDN.hidden_size), w, state)
    y1, _ = gdn_layer(randn(gen, 1, 1, TINY_GDN.hidden_size), w, state)
    assert torch.isfinite(y).all() and torch.isfinite(y1).all()
    for name in FLA_PATHS:
        GDN_RULE_PATHS[name].unavailable_reason("cpu", torch.bfloat16)
    assert sys.modules["fla"] is None, "something imported fla on the CPU path"
