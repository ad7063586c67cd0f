"""From a config sweep's measurements to its result: per token count the fastest correct config next to the
registered one, and the config table to paste into the kernel's module.

A candidate's `path` is its constructor expression (`DecodeConfig(block_i=2, block_n=16)`, fields at their
defaults left out), so the report names each config the way the module writes it. Candidates rank as tune
ranks paths (table.ranked: graph replay where wanted and captured, else eager; only outputs within the bound
count), and a point's winner holds from that point up to the next measured one, as in the dispatch table.
The table to paste takes a winner only where it is clearly faster than the registered config (its upper
quartile below the registered one's lower quartile); elsewhere it keeps the registered config, so that a
re-tune does not churn the tables over differences inside the timing spread.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..measure.point import Measurement
from ..table.build import ranked

__all__ = ["config_expr", "PointChoice", "choose", "pasteable_table", "summary_lines", "OPEN_END"]

OPEN_END = "1 << 30"  # how the modules write "every larger T"
WIDTH = 116  # the modules' line length


def config_expr(config) -> str:
    """`Type(field=value, ...)` with the fields that differ from the dataclass defaults, in field order."""
    args = [f"{f.name}={getattr(config, f.name)!r}" for f in dataclasses.fields(config)
            if getattr(config, f.name) != f.default]
    return f"{type(config).__name__}({', '.join(args)})"


@dataclass(frozen=True)
class PointChoice:
    tokens: int
    registered: str | None  # its config's expression; None if it was not measured here
    registered_time: dict | None  # {"us", "mode"} when its output was correct
    registered_status: str  # ok | wrong | error | not measured, with the detail
    winner: dict | None  # {"path", "us", "mode"}: the fastest correct candidate, None if none was correct
    counts: dict[str, int]  # status -> candidates
    chosen: str | None = None  # what the table to paste serves here: the winner if clearly faster, else registered

    @property
    def speedup(self) -> float | None:
        """Registered time over the winner's: how much pasting the winner saves at this point."""
        if self.winner is None or self.registered_time is None:
            return None
        return self.registered_time["us"] / self.winner["us"]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self) | {"speedup": self.speedup}


def choose(rows: list[Measurement], block: str, prefer_graph: bool) -> dict[int, PointChoice]:
    """Token count -> the choice there, for every point the block measured."""
    fastest = ranked(rows, block, prefer_graph)
    out = {}
    for key in sorted({r.key for r in rows if r.block == block}):
        here = [r for r in rows if r.block == block and r.key == key]
        registered = next((r for r in here if r.extra.get("registered")), None)
        best = registered.best(prefer_graph) if registered else None
        status = "not measured" if registered is None else (
            registered.status if not registered.detail else f"{registered.status}: {registered.detail}")
        counts = {s: sum(r.status == s for r in here) for s in ("ok", "wrong", "error")}
        winner = fastest[key][0] if key in fastest else None
        chosen = winner["path"] if winner else None
        if winner and best and winner["path"] != registered.path:
            winner_row = next(r for r in here if r.path == winner["path"])
            if not _clearly_faster(getattr(winner_row, winner["mode"]), getattr(registered, best[1])):
                chosen = registered.path
        out[key] = PointChoice(key, registered.path if registered else None,
                               {"us": round(best[0], 2), "mode": best[1]} if best else None, status,
                               winner, counts, chosen)
    return out


def _clearly_faster(candidate, registered) -> bool:
    """Timings (median and quartiles): the candidate's slower quarter beats the registered one's faster quarter."""
    return candidate.p75_us < registered.p25_us


def pasteable_table(name: str, config_type: str, winners: dict[int, str]) -> str:
    """The module's table for these winners (token count -> config expression): each serves from its point up
    to the next one (the first also below it, the last above it), neighbours with one config merged."""
    keys = sorted(winners)
    entries: list[list[str]] = []
    for i, key in enumerate(keys):
        upper = str(keys[i + 1] - 1) if i + 1 < len(keys) else OPEN_END
        if entries and entries[-1][1] == winners[key]:
            entries[-1][0] = upper
        else:
            entries.append([upper, winners[key]])
    lines = [f"{name}: tuple[tuple[int, {config_type}], ...] = ("]
    lines += [_entry(upper, expr) for upper, expr in entries]
    return "\n".join(lines + [")"])


def _entry(upper: str, expr: str) -> str:
    """`    (upper, Type(a=1, b=2)),` wrapped after an argument where it would pass WIDTH."""
    head = f"    ({upper}, "
    type_name, _, args = expr.partition("(")
    indent = " " * (len(head) + len(type_name) + 1)
    lines, line = [], head + type_name + "("
    parts = args.removesuffix(")").split(", ") if args != ")" else []
    for i, part in enumerate(parts):
        piece = part + ("," if i + 1 < len(parts) else "")
        if line.endswith("(") or len(line) + 1 + len(piece) <= WIDTH:
            line += ("" if line.endswith("(") else " ") + piece
        else:
            lines.append(line)
            line = indent + piece
    return "\n".join(lines + [line + ")),"])


def _time(t: dict | None) -> str:
    return "-" if t is None else f"{t['us']:,.1f} ({t['mode']})"


def summary_lines(choices: dict[int, PointChoice]) -> list[str]:
    """A Markdown table: per token count the registered config and the winner, with their times."""
    lines = ["| T | registered config | us | fastest correct config | us | registered / fastest | clearly faster "
             "| ok / wrong / error |", "|---:|---|---:|---|---:|---:|---|---|"]
    for key, c in choices.items():
        winner = "none correct" if c.winner is None else (
            "the registered one" if c.winner["path"] == c.registered else c.winner["path"])
        registered = c.registered or "-"
        if c.registered and c.registered_time is None:
            registered += f" ({c.registered_status})"
        ratio = "-" if c.speedup is None else f"{c.speedup:.2f}x"
        clear = "-" if c.winner is None or c.winner["path"] == c.registered else (
            "yes" if c.chosen == c.winner["path"] else "no: within the spread, registered kept")
        lines.append(f"| {key} | {registered} | {_time(c.registered_time)} | {winner} | {_time(c.winner)} | {ratio} "
                     f"| {clear} | {c.counts['ok']} / {c.counts['wrong']} / {c.counts['error']} |")
    return lines
