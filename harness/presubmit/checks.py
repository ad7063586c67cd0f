"""The static presubmit checks. Each is declared under its row name (names.py) with `presubmit_check`, takes
the checkout's `Context` and returns (go, detail); its detail names the file and the fix on a no-go."""
from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from harness.errors import HarnessError
from model.dispatch.env import TRUE_VALUES, EnvValueError, parse_bool
from model.dispatch.nvidia_defaults import NVIDIA_PREFIX
from model.dispatch.table import TABLE_ENV, load_dispatch_table
from patches.model_paths import served_gdn, served_moe, served_norms
from patches.model_paths.step_slowdown import SLOWDOWN_ENV, SLOWDOWN_FILE_ENV
from patches.settings import PatchSettings

from . import names
from .dockerfile import Dockerfile, parse_dockerfile
from .runconfig import RUN_CONFIG_NAME, RunConfig, load_run_config

__all__ = ["CheckResult", "Context", "STATIC_CHECKS", "PLATFORM_MIN_INPUT_TOKENS", "presubmit_check"]

# The platform's longest scored input (its 235K+ input window, docs/design.md); the context must hold it plus the
# output budget.
PLATFORM_MIN_INPUT_TOKENS = 235_000
# Files the image build or the platform reads or executes: a CRLF in any of them broke the build twice.
BUILD_FILE_PATTERNS = ("Dockerfile", RUN_CONFIG_NAME, ".dockerignore", ".gitattributes", "Makefile", ".ci/run",
                       "*.sh", "patches/*.jinja", "patches/*.py")
_SKIP_DIRS = {".git", ".venv", "runs", "node_modules", "__pycache__", ".pytest_cache", ".hypothesis",
              ".ruff_cache", "build", "dist"}
_SKIP_PREFIXES = ("fixtures/presubmit/",)  # the broken fixtures are broken on purpose
PROFILING_SWITCHES = re.compile(r"^(PROF_(TRACE|MOE_SUMMARY|MOE_SYNC)|ENGINEX_PROFILE_(DECODE|SYNC))$")
PROFILING_REQUIRED_OFF = ("PROF_TRACE", "PROF_MOE_SUMMARY")  # explicitly 0 in production (docs/design.md)
TEST_ONLY_SLOWDOWN = (SLOWDOWN_ENV, SLOWDOWN_FILE_ENV)  # never in the platform image, whatever the value
_DEFAULT_ON_IN_CODE = re.compile(
    r"""environ\.get\(\s*["'](PROF_\w+|ENGINEX_PROFILE_\w+)["']\s*,\s*["'](""" + "|".join(TRUE_VALUES) + r""")["']""")
SERVED_PATCHES = (served_norms, served_gdn, served_moe)  # each with its PATCH and the table BLOCKS it serves
_NETWORK_RUN = re.compile(r"\b(curl|wget|git\s+clone|apt-get\s+install|apt\s+install)\b")


@dataclass(frozen=True)
class CheckResult:
    name: str
    go: bool
    detail: str


def presubmit_check(name: str):
    """Declares a check under its row name (one of names.CHECK_NAMES): the function returns (go, detail), the
    declared check a CheckResult of that name; a HarnessError it raises (an unreadable run config) is that
    row's no-go."""
    def declare(check):
        @functools.wraps(check)
        def run(*args, **kwargs) -> CheckResult:
            try:
                go, detail = check(*args, **kwargs)
            except HarnessError as exc:
                go, detail = False, str(exc)
            return CheckResult(name, go, detail)

        run.check_name = name
        return run

    return declare


class Context:
    """One checkout under test: its root and the files presubmit reads, parsed once."""

    def __init__(self, root: Path, server_url: str | None = None, api_key: str | None = None):
        self.root = Path(root).resolve()
        self.server_url = server_url
        self.api_key = api_key  # for --server-url; handed to the suites' pytest in its environment, not its argv

    @cached_property
    def run_config(self) -> RunConfig:
        return load_run_config(self.root / RUN_CONFIG_NAME)

    @cached_property
    def dockerfile(self) -> Dockerfile:
        return parse_dockerfile(self.root / "Dockerfile")

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def build_files(self) -> list[Path]:
        found = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            rel_dir = "" if rel_dir == "." else rel_dir + "/"
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS
                           and not any((rel_dir + d + "/").startswith(p) for p in _SKIP_PREFIXES)]
            for name in filenames:
                rel = rel_dir + name
                if any(_matches(p, rel) for p in BUILD_FILE_PATTERNS):
                    found.append(self.root / rel)
        return sorted(found)


