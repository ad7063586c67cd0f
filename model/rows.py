"""Weight matrices kept as consecutive row blocks of one tensor, so a layer's projections can run as one GEMM over
their stack (a view: no second copy of the weights) while each stays a tensor of its own."""
from __future__ import annotations

import torch

__all__ = ["stack_rows", "stacked_rows"]


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
