"""Arithmetic of a training run: mixed precision per device, and deterministic kernels.

    precision = Precision.pick("auto", device)   # bf16 / fp16 + GradScaler / fp32
    with precision.autocast(device): logits = model(x).logits
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from rarelm.errors import RarelmError

CPU_BF16_ENV = "RARELM_CPU_BF16"


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX).

    `RARELM_CPU_BF16=1` / `=0` overrides the answer, so that `train.precision: auto` (and the
    test suite) can run as on the other kind of CPU: `=0` as on an AVX2-only CPU (auto = fp32),
    `=1` as on one with AVX512-BF16/AMX (auto = bf16; where bf16 is not native, torch emulates
    it, correctly but ~10x slower).
    """
    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if forced:
        raise RarelmError(f"{CPU_BF16_ENV} = {forced!r} is not allowed "
                          "(must be 0, 1, or unset to ask the CPU)")
    return cpu_has_native_bf16()


def cpu_has_native_bf16() -> bool:
    """What the CPU itself says (AVX512-BF16 or AMX tiles), whatever RARELM_CPU_BF16 is."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def pick_precision(precision: str, device) -> tuple[Any, bool]:
    """(autocast dtype or None for fp32, whether to use a GradScaler) for the device.

    auto: bf16 where the hardware has it (recent GPUs, CPUs with AVX512-BF16/AMX),
    fp16 with a GradScaler on older GPUs, fp32 on other CPUs. On CPU, `auto` therefore
    depends on the machine: the same params train in bf16 on one CPU and in fp32 on
    another, and their results differ by bf16 rounding. Pin `train.precision` for the same
    arithmetic on every CPU (then only the kernels' float rounding differs between CPU kinds;
    on one machine every precision is bit-for-bit deterministic and resumes bit-identically).
    `RARELM_CPU_BF16=0|1` makes `auto` resolve as on a CPU without / with native bf16.

    >>> pick_precision("fp32", torch.device("cpu")), pick_precision("bf16", torch.device("cpu"))
    ((None, False), (torch.bfloat16, False))
    """
    if precision == "auto":
        if device.type == "cuda":
            precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        else:  # CPUs without native bf16 emulate it ~10x slower than fp32 (measured, AVX2)
            precision = "bf16" if cpu_has_bf16() else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise RarelmError("params: train.precision = 'fp16' is not allowed on CPU "
                          "(must be auto, bf16 or fp32; fp16 with a GradScaler needs CUDA)")
    return {"bf16": (torch.bfloat16, False), "fp16": (torch.float16, True),
            "fp32": (None, False)}[precision]


@dataclasses.dataclass(frozen=True)
class Precision:
    """What `train.precision` became on this device: the autocast dtype (None: fp32) and
    whether a GradScaler guards fp16 gradients.

    >>> p = Precision.pick("bf16", torch.device("cpu"))
    >>> p.name, p.use_scaler
    ('bf16', False)
    """

    dtype: Any
    use_scaler: bool
    device: Any

    @classmethod
    def pick(cls, precision: str, device) -> Precision:
        return cls(*pick_precision(precision, device), device)

    @property
    def name(self) -> str:
        """bf16, fp16 or fp32: recorded with the metrics, since results differ by it."""
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.dtype, "fp32")

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None)


def deterministic(compile_model: bool, device) -> None:
    """Bitwise reproducible kernels on CPU; on CUDA some kernels (e.g. flash attention backward)
    have no deterministic version, so there it warns instead of refusing to run."""
    if compile_model:
        torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")
    else:  # the public call also imports torch._inductor (~6 s per worker) to configure it
        torch._C._set_deterministic_algorithms(True, warn_only=device.type == "cuda")