def _matches(pattern: str, rel: str) -> bool:
    """gitattributes-style: a pattern without '/' matches the basename at any depth."""
    pattern = pattern.lstrip("/")
    if "/" not in pattern.rstrip("/"):
        return fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], pattern)
    if pattern.startswith("**/"):
        return fnmatch.fnmatchcase(rel, pattern[3:]) or fnmatch.fnmatchcase(rel, pattern)
    return fnmatch.fnmatchcase(rel, pattern)


def _gitattributes_lf(root: Path) -> list[tuple[str, bool]] | None:
    """(pattern, gives eol=lf) per line, in order; later lines win, as in git. None if the file is missing."""
    path = root / ".gitattributes"
    if not path.exists():
        return None
    rules = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        attrs = parts[1:]
        if "eol=lf" in attrs:
            rules.append((parts[0], True))
        elif any(a in ("eol=crlf", "-text", "binary", "-eol") for a in attrs):
            rules.append((parts[0], False))
    return rules


@presubmit_check(names.LINE_ENDINGS)
def check_line_endings(ctx: Context) -> tuple[bool, str]:
    rules = _gitattributes_lf(ctx.root)
    if rules is None:
        return False, (".gitattributes is missing: add `Dockerfile text eol=lf`, `*.sh text eol=lf`, "
                       "`*.yaml text eol=lf`, `*.jinja text eol=lf` (a CRLF script broke the image build)")
    crlf, unruled = [], []
    files = ctx.build_files()
    for path in files:
        rel = ctx.rel(path)
        if b"\r\n" in path.read_bytes():
            crlf.append(rel)
        lf = False
        for pattern, gives_lf in rules:
            if _matches(pattern, rel):
                lf = gives_lf
        if not lf:
            unruled.append(rel)
    problems = []
    if crlf:
        problems.append(f"CRLF line endings in {', '.join(crlf)}: convert them (dos2unix FILE or "
                        "`sed -i 's/\\r$//' FILE`)")
    if unruled:
        problems.append(f".gitattributes gives no `eol=lf` to {', '.join(unruled)}: add a `PATTERN text eol=lf` line")
    if problems:
        return False, "; ".join(problems)
    return True, f"{len(files)} build files LF, all covered by .gitattributes eol=lf"


def _template_copy_source(ctx: Context) -> tuple[Path | None, str]:
    """The checkout file the Dockerfile copies to the run config's --chat-template path."""
    target = ctx.run_config.flag("--chat-template")
    if not target:
        return None, f"{RUN_CONFIG_NAME} gives no --chat-template"
    for copy in ctx.dockerfile.copies():
        for src in copy.sources:
            dest = copy.dest
            if dest.endswith("/"):
                dest = dest + Path(src).name
            if dest == target:
                return ctx.root / src, ""
    return None, (f"the Dockerfile copies nothing to {target}, the --chat-template path of {RUN_CONFIG_NAME}: "
                  f"add `COPY patches/chat_template.jinja {target}` or fix the path")


