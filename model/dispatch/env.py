"""Reading a boolean from the environment: the one parser the MoE knobs, the patch switches and presubmit use.

A value is read with surrounding spaces and case ignored: 1, true, yes, on mean on; 0, false, no, off mean
off. An unset variable takes the caller's default. An empty value is refused, not read as off or as the
default: the platform's env files (computility-run.yaml, the Dockerfile's ENV) give every switch as an
explicit "0" or "1", so an empty one is a mistake (a dropped value, `ENV X=${UNSET}`), and guessing would
silently turn a patch or a knob off. Anything else is refused too; the error names the variable and the
accepted values.
"""
from __future__ import annotations

from typing import Mapping

__all__ = ["TRUE_VALUES", "FALSE_VALUES", "EnvValueError", "parse_bool", "env_bool"]

TRUE_VALUES = ("1", "true", "yes", "on")
FALSE_VALUES = ("0", "false", "no", "off")


class EnvValueError(ValueError):
    """An environment variable has a value its reader cannot use; the message names it and the fix."""


def parse_bool(name: str, raw: str, error: type[ValueError] = EnvValueError) -> bool:
    """`raw`, the value of variable `name`, as a boolean; raises `error` (the caller's own error type) if
    it is none of the accepted values."""
    value = raw.strip().lower()
    if value in TRUE_VALUES:
        return True
    if value in FALSE_VALUES:
        return False
    empty = "; an empty value is not off: unset the variable for its default" if not value else ""
    raise error(f"{name}={raw!r} is not a boolean: set it to 1 or 0 (accepted: 1 (on) or 0 (off), true/false, "
                f"yes/no, on/off, in any case){empty}")


def env_bool(env: Mapping[str, str], name: str, default: bool, error: type[ValueError] = EnvValueError) -> bool:
    """The boolean `env[name]`, or `default` when the variable is unset."""
    raw = env.get(name)
    return default if raw is None else parse_bool(name, raw, error)
