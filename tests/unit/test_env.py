"""model/dispatch/env.py: the one boolean parser of the MoE knobs, the patch switches and presubmit."""
from __future__ import annotations

import pytest

from model.dispatch.env import EnvValueError, env_bool, parse_bool
from model.moe import MoEConfig, MoEConfigError


@pytest.mark.parametrize("raw", ["1", " 1 ", "true", "TRUE", "yes", "Yes", "on", "ON\n"])
def test_on_spellings(raw):
    assert parse_bool("X", raw) is True


@pytest.mark.parametrize("raw", ["0", " 0", "false", "False", "no", "off", "OFF "])
def test_off_spellings(raw):
    assert parse_bool("X", raw) is False


@pytest.mark.parametrize("raw", ["", "   "])
def test_an_empty_value_is_refused_not_read_as_off(raw):
    with pytest.raises(EnvValueError, match=r"X='\s*' is not a boolean.*an empty value is not off: unset"):
        parse_bool("X", raw)


@pytest.mark.parametrize("raw", ["maybe", "2", "enabled", "1.0", "y"])
def test_junk_names_the_variable_and_the_accepted_values(raw):
    with pytest.raises(EnvValueError) as caught:
        parse_bool("QWEN36_SOMETHING", raw)
    message = str(caught.value)
    assert message.startswith(f"QWEN36_SOMETHING={raw!r} is not a boolean: set it to 1 or 0")
    assert all(word in message for word in ("true/false", "yes/no", "on/off"))


def test_the_callers_error_type_is_raised():
    with pytest.raises(MoEConfigError):
        parse_bool("X", "maybe", MoEConfigError)


def test_unset_takes_the_default_and_set_is_parsed():
    assert env_bool({}, "X", True) is True and env_bool({}, "X", False) is False
    assert env_bool({"X": "off"}, "X", True) is False and env_bool({"X": "on"}, "X", False) is True
    with pytest.raises(EnvValueError, match="X=''"):
        env_bool({"X": ""}, "X", True)


def test_the_three_readers_agree_on_empty_and_junk():
    """The MoE knobs, the patch switches and presubmit's profiling check all refuse "" and junk."""
    pytest.importorskip("torch", reason="the patch settings import the catalog, which needs torch")
    from harness.presubmit.checks import patch_switch_problems
    from patches.settings import PatchSettings, PatchSettingsError

    for raw in ("", "maybe"):
        with pytest.raises(MoEConfigError, match="is not a boolean"):
            MoEConfig.from_env({"MOE_NATIVE": raw})
        with pytest.raises(PatchSettingsError, match="is not a boolean"):
            PatchSettings.from_env({"QWEN36_PATCH_MOE": raw})
        assert any("is not a boolean" in p for p in patch_switch_problems({"QWEN36_PATCH_MOE": raw}))
    assert MoEConfig.from_env({"MOE_NATIVE": " On "}).native is True
    assert PatchSettings.from_env({"QWEN36_PATCH_MOE": " On "}).is_on("moe_experts")
