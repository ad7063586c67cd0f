"""A progress bar for long sweeps: tqdm where it is installed (it is a project dependency), else one line
per step on stderr. Steps are sweep points (one token count or batch size, every path at it), or for
--sweep-configs one candidate config at one point (its first point includes compiling it)."""
from __future__ import annotations

import sys
import time

__all__ = ["Progress"]


class Progress:
    def __init__(self, total: int, enabled: bool = True, unit: str = "point"):
        self.total, self.done, self.enabled, self.start = total, 0, enabled, time.monotonic()
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, unit=unit, file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                pass

    def tick(self, label: str) -> None:
        """Called as a step starts: the label says what is being measured now."""
        if not self.enabled:
            return
        if self._bar is not None:
            if self.done:
                self._bar.update(1)
            self._bar.set_description(label)
        else:
            print(f"[{self.done}/{self.total} {time.monotonic() - self.start:6.0f}s] {label}", file=sys.stderr, flush=True)
        self.done += 1

    def close(self) -> None:
        if self._bar is not None:
            self._bar.update(1 if self.done else 0)
            self._bar.close()
