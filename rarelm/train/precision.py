"""Arithmetic of a training run: mixed precision per device, and deterministic kernels.

    precision = Precision.pick("auto", device)   # bf16 / fp16 + GradScaler / fp32
    precision = resolve("auto", device, probe)   # the same, with why; on a CPU with native
                                                 # bf16, the faster of fp32 and bf16 by `probe`
    with precision.autocast(device): logits = model(x).logits

`train.precision: auto` on a CPU with native bf16 (AVX512-BF16/AMX) times a few forward +
backward steps of the run's own model at its own micro-batch in fp32 and in bf16,
interleaved (`probe_seconds`), and trains in the faster; the answer is cached per CPU model
name, torch version, thread count, micro-batch and the model's parameter shapes
(`probe_key`), in this machine's cache folder (`machine_cache`, `cached_probe`): every later run
of that shape on the machine trains in the precision the first probe chose. A CPU without native bf16 trains
in fp32 without probing (torch would emulate bf16, ~10x slower). On CUDA nothing is timed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rarelm.errors import RarelmError
from rarelm.files import read_json, write_json

CPU_BF16_ENV = "RARELM_CPU_BF16"
PROBE_STEPS = 3  # timed forward + backward steps per precision, after one warm-up step each
clock = time.perf_counter  # the probe's timer (tests replace it)


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX).

    `RARELM_CPU_BF16=1` / `=0` overrides the answer, so that `train.precision: auto` (and the
    test suite) can run as on the other kind of CPU: `=0` as on an AVX2-only CPU (auto = fp32),
    `=1` as on one with AVX512-BF16/AMX (auto = bf16; where bf16 is not native, torch emulates
    it, correctly but ~10x slower).
    """
    forced = forced_cpu_bf16()
    return cpu_has_native_bf16() if forced is None else forced


def forced_cpu_bf16() -> bool | None:
    """What RARELM_CPU_BF16 says (None: unset, ask the CPU); a one-line error for another value."""
    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if forced:
        raise RarelmError(f"{CPU_BF16_ENV} = {forced!r} is not allowed "
                          "(must be 0, 1, or unset to ask the CPU)")
    return None


def cpu_has_native_bf16() -> bool:
    """What the CPU itself says (AVX512-BF16 or AMX tiles), whatever RARELM_CPU_BF16 is."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def pick_precision(precision: str, device) -> tuple[Any, bool]:
    """(autocast dtype or None for fp32, whether to use a GradScaler) for the device.

    auto (by hardware alone; `resolve` also times the model on a CPU with native bf16):
    bf16 where the hardware has it (recent GPUs, CPUs with AVX512-BF16/AMX),
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
    reason: str = ""  # why: "pinned", "no native bf16", "probe: bf16 faster", ... (train.json)
    probe: dict[str, Any] | None = None  # the probe's seconds per step (fp32, bf16; cached), if run

    @classmethod
    def pick(cls, precision: str, device) -> Precision:
        return cls(*pick_precision(precision, device), device)

    @property
    def name(self) -> str:
        """bf16, fp16 or fp32: recorded with the metrics, since results differ by it."""
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.dtype, "fp32")

    def describe(self) -> str:
        """The train log's line: `precision bf16 (probe: bf16 faster; fp32 0.300 s, bf16 0.200 s
        a step, cached)`."""
        figures = ""
        if self.probe:
            cached = ", cached" if self.probe.get("cached") else ""
            figures = (f"; fp32 {self.probe['fp32']:.3f} s, bf16 {self.probe['bf16']:.3f} s "
                       f"a step{cached}")
        return f"precision {self.name} ({self.reason}{figures})"

    def metrics(self) -> dict[str, Any]:
        """train.json's fields: precision, precision_reason, and the probe's seconds if it ran."""
        probe = {f"precision_probe_{p}_s": round(self.probe[p], 6) for p in ("fp32", "bf16")
                 } if self.probe else {}
        return {"precision": self.name, "precision_reason": self.reason, **probe}

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None)


def resolve(precision: str, device, probe: Callable[[], dict[str, Any]] | None = None) -> Precision:
    """What `train.precision` trains in on `device`, and why (`Precision.reason`).

    Pinned (fp32, bf16, fp16) as given; `auto` on CUDA: bf16 where supported, else fp16 with
    a GradScaler; `auto` on CPU: as RARELM_CPU_BF16 forces (=1 bf16, =0 fp32), else fp32 on a
    CPU without native bf16 (no probe: emulated bf16 never wins), else the faster of fp32
    and bf16 by `probe()`, which returns seconds per step ({"fp32": s, "bf16": s}, and
    "cached": True if it was read from the cache). E.g. a probe of 0.30 s (fp32) and 0.20 s
    (bf16) per step gives bf16, "probe: bf16 faster" (the reason stays the same from run to
    run; the figures are in `Precision.probe`).

    >>> resolve("fp32", torch.device("cpu")).reason
    'pinned'
    """
    if precision != "auto":
        return Precision(*pick_precision(precision, device), device, "pinned")
    if device.type == "cuda":
        reason = "cuda: bf16 supported" if torch.cuda.is_bf16_supported() else "cuda: no bf16"
        return Precision(*pick_precision("auto", device), device, reason)
    forced = forced_cpu_bf16()
    if forced is not None:
        return Precision(*pick_precision("bf16" if forced else "fp32", device), device,
                         f"{CPU_BF16_ENV}={int(forced)}")
    if not cpu_has_native_bf16():
        return Precision(None, False, device, "no native bf16")
    if probe is None:  # nothing to time (no model at hand): the hardware's answer
        return Precision(torch.bfloat16, False, device, "native bf16, not probed")
    seconds = probe()
    faster = "bf16" if seconds["bf16"] < seconds["fp32"] else "fp32"
    return Precision(*pick_precision(faster, device), device, f"probe: {faster} faster", seconds)


