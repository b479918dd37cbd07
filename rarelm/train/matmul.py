"""The fp32 matrix products of training on a CPU through oneDNN where that is faster than MKL.

PyTorch runs an fp32 `addmm` / `mm` on a CPU through MKL's sgemm, which on this project's AMD
EPYC (AVX-512) runs as fast as oneDNN held to AVX2 (MKL keeps its AVX-512 kernels for Intel
CPUs); oneDNN (also inside torch, which runs the bf16 matmuls through it) dispatches on the
CPU's ISA. There, one thread, the demo model's layer shapes: MKL ~90 GFLOP/s, oneDNN 165-210
(docs/benchmarks.md), and the products are most of an fp32 step at these widths. On an Intel
CPU MKL already runs AVX-512 and oneDNN may gain nothing; so which one trains is measured once
per machine (`pick_backend`: both time the run's own layer shapes, forward and backward),
cached like the precision probe's answer (rarelm.train.precision), and forced with
`RARELM_MATMUL=mkl|onednn`.

    backend, why = pick_backend(model, device)       # "onednn" or "mkl" (cached per machine)
    if backend == "onednn":
        route_linear_layers(model)                   # nn.Linear and GPT-2's Conv1D, fp32 only
    y = mm(a, b, backend)                            # a @ b (linear_ce.py's products)

Only fp32 products on a CPU change route: under autocast (bf16 / fp16) and on CUDA every layer
runs its own forward, bit for bit as before. The results are those of MKL within float
rounding: both accumulate in fp32, in another order where a product sums over many rows
(the weight gradients); tests/test_matmul.py bounds the difference of the weights after a few
AdamW steps. Each backend is deterministic on its own, so a run and its resume (same machine,
same cached answer) stay bit-identical.

Worked example (the same product either way, up to rounding):

>>> a, b = torch.ones(2, 3), torch.arange(6.0).reshape(3, 2)
>>> mm(a, b, "onednn").tolist(), mm(a, b, "mkl").tolist()
([[6.0, 9.0], [6.0, 9.0]], [[6.0, 9.0], [6.0, 9.0]])
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import types
from pathlib import Path

import torch

from rarelm.errors import RarelmError

MATMUL_ENV = "RARELM_MATMUL"
BACKENDS = ("mkl", "onednn")
PROBE_REPS = 7  # timed forward + backward passes per backend, after one warm-up each
# Tokens the probe's layers run on: the demo's micro-batch (16 x 128), whatever the run's, so
# that one machine and model width have one answer (runs that differ only in micro-batch, as
# gradient accumulation against one big batch, then train through the same kernels).
PROBE_ROWS = 2048
clock = time.perf_counter  # the probe's timer (tests replace it)


def onednn_available() -> bool:
    """Whether this torch build has oneDNN's dense linear op (torch.ops.mkldnn._linear_pointwise)."""
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """x [M, K] @ weight [N, K]^T (+ bias [N]) by oneDNN; strided views are read as they are."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def mm(a: torch.Tensor, b: torch.Tensor, backend: str = "mkl") -> torch.Tensor:
    """a [M, K] @ b [K, N], by oneDNN where `backend` is "onednn" and both are fp32 on a CPU."""
    if backend == "onednn" and _routable(a) and b.dtype == torch.float32:
        return _onednn_linear(a, b.t())
    return a @ b


def _routable(x: torch.Tensor) -> bool:
    """fp32 on a CPU outside autocast: what oneDNN takes here (autocast runs bf16 through it anyway)."""
    return (x.dtype == torch.float32 and x.device.type == "cpu"
            and not torch.is_autocast_enabled("cpu"))


class _Linear(torch.autograd.Function):
    """y = x W^T + b with W [out, in] (nn.Linear), or y = x W + b with W [in, out] (GPT-2's
    Conv1D, `in_out`); forward and both gradients by oneDNN, the bias's a sum over rows as
    autograd's addmm makes it."""

    @staticmethod
    def forward(ctx, x, weight, bias, in_out):
        ctx.save_for_backward(x, weight)
        ctx.in_out, ctx.has_bias = in_out, bias is not None
        w = weight.t() if in_out else weight  # [out, in]
        y = _onednn_linear(x.reshape(-1, x.size(-1)), w, bias)
        return y.view(*x.shape[:-1], w.size(0))

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.size(-1))  # [M, out]
        x2 = x.reshape(-1, x.size(-1))  # [M, in]
        w = weight.t() if ctx.in_out else weight  # [out, in]
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn_linear(g, w.t()).view(x.shape)  # g W: [M, in]
        if ctx.needs_input_grad[1]:  # Conv1D's [in, out] = x^T g, Linear's [out, in] = g^T x
            grad_w = _onednn_linear(x2.t(), g.t()) if ctx.in_out else _onednn_linear(g.t(), x2.t())
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g.sum(0)
        return grad_x, grad_w, grad_b, None


def _layers(model):
    """The modules whose forward is one product with their weight: nn.Linear and GPT-2's Conv1D
    ((module, weight stored [in, out])), exactly these types (a subclass may do more). A layer
    whose forward something else has replaced on the instance keeps it (loss.agg's gated output
    layer: routing it would skip the gate)."""
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # transformers not installed: nn.Linear only
        Conv1D = None
    for module in model.modules():
        if "forward" in vars(module):  # rewired by its owner (AdaptiveGradientGate.wrap)
            continue
        if type(module) is torch.nn.Linear:
            yield module, False
        elif Conv1D is not None and type(module) is Conv1D:
            yield module, True


