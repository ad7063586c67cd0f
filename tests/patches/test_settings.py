"""The settings read every patch's switch from the catalog: a new patch is its module and one catalog line.

The throwaway patch here is a real module written to a temporary folder (its seam a class of its own), added
to the catalog as a new patch would be; nothing else is edited, and the settings, the table, the off row and
the embedded server's environment all pick it up. No vLLM needed."""
from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

pytest.importorskip("torch", reason="the patch catalog imports the MoE patch, which needs torch")

from patches import catalog  # noqa: E402
from patches.core.registry import PatchState, apply_patches, format_table  # noqa: E402
from patches.settings import PATCH_SET_ENV, PatchSettings, PatchSettingsError, api_patch_switches  # noqa: E402

THROWAWAY = '''
"""A throwaway API patch: Greeter.greet answers in capitals."""
from patches.core import seams


class Greeter:
    def greet(self, name):
        return f"hello {name}"


def _wrap(original):
    def greet(self, name):
        return original(self, name).upper()
    return greet


PATCH = seams.api_patch(
    "shout", "QWEN36_PATCH_TEST_SHOUT", "Greeter.greet", lambda: seams.first_problem(f"{__name__}:Greeter.greet"),
    (seams.WrappedMethod(f"{__name__}:Greeter", "greet", _wrap),), "greetings in capitals")
'''


@pytest.fixture
def shout(tmp_path, monkeypatch):
    """The throwaway patch's module, and the catalog with its one line added."""
    (tmp_path / "throwaway_shout.py").write_text(textwrap.dedent(THROWAWAY))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("throwaway_shout")
    monkeypatch.setattr(catalog, "PATCHES", (*catalog.PATCHES, module.PATCH))
    yield module
    module.PATCH.uninstall()
    sys.modules.pop("throwaway_shout", None)


def test_a_new_patch_is_its_module_and_one_catalog_line(shout):
    settings = PatchSettings.from_env({"QWEN36_PATCH_TEST_SHOUT": "1"})
    assert settings.is_on("shout") and not settings.is_on("moe_experts")
    rows = {r.name: r for r in apply_patches(settings)}
    assert rows["shout"].state is PatchState.APPLIED and rows["shout"].detail == "greetings in capitals"
    assert shout.Greeter().greet("ada") == "HELLO ADA"
    assert "greetings in capitals" in format_table(list(rows.values()), version="vllm 9.9")
    shout.PATCH.uninstall()
    assert shout.Greeter().greet("ada") == "hello ada"

    [off] = apply_patches(PatchSettings.from_env({}), (shout.PATCH,))
    assert off.state is PatchState.OFF and off.detail == "QWEN36_PATCH_TEST_SHOUT=1 turns it on"
    assert shout.Greeter().greet("ada") == "hello ada"
    with pytest.raises(PatchSettingsError, match="QWEN36_PATCH_TEST_SHOUT='loud' is not a boolean"):
        PatchSettings.from_env({"QWEN36_PATCH_TEST_SHOUT": "loud"})


def test_a_new_api_patch_is_on_in_the_embedded_server(shout, tmp_path, monkeypatch):
    from harness.serving.launcher import embedded_config

    assert api_patch_switches()["shout"] == "QWEN36_PATCH_TEST_SHOUT"
    monkeypatch.delenv("QWEN36_PATCH_TEST_SHOUT", raising=False)
    assert embedded_config(tmp_path).env["QWEN36_PATCH_TEST_SHOUT"] == "1"


def test_a_seam_that_is_gone_is_not_applicable(shout, monkeypatch):
    monkeypatch.delattr(shout.Greeter, "greet")
    [row] = apply_patches(PatchSettings.from_env({"QWEN36_PATCH_TEST_SHOUT": "1"}), (shout.PATCH,))
    assert row.state is PatchState.NOT_APPLICABLE and "has no greet" in row.detail


def test_a_switch_default_is_the_patch_own(monkeypatch):
    """An unset switch takes the default its patch declares (every patch of the set: 0, a stock vLLM)."""
    from dataclasses import replace

    default_on = replace(catalog.PATCHES[1], name="default_on", default=True)
    assert PatchSettings.from_env({}, (default_on,)).is_on("default_on")
    assert not PatchSettings.from_env({default_on.switch: "0"}, (default_on,)).is_on("default_on")
    assert not any(PatchSettings.from_env({}).switches.values())


