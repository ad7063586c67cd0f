"""The plugin's typed settings: the only place the patch set reads its environment.

Each variable takes 1/0 (or on/off, true/false, yes/no); each defaults to 0, so an unset environment leaves
vLLM exactly as installed (a stock server). computility-run.yaml (the platform) and the embedded test server
(harness.server.embedded_config) turn every one on.

| variable                         | field                    | what it turns on                                |
|----------------------------------|--------------------------|-------------------------------------------------|
| QWEN36_PATCH_MOE                 | moe_experts              | routed experts of Qwen3-Next / Qwen3.5 MoE      |
|                                  |                          | layers computed by model.moe.dispatch_experts   |
| QWEN36_PATCH_OBJECT_TOOL_ARGS    | object_tool_arguments    | assistant tool-call `arguments` as a JSON object|
|                                  |                          | accepted, same prompt as the string form        |
| QWEN36_PATCH_STREAM_TOOL_MARKER  | stream_tool_marker       | a streamed forced tool call's spelled-out       |
|                                  |                          | `<tool_call>` opens the call, not content       |
| QWEN36_PATCH_TRUNCATED_TOOL_ARGS | truncated_tool_arguments | a non-stream tool call cut before its end keeps |
|                                  |                          | its truncated arguments text (not `{}`)         |
| QWEN36_PATCH_NONSTREAM_TRAILING_CONTENT | nonstream_trailing_content | text after a tool call kept in the   |
|                                  |                          | non-stream content, as the stream sends it      |
| QWEN36_PATCH_OPENAI_ERRORS       | openai_errors            | error bodies: OpenAI `type` and `param`         |

The MoE dispatcher's own knobs (MOE_NATIVE, ENGINEX_MOE_TINY_IMPL, ...) stay in model.moe.MoEConfig; with
MOE_NATIVE=0 the substitution stays off and vLLM's fused MoE runs, as that config documents.

`QWEN36_PATCH_TABLE_LOGGED` is not a setting: the plugin sets it after logging the status table so the
engine processes vLLM spawns (which inherit the environment and load the plugin again) do not repeat it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

from model.moe import MoEConfig

__all__ = ["MOE_ENV", "OBJECT_TOOL_ARGS_ENV", "STREAM_TOOL_MARKER_ENV", "TRUNCATED_TOOL_ARGS_ENV",
           "NONSTREAM_TRAILING_CONTENT_ENV", "OPENAI_ERRORS_ENV", "API_PATCH_ENVS", "TABLE_LOGGED_ENV",
           "PatchSettings", "PatchSettingsError"]

MOE_ENV = "QWEN36_PATCH_MOE"
OBJECT_TOOL_ARGS_ENV = "QWEN36_PATCH_OBJECT_TOOL_ARGS"
STREAM_TOOL_MARKER_ENV = "QWEN36_PATCH_STREAM_TOOL_MARKER"
TRUNCATED_TOOL_ARGS_ENV = "QWEN36_PATCH_TRUNCATED_TOOL_ARGS"
NONSTREAM_TRAILING_CONTENT_ENV = "QWEN36_PATCH_NONSTREAM_TRAILING_CONTENT"
OPENAI_ERRORS_ENV = "QWEN36_PATCH_OPENAI_ERRORS"
# The API server's request-compatibility patches (field name -> variable).
API_PATCH_ENVS = {
    "object_tool_arguments": OBJECT_TOOL_ARGS_ENV,
    "stream_tool_marker": STREAM_TOOL_MARKER_ENV,
    "truncated_tool_arguments": TRUNCATED_TOOL_ARGS_ENV,
    "nonstream_trailing_content": NONSTREAM_TRAILING_CONTENT_ENV,
    "openai_errors": OPENAI_ERRORS_ENV,
}
TABLE_LOGGED_ENV = "QWEN36_PATCH_TABLE_LOGGED"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class PatchSettingsError(ValueError):
    """A patch variable has a value the plugin cannot use; the message names the variable and the fix."""


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise PatchSettingsError(f"{name}={raw!r} is not a boolean: set it to 1 (on) or 0 (off)")


@dataclass(frozen=True)
class PatchSettings:
    moe_experts: bool = False  # opt-in: off leaves vLLM exactly as installed
    moe: MoEConfig = field(default_factory=MoEConfig)  # the dispatcher's knobs, read by their own config
    object_tool_arguments: bool = False
    stream_tool_marker: bool = False
    truncated_tool_arguments: bool = False
    nonstream_trailing_content: bool = False
    openai_errors: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "PatchSettings":
        env = os.environ if environ is None else environ
        api = {name: _parse_bool(var, env.get(var, "0")) for name, var in API_PATCH_ENVS.items()}
        return cls(moe_experts=_parse_bool(MOE_ENV, env.get(MOE_ENV, "0")), moe=MoEConfig.from_env(env), **api)


def table_already_logged(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(TABLE_LOGGED_ENV) == "1"


def mark_table_logged() -> None:
    os.environ[TABLE_LOGGED_ENV] = "1"  # inherited by the engine processes vLLM starts after this
