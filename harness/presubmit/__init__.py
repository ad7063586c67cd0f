"""`qwen36 presubmit`: one go/no-go table before the platform image is pushed.

Static checks first (line endings, Dockerfile, run config, chat template, plugin status, no shadowing vllm/,
profiling off), then the CPU suites in a pytest subprocess. Any no-go makes the verdict no-go; the CLI exits 1.

May import: `errors`, `paths`, `patches`, `model`. Not `gates` or `tune`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import names
from .checks import STATIC_CHECKS, CheckResult, Context, run_static
from .suites import check_suites
from .template_check import check_chat_template

__all__ = ["CheckResult", "Context", "Verdict", "ALL_STATIC_CHECKS", "run_presubmit", "format_verdict"]

ALL_STATIC_CHECKS = STATIC_CHECKS[:3] + (check_chat_template,) + STATIC_CHECKS[3:]


@dataclass(frozen=True)
class Verdict:
    results: tuple[CheckResult, ...]
    suites_skipped: bool

    @property
    def go(self) -> bool:
        return all(r.go for r in self.results)


def run_presubmit(root: Path, skip_suites: bool = False, server_url: str | None = None,
                  checks=None, api_key: str | None = None) -> Verdict:
    ctx = Context(root, server_url, api_key)
    results = run_static(ctx, checks or ALL_STATIC_CHECKS)
    if not skip_suites:
        if all(r.go for r in results):
            results.append(check_suites(ctx))
        else:  # the suites take minutes; a static no-go already decides
            results.append(CheckResult(names.SUITES, False, "not run: fix the static no-go rows first"))
    return Verdict(tuple(results), skip_suites)


def format_verdict(verdict: Verdict) -> str:
    width = max(len(r.name) for r in verdict.results)
    lines = [f"{'check'.ljust(width)}  result  detail"]
    for r in verdict.results:
        lines.append(f"{r.name.ljust(width)}  {'go    ' if r.go else 'NO-GO '}  {r.detail}")
    if verdict.go:
        lines.append("verdict: GO" + (" (static checks only: --skip-suites)" if verdict.suites_skipped else ""))
    else:
        lines.append(f"verdict: NO-GO ({', '.join(r.name for r in verdict.results if not r.go)})")
    return "\n".join(lines)
