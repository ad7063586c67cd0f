"""computility-run.yaml, typed: the platform's start command, its environment, port and output budget."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness.errors import HarnessError

__all__ = ["RunConfig", "load_run_config", "RUN_CONFIG_NAME"]

RUN_CONFIG_NAME = "computility-run.yaml"


@dataclass(frozen=True)
class RunConfig:
    path: Path
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    port: int | None = None
    workdir: str | None = None
    output_budget_tokens: int | None = None

    def flag(self, name: str) -> str | None:
        """The value after `name` in the command (`--x v` or `--x=v`), or None when absent."""
        for i, arg in enumerate(self.command):
            if arg == name and i + 1 < len(self.command):
                return self.command[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
        return None

    def has(self, name: str) -> bool:
        return any(a == name or a.startswith(name + "=") for a in self.command)


def load_run_config(path: Path) -> RunConfig:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise HarnessError(f"{path} does not exist: the platform needs its run config at the repository root") from None
    except yaml.YAMLError as exc:
        raise HarnessError(f"{path} is not valid YAML ({exc}); fix the syntax") from None
    if not isinstance(data, dict) or not isinstance(data.get("command"), list) or not data["command"]:
        raise HarnessError(f"{path}: `command` must be a non-empty list of strings (the server start command)")
    env = data.get("env") or {}
    if not isinstance(env, dict):
        raise HarnessError(f"{path}: `env` must be a mapping of variable to string value")
    budget = data.get("output_budget_tokens")
    return RunConfig(
        path=path,
        command=tuple(str(a) for a in data["command"]),
        env={str(k): str(v) for k, v in env.items()},
        port=int(data["port"]) if data.get("port") is not None else None,
        workdir=data.get("workdir"),
        output_budget_tokens=int(budget) if budget is not None else None,
    )
