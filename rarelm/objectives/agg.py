"""Adaptive gradient gating (AGG, Yu et al., ACL 2022): `loss.agg` (false: off).

It changes no loss: it gates the gradient that reaches rare tokens' output-embedding
rows, through `prepare_model`, which routes the model's output layer through
`_GatedOutput`.
"""

from __future__ import annotations

import torch

from rarelm.errors import RarelmError
from rarelm.objectives.remedy import Context, Remedy
from rarelm.params import LossParams


class AdaptiveGradientGate(Remedy):
    """AGG (Yu et al., ACL 2022, arXiv 2109.03127): gate rare tokens' output-embedding gradients.

    As in the authors' code (github.com/ysw1021/AGG, criterions/cross_entropy_agg.py):
    each rank counts the targets of its last K optimizer steps (K = steps per epoch,
    the current step's micro-batches so far included); a_v = count_v / min(steps, K) is
    token v's appearances per batch, and the rare group is {v: a_v < alpha}. For a
    rare v, the gradient that reaches its output row from a position whose target is
    not v is scaled by

        g1_v = a_v                                        where the target is not rare
        g2_v = min(count_v / mean(count over the rare group), 1)   where it is rare

    (the second gate spares rare tokens from each other only when they are rarer than
    the rare group's mean: the "very rare" ones); the target's own row, every
    non-rare row and every gradient to the hidden states are unchanged. Worked
    example, K = 100 steps counted, counts 200, 1, 0 (a = 2, 0.01, 0), alpha = 0.03:
    rare group {1, 2}, mean rare count 0.5; g1 = (1, 0.01, 0), g2 = (1, 1, 0). At a
    position whose target is token 0, row 1 gets 1% of its gradient and row 2 none;
    where the target is token 1, row 1 keeps its (target) gradient, row 2 gets none.

    >>> gate = AdaptiveGradientGate(3, alpha=0.03, memory=100)
    >>> gate.steps, gate.window_sum = 99, torch.tensor([198, 1, 0])
    >>> gate.observe(torch.tensor([0, 0]))                # this step's targets: 200, 1, 0 in all
    >>> [round(x, 4) for x in gate.g1.tolist()], gate.g2.tolist()
    ([1.0, 0.01, 0.0], [1.0, 1.0, 0.0])
    """

    name = "agg"
    needs_logits = True  # its gate sits in the output layer's own backward (`wrap`)

    def __init__(self, vocab_size: int, alpha: float, memory: int, device=None):
        self.alpha, self.memory = alpha, max(1, int(memory))
        self.steps = 0  # optimizer steps finished
        self.window: list[tuple[torch.Tensor, torch.Tensor]] = []  # (ids, counts) per finished step
        self.window_sum = torch.zeros(vocab_size, dtype=torch.int64, device=device)
        self.pending = torch.zeros_like(self.window_sum)  # this step's targets so far
        self.targets = self.g1 = self.g2 = self.rare_rows = None
        self.any_rare = False

    @classmethod
    def from_params(cls, params: LossParams, context: Context) -> AdaptiveGradientGate | None:
        if not params.agg:
            return None
        return cls(context.vocab_size, params.agg_alpha, context.steps_per_epoch, context.device)

    def prepare_model(self, model) -> None:
        """Route the model's output layer through the gate (once, before DDP or compile wrap it)."""
        head = model.get_output_embeddings()
        if not isinstance(head, torch.nn.Linear):
            raise RarelmError(f"loss.agg = true needs a linear output layer; this model's is "
                              f"{type(head).__name__}")
        self.wrap(head)

    def on_batch(self, logits: torch.Tensor, y: torch.Tensor, x) -> None:
        self.observe(y)

    def on_step_end(self, done: int, all_reduce) -> None:
        self.step_end()

    def observe(self, y: torch.Tensor) -> None:
        """Count this micro-batch's targets and set the gates its backward pass will use."""
        with torch.no_grad():
            self.targets = y.reshape(-1)
            self.pending += torch.bincount(self.targets, minlength=len(self.pending))
            count = (self.window_sum + self.pending).double()
            appearance = count / min(self.steps + 1, self.memory)
            rare = appearance < self.alpha
            ones = torch.ones_like(count)
            self.g1 = torch.where(rare, appearance, ones).float()
            mean_rare = count[rare].mean() if bool(rare.any()) else count.new_ones(())
            self.g2 = torch.where(rare, (count / (mean_rare + 1e-7)).clamp(max=1.0), ones).float()
            self.rare_rows = rare[self.targets].nonzero().squeeze(1)
            self.any_rare = bool(rare.any())

    def weight_grad(self, grad: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The output matrix's gradient [V, d] from the logits' [N, V] and hidden states' [N, d].

        grad^T hidden with each rare row scaled by g1 (positions with a non-rare target)
        or g2 (positions with a rare one), the target's own entry ungated: the full
        product once, as the plain backward computes it, then a correction from the
        rare-target positions only.
        """
        full = grad.t() @ hidden
        if self.targets is None or not self.any_rare:
            return full
        if self.targets.numel() != grad.size(0):
            raise RuntimeError(f"AGG: {grad.size(0)} logits rows but {self.targets.numel()} targets "
                               "observed; call the objective on the batch before backward")
        out = full.float() * self.g1[:, None]
        rows = self.rare_rows
        if rows.numel():
            gate = self.g2.expand(rows.numel(), -1).clone()
            gate.scatter_(1, self.targets[rows, None], 1.0)
            out += (grad[rows].float() * (gate - self.g1)).t() @ hidden[rows].float()
        return out.to(full.dtype)

    def step_end(self) -> None:
        """Move this step's counts into the window of the last K - 1 finished steps."""
        self.steps += 1
        ids = self.pending.nonzero().squeeze(1)
        self.window.append((ids, self.pending[ids].clone()))
        self.window_sum += self.pending
        self.pending.zero_()
        while len(self.window) > self.memory - 1:
            old_ids, old_counts = self.window.pop(0)
            self.window_sum[old_ids] -= old_counts

    def state(self) -> dict:
        return {"steps": self.steps, "window_sum": self.window_sum.cpu(),
                "window": [(i.cpu(), c.cpu()) for i, c in self.window]}

    def load_state(self, state: dict) -> None:
        device = self.window_sum.device
        self.steps = int(state["steps"])
        self.window_sum = state["window_sum"].to(device)
        self.window = [(i.to(device), c.to(device)) for i, c in state["window"]]
        self.pending = torch.zeros_like(self.window_sum)

    def wrap(self, linear: torch.nn.Module) -> None:
        """Route `linear`'s forward through the gated product (its parameters stay where they are)."""
        gate = self

        def forward(hidden: torch.Tensor) -> torch.Tensor:
            weight, device = linear.weight, hidden.device.type
            if torch.is_autocast_enabled(device):  # cast as autocast would, then compute outside it
                dtype = torch.get_autocast_dtype(device)
                hidden, weight = hidden.to(dtype), weight.to(dtype)
            with torch.autocast(device, enabled=False):
                out = _GatedOutput.apply(hidden, weight, gate)
            return out if linear.bias is None else out + linear.bias.to(out.dtype)

        linear.forward = forward


class _GatedOutput(torch.autograd.Function):
    """logits = hidden @ weight^T; backward: the hidden states' gradient as usual, the weight's gated."""

    @staticmethod
    def forward(ctx, hidden, weight, gate):
        ctx.save_for_backward(hidden, weight)
        ctx.gate = gate
        return hidden @ weight.t()

    @staticmethod
    def backward(ctx, grad):
        hidden, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.size(-1))
        grad_hidden = (g @ weight).view(hidden.shape) if ctx.needs_input_grad[0] else None
        grad_weight = (ctx.gate.weight_grad(g, hidden.reshape(-1, hidden.size(-1)))
                       if ctx.needs_input_grad[1] else None)
        return grad_hidden, grad_weight, None
