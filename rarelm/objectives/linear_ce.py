"""The output layer and its cross-entropy in chunks of tokens: never the whole [N, V] logits.

    ce, lse, plain, weighted = linear_cross_entropy(hidden, weight, targets, coef=w / w.sum())

At the sizes this project trains (width 128, 4,096-8,192 tokens) the output layer dominates
a step, and most of its time is memory traffic over the [N, V] logits, their log-softmax and
its gradient, each written and read back in full. As Cut Cross-Entropy (Wijmans et al. 2024)
and Liger Kernel's fused linear cross-entropy do on GPUs, this computes the logits of
`chunk` tokens at a time, which stay in the CPU's cache, and keeps per token only what the
objectives need:

    z_t        = hidden_t @ weight^T (+ bias)       the chunk's logits, in the compute dtype, then fp32
    lse_t      = log sum_v exp(z_tv)                 (differentiable)
    ce_t       = lse_t - z_t[y_t]                    (differentiable)
    plain_t    = ce_t without the bias               (for the logged sums; no gradient)
    weighted   = sum_t coef_t * ce_t                 (differentiable; 0 without coef)

Gradients: d/dz_t = (g_ce_t + g_lse_t + g_w * coef_t) softmax(z_t) - (g_ce_t + g_w * coef_t) e_y,
then grad_hidden = dz @ weight and grad_weight = dz^T @ hidden, chunk by chunk. Where the loss
is linear in the per-token cross-entropy with weights known in advance (`coef`: plain or
weighted mean), or a sum of per-row functions of ce, lse and per-row inputs (`row_loss`: focal's
transform, unlikelihood's penalty), the forward computes these gradients for `weighted` while the
chunk's softmax is at hand (Liger's way: one matmul fewer than recomputing), and backward only
scales them; where another output gets a gradient the backward recomputes each chunk's logits
(Cut Cross-Entropy's way). Either way the result is today's
`F.cross_entropy` on the full logits within float rounding (tests/test_linear_ce.py: fp32 and
bf16).

Worked example: hidden [[1, 0]], weight [[0, 0], [ln 3, 0]] (logits 0, ln 3: softmax 0.25, 0.75),
target 0: ce = -log 0.25 = 1.386, lse = log 4 = 1.386.

>>> h = torch.tensor([[1.0, 0.0]]); w = torch.tensor([[0.0, 0.0], [math.log(3), 0.0]])
>>> ce, lse, plain, weighted = linear_cross_entropy(h, w, torch.tensor([0]), coef=torch.ones(1))
>>> round(ce.item(), 4), round(lse.item(), 4), round(weighted.item(), 4)
(1.3863, 1.3863, 1.3863)
"""

from __future__ import annotations

import math  # noqa: F401 (the worked example above)
from collections.abc import Callable

import torch
import torch.nn.functional as F

# Logits per chunk on a CPU: 8 MB of fp32, within this machine kind's L3. One thread's CPU time per
# step was the same from 256 to 2,048 rows a chunk at vocabularies 1,712 and 8,192 (30% under the
# full logits'); fewer chunks mean fewer of the small parallel ops that a loaded machine's
# thread scheduling makes costly.
CHUNK_ELEMENTS = 2**21
# On a GPU a chunk is sized by memory, not cache: 512 MB of fp32 logits, ~2,600 rows at GPT-2's
# vocabulary of 50,257. CPU-sized chunks there (41 rows) made 400 small matmuls and ~3,000 kernel
# launches a step of 16 x 1,024 tokens: most of the 350 ms step that issue 54 measured on an H200.
GPU_CHUNK_ELEMENTS = 2**27
# Vocabulary rows the products are padded to a multiple of, by device type: on an H200 the chunks'
# three products with GPT-2's 50,257 rows ran in sm75 cutlass kernels (unaligned leading dimensions),
# 41% of the step's device time (docs/benchmarks.md); padded rows get -inf logits, so nothing changes
# but the kernels. Not on a CPU, where the products are aligned or not alike.
ALIGN = {"cuda": 64}