def probe_seconds(model, x, y, steps: int = PROBE_STEPS) -> dict[str, float]:
    """Median seconds of one forward + backward of `model` on inputs `x`, targets `y` (the
    loss in fp32, as training computes it) in fp32 and under bf16 autocast, the two
    alternating step by step (after one warm-up step each), so that other load on the
    machine hits both alike. Gradients are dropped after each step; the weights never change.
    """
    import torch.nn.functional as F

    def step(dtype) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
            logits = model(input_ids=x, use_cache=False).logits
        F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).backward()
        model.zero_grad(set_to_none=True)

    dtypes = {"fp32": None, "bf16": torch.bfloat16}
    times: dict[str, list[float]] = {name: [] for name in dtypes}
    for dtype in dtypes.values():  # warm-up: kernels and allocator
        step(dtype)
    for _ in range(steps):
        for name, dtype in dtypes.items():
            t0 = clock()
            step(dtype)
            times[name].append(clock() - t0)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def probe_key(model, batch_shape: tuple[int, ...], fp32_products: str = "mkl") -> str:
    """The probe's cache key: CPU model name, torch version, threads, micro-batch shape, the
    model's parameter names, shapes and trainability (so LoRA and every size change it), its
    attention implementation (rarelm.train.model.ATTENTION made bf16 faster than plain "sdpa")
    and the backend of its fp32 products (rarelm.train.matmul: oneDNN can make fp32 the faster).

    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> small = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=16, n_positions=8))
    >>> wider = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=16, n_positions=8))
    >>> probe_key(small, (2, 8)) == probe_key(small, (2, 8)) != probe_key(wider, (2, 8))
    True
    >>> before = probe_key(small, (2, 8)); small.set_attn_implementation("eager")
    >>> probe_key(small, (2, 8)) != before
    True
    """
    shape = [(name, list(q.shape), q.requires_grad) for name, q in model.named_parameters()]
    what = {"cpu": cpu_model_name(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "batch": list(batch_shape), "model": shape,
            "attention": getattr(model.config, "_attn_implementation", None),
            "fp32_products": fp32_products}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def cached_probe(cache: Path, key: str, measure: Callable[[], dict[str, float]]) -> dict[str, Any]:
    """The probe's seconds per step from `cache`/precision/`key`.json, else `measure()`'s,
    written there; "cached": True when read."""
    path = Path(cache) / "precision" / f"{key}.json"
    if path.is_file():
        try:
            return {**read_json(path), "cached": True}
        except (OSError, ValueError):  # a damaged cache file: measure again
            pass
    seconds = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, seconds)
    return seconds


def machine_cache() -> Path:
    """Where the probe's answers live: one folder per machine and user ($XDG_CACHE_HOME/rarelm,
    else ~/.cache/rarelm), not per checkout or run. Two runs from scratch of the same params
    (`dvc repro --force`, a fresh clone) must train in the same precision to give the same bits,
    and a fresh probe can answer either way where fp32 and bf16 time within noise of each other
    (two runs of the tiny test DAG on a 2-core Xeon with AMX did, when the answer lived in the
    run's .cache/)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rarelm"


def cpu_model_name() -> str:
    """The CPU's model name (/proc/cpuinfo's first "model name"), or the platform's answer."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def deterministic(compile_model: bool, device) -> None:
    """Bitwise reproducible kernels on CPU; on CUDA some kernels (e.g. flash attention backward)
    have no deterministic version, so there it warns instead of refusing to run.

    Deterministic mode also fills every new tensor's memory with NaN by default, a debugging
    aid that catches kernels reading memory they never wrote: ~9% of a step of the base model
    on CPU (344 `aten::fill_` calls, docs/benchmarks.md). Kernels write what they return, so
    turning it off changes no value: the saved weights are byte-identical with and without.
    """
    torch.utils.deterministic.fill_uninitialized_memory = False
    if compile_model:
        torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")
    else:  # the public call also imports torch._inductor (~6 s per worker) to configure it
        torch._C._set_deterministic_algorithms(True, warn_only=device.type == "cuda")
