"""Weight matrices kept as consecutive row blocks of one tensor, so a layer's projections can run as one GEMM over
their stack (a view: no second copy of the weights) while each stays a tensor of its own."""
from __future__ import annotations

import torch

__all__ = ["moved_keeping_rows", "stack_rows", "stacked_rows"]


def stacked_rows(parts) -> torch.Tensor | None:
    """The matrix whose consecutive row blocks are `parts`, as a view of their common storage (no copy), or
    None when they are not laid out that way (separate tensors, a gap, a transposed or strided part)."""
    first = parts[0]
    cols, offset, storage = first.shape[-1], first.storage_offset(), first.untyped_storage().data_ptr()
    for part in parts:
        if (part.dim() != 2 or part.shape[1] != cols or part.stride() != (cols, 1) or part.dtype != first.dtype
                or part.untyped_storage().data_ptr() != storage or part.storage_offset() != offset):
            return None
        offset += part.numel()
    return first.as_strided((sum(part.shape[0] for part in parts), cols), (cols, 1), first.storage_offset())


def stack_rows(parts) -> tuple[torch.Tensor, ...]:
    """`parts` as row views of one tensor: themselves when they already are, else copied once into one."""
    if stacked_rows(parts) is not None:
        return tuple(parts)
    return torch.cat(list(parts)).split([part.shape[0] for part in parts])


def moved_keeping_rows(tensors: dict[str, torch.Tensor], stacked: tuple[str, ...], dtype=None, device=None) -> dict:
    """`tensors` (name -> tensor) moved with `.to(device=, dtype=)`; the ones named in `stacked`, when they are
    rows of one tensor, are moved as that one tensor and split again, so they stay rows of one (no second copy
    when a layer later stacks them)."""
    moved = {k: v.to(device=device, dtype=dtype) for k, v in tensors.items() if k not in stacked}
    parts = tuple(tensors[name] for name in stacked)
    whole = stacked_rows(parts)
    if whole is None:
        moved.update((name, t.to(device=device, dtype=dtype)) for name, t in zip(stacked, parts))
    else:
        moved.update(zip(stacked, whole.to(device=device, dtype=dtype).split([t.shape[0] for t in parts])))
    return moved