def chunk_rows(vocab: int, device_type: str = "cpu") -> int:
    """Tokens per chunk for a vocabulary of `vocab` on a device of `device_type`: CHUNK_ELEMENTS
    logits on a CPU, GPU_CHUNK_ELEMENTS elsewhere, at least 16 rows.

    >>> chunk_rows(4096), chunk_rows(8192), chunk_rows(200_000), chunk_rows(50_257, "cuda")
    (512, 256, 16, 2670)
    """
    elements = CHUNK_ELEMENTS if device_type == "cpu" else GPU_CHUNK_ELEMENTS
    return max(16, elements // vocab)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         bias: torch.Tensor | None = None, coef: torch.Tensor | None = None,
                         row_loss: RowLoss | None = None, aux: torch.Tensor | None = None,
                         chunk: int | None = None, mm: MatMul | None = None):
    """(ce, lse, plain, weighted) for hidden [N, d], weight [V, d] (one compute dtype), targets
    [N] (int64), `bias` [V] fp32 added to every row of logits (None: none), and what `weighted`
    is: sum(coef * ce) for `coef` [N] fp32, or the sum over chunks of `row_loss(ce, lse, aux,
    rows)`, a scalar from the chunk's fp32 ce and lse [n], the rows `rows` (a slice) of `aux`
    ([N, K], any differentiable per-token inputs, e.g. unlikelihood's context logits: their
    gradient is returned too), differentiated in the chunk by autograd; neither: 0, no gradient.
    ce, lse and plain are fp32 [N]; plain is ce without the bias (detached). `mm(a, b)` makes
    the three products a @ b (None: torch's; the training step passes rarelm.train.matmul.mm,
    oneDNN for fp32 on CPUs where that is faster)."""
    vocab = weight.size(0)
    chunk = chunk or chunk_rows(vocab, hidden.device.type)
    pad = -vocab % ALIGN.get(weight.device.type, 1)
    if pad:  # differentiable: the real rows' gradient flows back through the pad
        weight = F.pad(weight, (0, 0, 0, pad))
        bias = None if bias is None else F.pad(bias, (0, pad))
    return _LinearCrossEntropy.apply(hidden, weight, targets, bias, coef, aux, row_loss, chunk,
                                     mm or torch.matmul, vocab)


RowLoss = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", slice], torch.Tensor]
MatMul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _chunk_logits(hidden, weight, bias, rows, mm, vocab: int):
    """The fp32 logits of tokens `rows`: the matmul in the inputs' dtype, as autocast runs lm_head;
    the columns of the padding rows past `vocab` (ALIGN) at -inf."""
    z = mm(hidden[rows], weight.t()).float()
    if z.size(1) > vocab:
        z[:, vocab:] = float("-inf")
    return z if bias is None else z.add_(bias)


def _softmax_and_lse(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """z turned into exp(z - max) in place; (row max, row sum of that, log of the sum)."""
    top = z.amax(-1, keepdim=True)
    z.sub_(top).exp_()
    total = z.sum(-1)
    return top.squeeze(1), total, total.log()


def _accumulate(dz, hidden, weight, rows, grad_hidden, grad_weight, mm) -> None:
    """grad_hidden[rows] = dz @ weight and grad_weight += dz^T @ hidden[rows], the matmuls in the
    compute dtype (as the lm_head's backward under autocast), the weight's sum in fp32."""
    d = dz.to(weight.dtype)
    if grad_hidden is not None:
        grad_hidden[rows] = mm(d, weight)
    if grad_weight is not None:
        grad_weight.add_(mm(d.t(), hidden[rows]))


def _row_gradients(row_loss, ce, lse, aux, rows):
    """(value, d/d ce, d/d lse, d/d aux) of row_loss on the chunk `rows`, by autograd."""
    with torch.enable_grad():
        inputs = [ce.detach().requires_grad_(), lse.detach().requires_grad_()]
        if aux is not None:
            inputs.append(aux[rows].detach().requires_grad_())
        value = row_loss(inputs[0], inputs[1], inputs[2] if aux is not None else None, rows)
        grads = torch.autograd.grad(value, inputs, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, inputs, strict=True)]
    return value.detach(), grads[0], grads[1], grads[2] if aux is not None else None


