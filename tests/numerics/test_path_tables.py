"""The path tables of every block (model.dispatch.paths.PathTable): one reference each, registration rules, the
errors a caller gets, and that a module dropped into model/moe/expert_paths/ registers itself."""
from __future__ import annotations

import pkgutil

import pytest
import torch

import model.moe.expert_paths
from model.attention.decode_layer import ATTENTION_DECODE_LAYER_PATHS
from model.attention.layer import ATTENTION_CORES
from model.dispatch.paths import ComputePath, PathTable, always_float64
from model.gdn import CONV_PATHS, GDN_RULE_PATHS
from model.moe import EXPERT_PATHS, MOE_BLOCK_PATHS, ROUTERS
from model.norm.rms_norm import ADD_RMS_NORM_PATHS, GATED_NORM_PATHS, RMS_NORM_PATHS

F32 = torch.float32
TABLES = {
    "experts": EXPERT_PATHS,
    "gdn_rule": GDN_RULE_PATHS,
    "conv": CONV_PATHS,
    "rms_norm": RMS_NORM_PATHS,
    "gated_norm": GATED_NORM_PATHS,
    "add_rms_norm": ADD_RMS_NORM_PATHS,
    "attention": ATTENTION_CORES,
    "attention_decode_layer": ATTENTION_DECODE_LAYER_PATHS,
    "router": ROUTERS,
    "moe_block": MOE_BLOCK_PATHS,
}


def _fn(*args):
    return args


@pytest.mark.parametrize("block", sorted(TABLES))
def test_every_block_has_exactly_one_reference_and_it_is_no_candidate(block):
    table = TABLES[block]
    references = [p.name for p in table.values() if p.is_reference]
    assert references == [table.reference.name], f"{block}: references {references}"
    assert table.reference not in table.candidates()
    assert len(table.candidates()) == len(table) - 1


def test_a_table_refuses_a_taken_name_and_a_second_reference():
    table = PathTable("test path", [ComputePath("ref", _fn, is_reference=True), ComputePath("fast", _fn)])
    with pytest.raises(ValueError, match="'fast' is already registered"):
        table.register(ComputePath("fast", _fn))
    with pytest.raises(ValueError, match="already has its reference 'ref'"):
        table.register(ComputePath("other_ref", _fn, is_reference=True))
    assert list(table) == ["ref", "fast"]


def test_a_table_without_a_reference_says_so():
    with pytest.raises(LookupError, match="no reference test path"):
        PathTable("test path", [ComputePath("fast", _fn)]).reference


def test_paths_for_keeps_the_paths_that_take_the_tokens_dtype_and_device():
    reason = "needs a device this is not"
    table = PathTable("test path", [
        ComputePath("ref", _fn, is_reference=True, output_dtype_rule=always_float64),
        ComputePath("one", _fn, max_tokens=1),
        ComputePath("f32", _fn, dtypes=(F32,)),
        ComputePath("never", _fn, why_unavailable=lambda device, dtype: reason),
    ])
    assert [p.name for p in table.paths_for(1, F32, "cpu")] == ["ref", "one", "f32"]
    assert [p.name for p in table.paths_for(2, torch.bfloat16, "cpu")] == ["ref"]
    assert table["never"].unavailable_reason("cpu", F32) == reason
    assert table["ref"].output_dtype(torch.bfloat16) == torch.float64
    assert table["one"].output_dtype(torch.bfloat16) == torch.bfloat16
    assert table["one"].state_dtype(torch.bfloat16) == F32


def test_a_caller_gets_the_registered_names_and_the_reason_a_path_cannot_run():
    with pytest.raises(KeyError, match="unknown expert path 'no_such'.*'sorted'"):
        EXPERT_PATHS["no_such"]
    with pytest.raises(ValueError, match="'decode_fused' does not support T=2"):
        EXPERT_PATHS.checked("decode_fused", 2, F32, "cpu")
    assert EXPERT_PATHS.checked("sorted", 2, F32, "cpu") is EXPERT_PATHS["sorted"]
    assert not EXPERT_PATHS.can_run("no_such", 1, F32, "cpu") and EXPERT_PATHS.can_run("sorted", 1, F32, "cpu")


@pytest.mark.parametrize("module", sorted(m.name for m in pkgutil.iter_modules(model.moe.expert_paths.__path__)))
def test_every_module_in_the_expert_paths_folder_registers_a_path(module):
    qualified = f"model.moe.expert_paths.{module}"
    assert any(p.fn.__module__ == qualified for p in EXPERT_PATHS.values()), f"{qualified} registered no path"