@presubmit_check(names.DOCKERFILE)
def check_dockerfile(ctx: Context) -> tuple[bool, str]:
    df, rc = ctx.dockerfile, ctx.run_config
    problems = []
    names = [i for i, _ in df.instructions]
    if "FROM" not in names:
        problems.append("no FROM")
    else:
        before = df.instructions[: names.index("FROM")]
        base_arg = any(i == "ARG" and v.split("=", 1)[0].strip() == "BASE_IMAGE" for i, v in before)
        from_value = df.values("FROM")[0]
        if not base_arg or "BASE_IMAGE" not in from_value:
            problems.append("the base image must come from `ARG BASE_IMAGE=...` before `FROM ${BASE_IMAGE}`")
    for copy in df.copies():
        for src in copy.sources:
            if not (ctx.root / src).exists():
                problems.append(f"COPY source {src} does not exist in the build context")
    template, why = _template_copy_source(ctx)
    if template is None:
        problems.append(why)
    if df.cmd is None:
        problems.append(f"no CMD: give the {RUN_CONFIG_NAME} command in exec form")
    elif not df.cmd_is_exec_form:
        problems.append("CMD is in shell form: use the JSON exec form so it can be compared and signals reach vLLM")
    elif df.cmd != rc.command:
        shortest = min(len(df.cmd), len(rc.command))
        diff = next((i for i, (a, b) in enumerate(zip(df.cmd, rc.command)) if a != b), shortest)
        problems.append(f"CMD differs from the {RUN_CONFIG_NAME} command at argument {diff} "
                        f"({df.cmd[diff:diff + 2]} vs {rc.command[diff:diff + 2]}): make them the same")
    port_flag = rc.flag("--port")
    if rc.port is not None and rc.port not in df.exposed_ports():
        problems.append(f"EXPOSE {sorted(df.exposed_ports())} does not include the run config's port {rc.port}")
    if rc.port is not None and port_flag is not None and port_flag != str(rc.port):
        problems.append(f"--port {port_flag} in the command differs from port: {rc.port}")
    workdirs = df.values("WORKDIR")
    if rc.workdir and (not workdirs or workdirs[-1].rstrip("/") != rc.workdir.rstrip("/")):
        last = workdirs[-1] if workdirs else None
        problems.append(f"WORKDIR {last} differs from the run config's workdir {rc.workdir}")
    for key, value in rc.env.items():
        if df.envs.get(key) != value:
            problems.append(f"ENV {key}={df.envs.get(key)!r} differs from the run config's {value!r}")
    runs = df.values("RUN")
    if not any("patches.verify" in r for r in runs):
        problems.append("no RUN step verifies the plugin: add `RUN python3 -m patches.verify`")
    for r in runs:
        if _NETWORK_RUN.search(r) or ("pip install" in r and "--no-index" not in r):
            problems.append(f"RUN reaches the network ({r[:60]}...): install from the build context with "
                            "pip --no-index --no-deps")
    if problems:
        return False, "; ".join(problems)
    return True, (f"parsed {len(df.instructions)} instructions; base from ARG BASE_IMAGE; "
                  f"template -> {rc.flag('--chat-template')}; CMD, EXPOSE {rc.port}, WORKDIR and ENV agree")


def installed_parser_names() -> tuple[set[str], set[str]] | None:
    """(tool parsers, reasoning parsers) the installed vLLM registers, or None without vLLM."""
    try:
        import vllm.reasoning  # noqa: F401 - importing registers the lazy parsers
        import vllm.tool_parsers  # noqa: F401
        from vllm.reasoning.abs_reasoning_parsers import ReasoningParserManager
        from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
    except ImportError:
        return None
    tools = set(getattr(ToolParserManager, "tool_parsers", {})) | set(getattr(ToolParserManager, "lazy_parsers", {}))
    reasoning = (set(getattr(ReasoningParserManager, "reasoning_parsers", {}))
                 | set(getattr(ReasoningParserManager, "lazy_parsers", {})))
    return tools, reasoning