class _LinearCrossEntropy(torch.autograd.Function):

    @staticmethod
    def forward(ctx, hidden, weight, targets, bias, coef, aux, row_loss, chunk, mm, vocab):
        n = hidden.size(0)
        ce, lse, plain = (torch.empty(n, device=hidden.device) for _ in range(3))
        needs = ctx.needs_input_grad
        eager = (coef is not None or row_loss is not None) and any(needs[:2])
        grad_hidden = torch.empty_like(hidden) if eager and needs[0] else None
        grad_weight = torch.zeros(weight.shape, device=weight.device) if eager and needs[1] else None
        on_ce = coef  # d weighted / d ce_t, d weighted / d lse_t and / d aux (row_loss)
        on_lse = torch.zeros_like(ce) if row_loss is not None else None
        on_aux = torch.zeros_like(aux) if row_loss is not None and aux is not None else None
        on_ce = torch.zeros_like(ce) if row_loss is not None else on_ce
        weighted = ce.new_zeros(())
        # the plain CE's sum of exp(z) from the biased softmax's terms: exp(z + b - top) times
        # exp(-b), as exp(min b - b) <= 1 (one matrix-vector product, not a second softmax),
        # where no factor underflows; a second logsumexp where the bias spans more than e^60
        low = bias is not None and float(bias.max() - bias.min()) <= 60.0
        unbias = torch.exp(bias.min() - bias) if low else None
        for start in range(0, n, chunk):
            rows = slice(start, start + chunk)
            y = targets[rows, None]
            z = _chunk_logits(hidden, weight, None, rows, mm, vocab)
            if bias is not None:
                plain_logit = z.gather(1, y).squeeze(1)
                if not low:
                    plain[rows] = torch.logsumexp(z, -1) - plain_logit
                z.add_(bias)
            target_logit = z.gather(1, y).squeeze(1)
            top, total, log_total = _softmax_and_lse(z)
            lse[rows] = top + log_total
            ce[rows] = log_total - (target_logit - top)
            if low:
                plain[rows] = top - bias.min() + torch.log(z @ unbias) - plain_logit
            if row_loss is not None:
                value, on_ce[rows], on_lse[rows], g_aux = _row_gradients(row_loss, ce[rows],
                                                                         lse[rows], aux, rows)
                weighted += value
                if on_aux is not None:
                    on_aux[rows] = g_aux
            if eager:  # z is exp(z - max): (d/dce + d/dlse) softmax - d/dce onehot
                to_softmax = on_ce[rows] if on_lse is None else on_ce[rows] + on_lse[rows]
                z.mul_((to_softmax / total)[:, None]).scatter_add_(1, y, -on_ce[rows, None])
                _accumulate(z, hidden, weight, rows, grad_hidden, grad_weight, mm)
        if bias is None:
            plain.copy_(ce)
        if coef is not None and row_loss is None:
            weighted = (ce * coef).sum()
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(plain)
        ctx.save_for_backward(hidden, weight, targets, bias, lse, on_ce, on_lse, on_aux)
        ctx.chunk, ctx.mm, ctx.vocab = chunk, mm, vocab
        ctx.eager = (grad_hidden, grad_weight) if eager else None
        return ce, lse, plain, weighted

    @staticmethod
    def backward(ctx, g_ce, g_lse, g_plain, g_weighted):
        hidden, weight, targets, bias, lse, on_ce, on_lse, on_aux = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad_aux = on_aux * g_weighted if on_aux is not None and g_weighted is not None else None
        if g_ce is None and g_lse is None:  # only `weighted` has a gradient
            if g_weighted is None or ctx.eager is None:
                return None, None, None, None, None, grad_aux, None, None, None, None
            grad_hidden, grad_weight = ctx.eager
            ctx.eager = None  # a second backward would need retain_graph: recompute then
            return (grad_hidden * g_weighted.to(grad_hidden.dtype) if grad_hidden is not None else None,
                    (grad_weight * g_weighted).to(weight.dtype) if grad_weight is not None else None,
                    None, None, None, grad_aux, None, None, None, None)
        zeros = torch.zeros_like(lse)
        on_target = g_ce if g_ce is not None else zeros
        on_softmax = g_lse if g_lse is not None else zeros
        if g_weighted is not None and on_ce is not None:
            on_target = on_target + g_weighted * on_ce
        on_softmax = on_softmax + on_target
        if g_weighted is not None and on_lse is not None:
            on_softmax = on_softmax + g_weighted * on_lse
        grad_hidden = torch.empty_like(hidden) if needs[0] else None
        grad_weight = torch.zeros(weight.shape, device=weight.device) if needs[1] else None
        for start in range(0, hidden.size(0), ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            z = _chunk_logits(hidden, weight, bias, rows, ctx.mm, ctx.vocab)
            z.sub_(lse[rows, None]).exp_().mul_(on_softmax[rows, None])
            z.scatter_add_(1, targets[rows, None], -on_target[rows, None])
            _accumulate(z, hidden, weight, rows, grad_hidden, grad_weight, ctx.mm)
        return (grad_hidden, grad_weight.to(weight.dtype) if grad_weight is not None else None,
                None, None, None, grad_aux, None, None, None, None)
