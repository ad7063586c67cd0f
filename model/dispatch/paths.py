"""One path table for every block: the registered ways to compute a block, and what each supports.

Every block (routed experts, gated delta rule, short conv, norms, attention core) keeps one `PathTable` of
`ComputePath` records. A record says what a path takes (token counts per call, dtypes), whether it can run
on a device and why not, whether it is the block's definition (`is_reference`), and the dtypes of the
outputs and state its caller allocates. Tests, the dispatchers and `qwen36 tune` walk the tables, so a path
is tested, dispatchable and timed the moment it is registered.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, MutableMapping

import torch

__all__ = [
    "ALL_FLOATS",
    "LOW_PRECISION",
    "ComputePath",
    "PathTable",
    "always_float64",
    "compute_dtype",
    "import_submodules",
    "same_as_input",
]

LOW_PRECISION = (torch.float32, torch.bfloat16, torch.float16)
ALL_FLOATS = LOW_PRECISION + (torch.float64,)

DtypeRule = Callable[[torch.dtype], torch.dtype]
# Why a path cannot run on (device, dtype), or None when it can: for paths that need a GPU or an optional library.
WhyUnavailable = Callable[[torch.device, torch.dtype], "str | None"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64 (the reference precision); every lower precision computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def same_as_input(dtype: torch.dtype) -> torch.dtype:
    return dtype


def always_float64(dtype: torch.dtype) -> torch.dtype:
    return torch.float64


@dataclass(frozen=True)
class ComputePath:
    """A registered way to compute one block, and what it supports."""

    name: str
    fn: Callable
    description: str = ""
    min_tokens: int = 1
    max_tokens: int | None = None  # None: no upper bound
    dtypes: tuple[torch.dtype, ...] = ALL_FLOATS
    why_unavailable: WhyUnavailable | None = None
    # The block's definition: what every other path is checked against; never a serving candidate.
    is_reference: bool = False
    # The dtypes a caller allocates for the path's output and carried state, from the input dtype.
    output_dtype_rule: DtypeRule = same_as_input
    state_dtype_rule: DtypeRule = compute_dtype

    def output_dtype(self, input_dtype: torch.dtype) -> torch.dtype:
        return self.output_dtype_rule(input_dtype)

    def state_dtype(self, input_dtype: torch.dtype) -> torch.dtype:
        return self.state_dtype_rule(input_dtype)

    def takes_tokens(self, num_tokens: int) -> bool:
        return num_tokens >= self.min_tokens and (self.max_tokens is None or num_tokens <= self.max_tokens)

    def unavailable_reason(self, device: torch.device | str, dtype: torch.dtype) -> str | None:
        """None when the path can run on this device and dtype (for the token counts it takes), else why not."""
        if dtype not in self.dtypes:
            return f"{dtype} is not one of its dtypes {self.dtypes}"
        if self.why_unavailable is not None:
            return self.why_unavailable(torch.device(device), dtype) or None
        return None

    def supports(self, num_tokens: int, dtype: torch.dtype, device: torch.device | str) -> bool:
        return self.takes_tokens(num_tokens) and self.unavailable_reason(device, dtype) is None

    def limits(self) -> str:
        return f"tokens {self.min_tokens}..{self.max_tokens or 'any'}, dtypes {self.dtypes}"


class PathTable(MutableMapping[str, ComputePath]):
    """name -> ComputePath for one block, in registration order.

    `register` adds a path (refusing a taken name or a second reference); item assignment replaces one
    (tests swap in wrapped paths with `unittest.mock.patch.dict`).
    """

    def __init__(self, what: str, paths: Iterable[ComputePath] = ()):
        self.what = what  # "expert path", "conv path", ...: how error messages name a path of this block
        self._paths: dict[str, ComputePath] = {}
        for path in paths:
            self.register(path)

    def register(self, path: ComputePath) -> ComputePath:
        if path.name in self._paths:
            raise ValueError(f"{self.what} {path.name!r} is already registered")
        if path.is_reference and any(p.is_reference for p in self._paths.values()):
            raise ValueError(f"{self.what} {path.name!r}: the table already has its reference {self.reference.name!r}")
        self._paths[path.name] = path
        return path

    @property
    def reference(self) -> ComputePath:
        for path in self._paths.values():
            if path.is_reference:
                return path
        raise LookupError(f"no reference {self.what} is registered")

    def candidates(self) -> list[ComputePath]:
        """Every path but the reference: what dispatch tables and tuning choose between."""
        return [p for p in self._paths.values() if not p.is_reference]

    def paths_for(self, num_tokens: int, dtype: torch.dtype, device: torch.device | str) -> list[ComputePath]:
        return [p for p in self._paths.values() if p.supports(num_tokens, dtype, device)]

    def can_run(self, name: str, num_tokens: int, dtype: torch.dtype, device: torch.device | str) -> bool:
        """Whether `name` is registered and supports this input (a dispatch table may name any string)."""
        return name in self._paths and self._paths[name].supports(num_tokens, dtype, device)

    def checked(self, name: str, num_tokens: int, dtype: torch.dtype, device: torch.device | str) -> ComputePath:
        """The path called `name`, after checking it can run this input (the error says why not)."""
        path = self[name]
        if not path.supports(num_tokens, dtype, device):
            why = path.unavailable_reason(device, dtype)
            raise ValueError(
                f"{self.what} {name!r} does not support T={num_tokens} {dtype} on {device} "
                f"({path.limits()}{'; ' + why if why else ''}); pick another path"
            )
        return path

    def __getitem__(self, name: str) -> ComputePath:
        try:
            return self._paths[name]
        except KeyError:
            raise KeyError(f"unknown {self.what} {name!r}; registered: {sorted(self._paths)}") from None

    def __setitem__(self, name: str, path: ComputePath) -> None:
        self._paths[name] = path

    def __delitem__(self, name: str) -> None:
        del self._paths[name]

    def __contains__(self, name: object) -> bool:
        return name in self._paths

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)

    def __repr__(self) -> str:
        return f"PathTable({self.what!r}, {list(self._paths)})"


def import_submodules(package: str, search_path) -> None:
    """Import every module of a package (sorted by name), so that each registers its paths on import."""
    for info in sorted(pkgutil.iter_modules(search_path), key=lambda m: m.name):
        importlib.import_module(f"{package}.{info.name}")
