"""Device and dtype choice shared by every model loader (imports torch: load it lazily).

auto: float32 on CPU; bfloat16 on CUDA (float16 on GPUs without bf16)."""

from __future__ import annotations

import torch

from prblib.errors import ModelError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda" or device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ModelError(f"device {device!r} was asked for, but CUDA is not available on this machine "
                             f"(torch {torch.__version__})")
        return torch.device(device)
    raise ModelError(f"unknown device {device!r} (use 'cpu' or 'cuda')")


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype in ("auto", "", None):
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r} (use auto, {', '.join(DTYPES)})")
    return DTYPES[dtype]