def test_settings_for_other_patches_say_so():
    settings = PatchSettings.from_env({}, (catalog.PATCHES[0],))
    with pytest.raises(KeyError, match="openai_errors is not one of those these settings were read for"):
        settings.is_on("openai_errors")


def test_the_catalog_keeps_its_switch_names_and_each_is_declared_once():
    """The switches are a public interface (computility-run.yaml, the Dockerfile, users' scripts)."""
    switches = {p.name: p.switch for p in catalog.PATCHES}
    assert switches == {
        "moe_experts": "QWEN36_PATCH_MOE",
        "moe_router": "QWEN36_PATCH_ROUTER",
        "served_norms": "QWEN36_PATCH_SERVED_NORMS",
        "served_gdn": "QWEN36_PATCH_SERVED_GDN",
        "served_moe": "QWEN36_PATCH_SERVED_MOE",
        "object_tool_arguments": "QWEN36_PATCH_OBJECT_TOOL_ARGS",
        "stream_tool_marker": "QWEN36_PATCH_STREAM_TOOL_MARKER",
        "truncated_tool_arguments": "QWEN36_PATCH_TRUNCATED_TOOL_ARGS",
        "nonstream_trailing_content": "QWEN36_PATCH_NONSTREAM_TRAILING_CONTENT",
        "openai_errors": "QWEN36_PATCH_OPENAI_ERRORS",
        "openai_error_codes": "QWEN36_PATCH_OPENAI_ERROR_CODES",
    }
    assert len(set(switches.values())) == len(catalog.PATCHES) == len(switches)
    assert all(p.default is False for p in catalog.PATCHES)
    assert [n for n, p in zip(switches, catalog.PATCHES) if p.kind == "api"] == list(api_patch_switches())


def test_the_patch_set_all_turns_every_patch_on_a_new_one_included(shout):
    settings = PatchSettings.from_env({PATCH_SET_ENV: "all"})
    assert settings.is_on("shout") and all(settings.switches.values())
    assert all(PatchSettings.from_env({PATCH_SET_ENV: " ALL "}).switches.values())


def test_a_patch_own_switch_wins_over_the_patch_set(shout):
    settings = PatchSettings.from_env({PATCH_SET_ENV: "all", "QWEN36_PATCH_TEST_SHOUT": "0"})
    assert not settings.is_on("shout")
    assert [n for n, on in settings.switches.items() if not on] == ["shout"]
    assert PatchSettings.from_env({PATCH_SET_ENV: "openai_errors", "QWEN36_PATCH_TEST_SHOUT": "1"}).is_on("shout")


def test_the_patch_set_may_list_patches_by_name(shout):
    settings = PatchSettings.from_env({PATCH_SET_ENV: "shout, openai_errors"})
    assert {n for n, on in settings.switches.items() if on} == {"shout", "openai_errors"}


@pytest.mark.parametrize("raw, why", [("", "is empty"), (" , ", "is empty"), ("everything", "names no patch 'everything'"),
                                      ("shout,nope", "names no patch 'nope'")])
def test_a_patch_set_naming_no_patch_is_refused_with_the_known_names(shout, raw, why):
    with pytest.raises(PatchSettingsError) as err:
        PatchSettings.from_env({PATCH_SET_ENV: raw})
    assert why in str(err.value) and "set it to all or to a comma-separated list of" in str(err.value)
    assert all(p.name in str(err.value) for p in catalog.PATCHES)


def test_a_new_required_patch_is_on_in_the_platform_run_config_without_a_line_there(shout):
    """computility-run.yaml sets QWEN36_PATCHES=all: presubmit finds the new patch on, and its own switch off
    in the run config is named."""
    from harness.paths import REPO_ROOT
    from harness.presubmit.checks import patch_switch_problems
    from harness.presubmit.runconfig import load_run_config

    env = load_run_config(REPO_ROOT / "computility-run.yaml").env
    assert PatchSettings.from_env(env).is_on("shout")
    assert patch_switch_problems(env) == []
    [problem] = patch_switch_problems({**env, "QWEN36_PATCH_TEST_SHOUT": "0"})
    assert "leaves required patch shout off: QWEN36_PATCH_TEST_SHOUT is '0'" in problem
    assert patch_switch_problems({**env, PATCH_SET_ENV: "nope"})[0].startswith("computility-run.yaml: QWEN36_PATCHES='nope'")
