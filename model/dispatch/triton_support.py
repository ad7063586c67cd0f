"""Where this package's Triton kernels can run: one rule for every Triton path.

Triton compiles for CUDA GPUs. On the CPU it runs only through its interpreter, which is chosen when a kernel
is defined (TRITON_INTERPRET=1 in the environment before the module is imported); a kernel defined that way
then runs on CPU tensors only.
"""
from __future__ import annotations

import importlib

import torch

try:
    import triton
except ImportError:  # a torch build or platform without Triton
    triton = None

__all__ = ["defined_interpreted", "import_if_triton", "last_dim_contiguous", "triton", "unavailable_reason"]


def import_if_triton(module: str, package: str):
    """The kernel module `module` (relative to `package`), or None where it fails to import only because Triton
    is not installed: a torch build or platform without Triton, whose Triton paths then say so and never run.
    Any other import error is raised."""
    try:
        return importlib.import_module(module, package)
    except ImportError as exc:
        if exc.name != "triton":
            raise
        return None


def defined_interpreted(kernel) -> bool:
    """Whether `kernel` (a @triton.jit function) was defined for the CPU interpreter."""
    return not isinstance(kernel, triton.runtime.JITFunction)


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """`t`, copied only if its last dim has a stride: the kernels index that dim with unit stride and take every
    other stride as an argument (the model's weights and activations never need the copy)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def unavailable_reason(device: torch.device | str, interpreted: bool | None) -> str | None:
    """None where kernels defined with `interpreted` can run on `device`, else why not.
    `interpreted=None` says Triton is not installed."""
    device = torch.device(device)
    if interpreted is None:
        return "Triton is not installed"
    if device.type == "cuda":
        return "the kernels were defined for Triton's CPU interpreter (TRITON_INTERPRET=1)" if interpreted else None
    if device.type == "cpu" and interpreted:
        return None
    return f"Triton compiles for CUDA; on {device.type} it runs only through its interpreter (TRITON_INTERPRET=1)"
