"""The MoE knobs are read in one place, with defaults from the notes and errors that name the fix."""
from __future__ import annotations

import pytest

from model.moe import MoEConfig, MoEConfigError


def test_defaults_are_the_settled_values_of_the_notes():
    assert MoEConfig.from_env({}) == MoEConfig(
        native=True, decode_native=True, tiny_impl="tokenwise", tiny_max=4, prefill_impl="sorted"
    )


def test_every_knob_is_read():
    env = {
        "MOE_NATIVE": "1",
        "MOE_DECODE_NATIVE": "off",
        "ENGINEX_MOE_TINY_IMPL": "BMM",
        "ENGINEX_MOE_TINY_MAX": " 8 ",
        "ENGINEX_MOE_PREFILL_IMPL": "grouped_mm",
    }
    assert MoEConfig.from_env(env) == MoEConfig(True, False, "bmm", 8, "grouped_mm")


@pytest.mark.parametrize("raw", ["0", "false", "No", "OFF"])
def test_false_spellings_disable_native(raw):
    assert MoEConfig.from_env({"MOE_NATIVE": raw}).native is False


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MOE_NATIVE": "maybe"}, r"MOE_NATIVE='maybe' is not a boolean: set it to 1 or 0"),
        ({"MOE_DECODE_NATIVE": ""}, r"MOE_DECODE_NATIVE='' is not a boolean"),
        ({"ENGINEX_MOE_TINY_IMPL": "fast"}, r"ENGINEX_MOE_TINY_IMPL='fast' is not one of bmm, tokenwise"),
        ({"ENGINEX_MOE_TINY_MAX": "four"}, r"ENGINEX_MOE_TINY_MAX='four' is not an integer"),
        ({"ENGINEX_MOE_TINY_MAX": "-1"}, r"ENGINEX_MOE_TINY_MAX=-1 is out of range: use 0 \(off\) to 4096"),
        ({"ENGINEX_MOE_PREFILL_IMPL": "loop"}, r"ENGINEX_MOE_PREFILL_IMPL='loop' is not one of grouped_mm, sorted"),
    ],
)
def test_bad_values_are_rejected_with_the_variable_and_the_fix(env, message):
    with pytest.raises(MoEConfigError, match=message):
        MoEConfig.from_env(env)


def test_process_environment_is_the_default_source(monkeypatch):
    monkeypatch.setenv("ENGINEX_MOE_TINY_MAX", "2")
    assert MoEConfig.from_env().tiny_max == 2