def route_linear_layers(model) -> int:
    """Route the fp32 CPU forward (and backward) of every nn.Linear and Conv1D of `model` through
    oneDNN; any other call (autocast, CUDA) runs the layer's own forward. The number routed.

    A bound method on each module, so a copy of the model (copy.deepcopy) routes its own layers.
    """
    count = 0
    for module, in_out in _layers(model):
        module._rarelm_plain_forward = module.forward
        module.forward = types.MethodType(_routed_forward_in_out if in_out else _routed_forward,
                                          module)
        count += 1
    return count


def _routed_forward(self, x, *args, **kwargs):
    if not args and not kwargs and _routable(x) and self.weight.dtype == torch.float32:
        return _Linear.apply(x, self.weight, self.bias, False)
    return self._rarelm_plain_forward(x, *args, **kwargs)


def _routed_forward_in_out(self, x, *args, **kwargs):
    if not args and not kwargs and _routable(x) and self.weight.dtype == torch.float32:
        return _Linear.apply(x, self.weight, self.bias, True)
    return self._rarelm_plain_forward(x, *args, **kwargs)


def forced_backend() -> str | None:
    """What RARELM_MATMUL says (None: unset, measure); a one-line error for another value."""
    forced = os.environ.get(MATMUL_ENV, "").strip()
    if forced and forced not in BACKENDS:
        raise RarelmError(f"{MATMUL_ENV} = {forced!r} is not allowed (must be mkl, onednn, or "
                          "unset to measure)")
    return forced or None


def layer_shapes(model) -> list[tuple[int, int]]:
    """The distinct (in, out) shapes of the model's routable layers that train or pass a
    gradient, in order of first appearance."""
    shapes: list[tuple[int, int]] = []
    for module, in_out in _layers(model):
        w = module.weight
        shape = tuple(w.shape) if in_out else (w.size(1), w.size(0))
        if shape not in shapes:
            shapes.append(shape)
    return shapes


def probe_seconds(shapes: list[tuple[int, int]], rows: int = PROBE_ROWS,
                  reps: int = PROBE_REPS) -> dict[str, float]:
    """Seconds of a forward + backward of one layer of each (in, out) shape on `rows` fp32 tokens,
    by MKL (torch's addmm) and by oneDNN (`_Linear`), interleaved, the best of `reps`: the least
    disturbed by other load (a thread preempted inside a parallel region can double one pass on
    a busy machine, and the answer is kept). The RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        cases = [(torch.randn(rows, n_in, requires_grad=True),
                  torch.randn(n_in, n_out, requires_grad=True), torch.zeros(n_out, requires_grad=True),
                  torch.randn(rows, n_out)) for n_in, n_out in shapes]

    def once(backend: str) -> None:
        for x, w, b, g in cases:
            y = (_Linear.apply(x, w, b, True) if backend == "onednn"
                 else torch.addmm(b, x, w))
            y.backward(g)
            x.grad = w.grad = b.grad = None

    times: dict[str, list[float]] = {name: [] for name in BACKENDS}
    for name in BACKENDS:  # warm-up: oneDNN builds its kernels on first use
        once(name)
    for _ in range(reps):
        for name in BACKENDS:
            t0 = clock()
            once(name)
            times[name].append(clock() - t0)
    return {name: min(t) for name, t in times.items()}


def probe_key(shapes: list[tuple[int, int]]) -> str:
    """The cache key of a probe: CPU model name, torch version, threads and layer shapes.

    >>> probe_key([(8, 24)]) == probe_key([(8, 24)]) != probe_key([(8, 32)])
    True
    """
    from rarelm.train.precision import cpu_model_name

    what = {"cpu": cpu_model_name(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "shapes": [list(s) for s in shapes],
            "rows": PROBE_ROWS, "probe": "best of reps, alone"}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def pick_backend(model, device, cache: Path | None = None, eligible: bool = True,
                 before_probe=None) -> tuple[str, str]:
    """(backend, why) for training `model`: "cublas" on a CUDA device; "mkl" (torch's own route) where not
    `eligible` (autocast, FSDP, compile) or without oneDNN; else RARELM_MATMUL's, or the faster
    by `probe_seconds`, cached per machine (rarelm.train.precision.machine_cache) so that every
    run of these layer shapes on this machine trains through the same kernels. `before_probe()`
    is called before a measurement (none when cached): to let other work of the process finish,
    which would slow one side's threads."""
    from rarelm.files import read_json, write_json
    from rarelm.train.precision import machine_cache

    forced = forced_backend()
    if device.type == "cuda":
        return "cublas", "a CUDA device"
    if device.type != "cpu" or not eligible:
        return "mkl", "no fp32 products to route: autocast, FSDP or compile"
    if not onednn_available():
        return "mkl", "this torch has no oneDNN linear op"
    if forced:
        return forced, f"{MATMUL_ENV}={forced}"
    shapes = layer_shapes(model)
    if not shapes:
        return "mkl", "no linear layer to route"
    path = Path(cache or machine_cache()) / "matmul" / f"{probe_key(shapes)}.json"
    seconds, how = None, "measured"
    if path.is_file():
        try:
            seconds, how = read_json(path), "cached"
        except (OSError, ValueError):  # a damaged cache file: measure again
            seconds = None
    if seconds is None:
        if before_probe is not None:
            before_probe()
        seconds = probe_seconds(shapes)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, seconds)
    backend = "onednn" if seconds["onednn"] < seconds["mkl"] else "mkl"
    return backend, (f"{how}: layers fwd+bwd {seconds['mkl'] * 1e3:.1f} ms by MKL, "
                     f"{seconds['onednn'] * 1e3:.1f} ms by oneDNN")