@presubmit_check(names.RUN_CONFIG)
def check_run_config(ctx: Context) -> tuple[bool, str]:
    rc = ctx.run_config
    problems, notes = [], []
    budget = rc.output_budget_tokens
    if budget is None:
        problems.append("output_budget_tokens is missing: give the longest max_tokens the platform asks for")
    try:
        context = int(rc.flag("--max-model-len") or 0)
    except ValueError:
        context = 0
    need = PLATFORM_MIN_INPUT_TOKENS + (budget or 0)
    if context < need:
        problems.append(f"--max-model-len {context or 'missing'} < {PLATFORM_MIN_INPUT_TOKENS} input + {budget} "
                        f"output = {need}: raise it (the settled value is 245000)")
    if not rc.flag("--max-num-batched-tokens"):
        problems.append("--max-num-batched-tokens is missing (the settled value is 16384)")
    for flag in ("--enforce-eager", "--enable-prefix-caching", "--enable-auto-tool-choice"):
        if not rc.has(flag):
            problems.append(f"{flag} is missing")
    if not rc.flag("--chat-template"):
        problems.append("--chat-template is missing")
    tool, reasoning = rc.flag("--tool-call-parser"), rc.flag("--reasoning-parser")
    if not tool or not reasoning:
        problems.append("--tool-call-parser and --reasoning-parser must both be given (qwen3_coder, qwen3)")
    names = installed_parser_names()
    if names is None:
        notes.append("parser names not checked: no vLLM installed")
    else:
        if tool and tool not in names[0]:
            problems.append(f"tool parser {tool!r} does not exist in the installed vLLM "
                            f"(known: {', '.join(sorted(names[0]))})")
        if reasoning and reasoning not in names[1]:
            problems.append(f"reasoning parser {reasoning!r} does not exist in the installed vLLM "
                            f"(known: {', '.join(sorted(names[1]))})")
    problems += patch_switch_problems(rc.env)
    if problems:
        return False, "; ".join(problems)
    return True, "; ".join([f"context {context} >= {PLATFORM_MIN_INPUT_TOKENS} + {budget}",
                            f"batched {rc.flag('--max-num-batched-tokens')}", f"parsers {tool}/{reasoning}",
                            "every required patch's switch on", *notes])


def patch_switch_problems(env: dict[str, str]) -> list[str]:
    """What keeps a required patch of patches/catalog.py off in `env` (the run config's environment), read as
    the plugin reads it (patches/settings.py: QWEN36_PATCHES, then each patch's own switch): a new patch is
    checked here without a line in this file."""
    from patches.catalog import PATCHES
    from patches.settings import PATCH_SET_ENV, PatchSettings

    try:
        settings = PatchSettings.from_env(env, PATCHES)
    except ValueError as exc:  # a switch or an MoE knob the plugin would refuse; the message names it
        return [f"{RUN_CONFIG_NAME}: {exc}"]
    problems = []
    for patch in (p for p in PATCHES if p.required and not settings.is_on(p.name)):
        if patch.switch in env:
            fix = f"{patch.switch} is {env[patch.switch]!r}: unset it or set it to \"1\""
        else:
            fix = f"set {PATCH_SET_ENV}: all (or {patch.switch}: \"1\")"
        problems.append(f"{RUN_CONFIG_NAME} leaves required patch {patch.name} off: {fix}")
    return problems


@presubmit_check(names.NO_VLLM_SHADOW)
def check_no_vllm_shadow(ctx: Context) -> tuple[bool, str]:
    shadows = [p for p in ("vllm", "vllm.py") if (ctx.root / p).exists()]
    if shadows:
        return False, (f"{', '.join(shadows)} at the repository root shadows the installed vLLM for a server "
                       "started there (docs/design.md: 'invalid tool call parser: qwen3_coder'): remove or rename it")
    return True, "no vllm/ or vllm.py at the repository root"


@presubmit_check(names.PROFILING_OFF)
def check_profiling_off(ctx: Context) -> tuple[bool, str]:
    problems = []
    env = ctx.run_config.env
    for key in PROFILING_REQUIRED_OFF:
        if env.get(key) is None:
            problems.append(f"{RUN_CONFIG_NAME} does not set {key}: set it to \"0\" explicitly")
    for where, mapping in ((RUN_CONFIG_NAME, env), ("Dockerfile ENV", ctx.dockerfile.envs)):
        for key, value in mapping.items():
            if not PROFILING_SWITCHES.match(key):
                continue
            try:
                if parse_bool(key, str(value)):
                    problems.append(f"{where} turns profiling on ({key}={value}): set it to 0")
            except EnvValueError as exc:
                problems.append(f"{where}: {exc}")
    for where, mapping in ((RUN_CONFIG_NAME, env), ("Dockerfile ENV", ctx.dockerfile.envs)):
        for key in TEST_ONLY_SLOWDOWN:  # patches/model_paths/step_slowdown.py: every engine step slower on purpose
            if key in mapping:
                problems.append(f"{where} sets {key}, the perf gates' test-only step slowdown: remove it")
    for pkg in ("model", "patches", "harness"):
        for path in sorted((ctx.root / pkg).rglob("*.py")) if (ctx.root / pkg).exists() else []:
            for m in _DEFAULT_ON_IN_CODE.finditer(path.read_text(errors="replace")):
                problems.append(f"{ctx.rel(path)} defaults {m.group(1)} on: make the default \"0\"")
    if problems:
        return False, "; ".join(problems)
    return True, (f"{', '.join(PROFILING_REQUIRED_OFF)} = 0; no profiling switch on in the run config, Dockerfile "
                  "or code defaults; no test-only step slowdown")


