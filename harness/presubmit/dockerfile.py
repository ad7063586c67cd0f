"""The Dockerfile, read with a real parser (dockerfile-parse: continuation lines, JSON forms, ENV forms)."""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError

__all__ = ["Dockerfile", "parse_dockerfile", "Copy"]


@dataclass(frozen=True)
class Copy:
    sources: tuple[str, ...]
    dest: str


@dataclass(frozen=True)
class Dockerfile:
    path: Path
    instructions: tuple[tuple[str, str], ...]  # (INSTRUCTION, value) in order, comments dropped
    envs: dict[str, str]
    cmd: tuple[str, ...] | None  # exec form only; a shell-form CMD is reported as a problem
    cmd_is_exec_form: bool

    def values(self, instruction: str) -> list[str]:
        return [v for i, v in self.instructions if i == instruction]

    def copies(self) -> list[Copy]:
        out = []
        for value in self.values("COPY") + self.values("ADD"):
            parts = [p for p in _split(value) if not p.startswith("--")]
            if len(parts) >= 2:
                out.append(Copy(tuple(parts[:-1]), parts[-1]))
        return out

    def exposed_ports(self) -> set[int]:
        ports = set()
        for value in self.values("EXPOSE"):
            for p in value.split():
                try:
                    ports.add(int(p.split("/")[0]))
                except ValueError:
                    pass
        return ports


def _split(value: str) -> list[str]:
    value = value.strip()
    if value.startswith("["):
        try:
            return [str(x) for x in json.loads(value)]
        except json.JSONDecodeError:
            pass
    return shlex.split(value)


def parse_dockerfile(path: Path) -> Dockerfile:
    path = Path(path)
    if not path.exists():
        raise HarnessError(f"{path} does not exist: the platform builds the image from it")
    from dockerfile_parse import DockerfileParser

    try:
        parser = DockerfileParser(path=str(path))
        structure = parser.structure
        envs = dict(parser.envs)
    except Exception as exc:  # the parser's own errors are plain exceptions
        raise HarnessError(f"{path} does not parse ({type(exc).__name__}: {exc}); fix its syntax") from None
    instructions = tuple((s["instruction"].upper(), s["value"]) for s in structure if s["instruction"] != "COMMENT")
    cmd, exec_form = None, False
    cmds = [v for i, v in instructions if i == "CMD"]
    if cmds:
        try:
            parsed = json.loads(cmds[-1])
            cmd, exec_form = tuple(str(x) for x in parsed), True
        except json.JSONDecodeError:
            cmd = tuple(shlex.split(cmds[-1]))
    return Dockerfile(path, instructions, envs, cmd, exec_form)