@presubmit_check(names.PLUGIN_STATUS)
def check_plugin_status(ctx: Context) -> tuple[bool, str]:
    """Load the plugin through vLLM's own loader in a fresh interpreter, with the run config's environment,
    from a folder without a checkout (as the platform starts it); every required patch must apply."""
    env = {**os.environ, **ctx.run_config.env}
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run([sys.executable, "-m", "patches.verify", "--json"], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=600)
    try:
        rows = json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"patches.verify exited {proc.returncode}: {tail}"
    summary = ", ".join(f"{r['name']} {r['state']}" for r in rows)
    missing = [r for r in rows if r["required"] and r["state"] != "applied"]
    if proc.returncode != 0 or missing:
        why = "; ".join(f"required patch {r['name']} is {r['state']}: {r['detail']}" for r in missing)
        return False, why or f"patches.verify exited {proc.returncode}"
    return True, (f"{summary} ({rows[0]['vllm'] if rows else 'no patches'}), loaded by vLLM's plugin loader with "
                  "the run config's environment")


@presubmit_check(names.SERVED_BLOCKS)
def check_served_blocks(ctx: Context) -> tuple[bool, str]:
    """Which served blocks (docs/patches-and-presubmit.md, the served blocks) the platform image would leave to
    vLLM's own layer for want of a table row. Never a no-go: vLLM's own layer is right, only not the measured
    choice. The platform's GPU is no NVIDIA one, so its table is the run config's QWEN36_DISPATCH_TABLE, else
    any other device's table the image ships (fixtures/dispatch, which the Dockerfile copies)."""
    env = ctx.run_config.env
    settings = PatchSettings.from_env(env)
    on = [p for p in SERVED_PATCHES if settings.is_on(p.PATCH.name)]
    if not on:
        return True, "no served-block patch is on in the run config: vLLM's own layers serve every block"
    table_setting = env.get(TABLE_ENV, "").strip()
    if table_setting.lower() == "off":
        tables, where = [], f"{TABLE_ENV}=off in the run config"
    elif table_setting:
        path = Path(table_setting)
        local = ctx.root / path.relative_to("/opt/qwen36") if path.is_relative_to("/opt/qwen36") else path
        if not local.is_file():
            return False, f"the run config's {TABLE_ENV}={table_setting} is no table here ({local})"
        tables, where = [load_dispatch_table(local)], str(table_setting)
    else:
        directory = ctx.root / "fixtures" / "dispatch"
        tables = [load_dispatch_table(f) for f in sorted(directory.glob("*.json"))]
        tables = [t for t in tables if not t.device.startswith(NVIDIA_PREFIX)]
        where = f"{ctx.rel(directory)} (no table there for a device other than NVIDIA's)" if not tables else \
            ", ".join(f"{t.device} ({Path(t.source).name})" for t in tables)
    blocks = [block for patch in on for block in patch.BLOCKS]
    missing = [b for b in blocks if not any(t.blocks.get(b) for t in tables)]
    if not missing:
        return True, f"every served block has a row in {where}: {', '.join(blocks)}"
    return True, (f"vLLM's own layer serves {', '.join(missing)} for want of a table row ({where}); record one on "
                  "the BI-V100 box with `qwen36 tune` (it writes fixtures/dispatch/<device>.json, which the image "
                  "copies) and rebuild")


STATIC_CHECKS = (check_line_endings, check_dockerfile, check_run_config, check_no_vllm_shadow,
                 check_profiling_off, check_plugin_status, check_served_blocks)


def run_static(ctx: Context, checks=None) -> list[CheckResult]:
    return [check(ctx) for check in checks or STATIC_CHECKS]
