"""The training objective: cross-entropy, reweighted and reshaped per `loss.*`.

`loss.targets` selects which targets count more:

* rare_bucket: the target token is in the rare frequency bucket (data/rare/buckets.npy);
* terms: the target position is a token of an extracted term's occurrence
  (data/rare/term_index.npy), so every token of "myocardial infarction"
  counts, including a medium-frequency modifier, and a number or a one-off
  word does not;
* both: either.

Each selected target gets weight w_t = 1 + rare_weight, every other target 1;
the loss is sum(w_t * ce_t) / sum(w_t), so rare_weight = 0 is plain mean
cross-entropy. Worked example with three targets, cross-entropies 1.0, 3.0 and
2.0, the second in the rare bucket, the second and third tokens of a term, and
rare_weight = 2:

    rare_bucket: (1 * 1.0 + 3 * 3.0 + 1 * 2.0) / (1 + 3 + 1) = 2.4
    terms, both: (1 * 1.0 + 3 * 3.0 + 3 * 2.0) / (1 + 3 + 3) = 16 / 7 = 2.2857
    plain mean:  2.0

The published rare-token objectives compose with it (each is one function or
class below, with its formula and a worked example):

    w_t  = (1 + rare_weight * selected_t) * token_weight[y_t]   loss.token_weight
    l_t  = (1 - p_t)^gamma * -log p_t                            loss.focal_gamma (0: CE)
    p    = softmax(logits + tau * log pi)                        loss.logit_adjust_tau (0: as is)
    loss = sum(w_t * l_t) / sum(w_t)
           + unlikelihood * sum_t UL_t / n_targets               loss.unlikelihood (0: off)

* token_weight: `tlat_weights` (token-level adaptive training, Gu et al. 2020: exponential
  or chi-square in the train count), `FaceWeights` (FACE, Jiang et al. 2019: from the
  relative frequency of the targets or of the model's argmax predictions, refreshed
  during training); uniform = 1;
* `focal` (Lin et al. 2017), `logit_adjust_tau` (Menon et al. 2021; pi = the train
  unigram prior, `rarelm.rare.log_prior`), `unlikelihood` (Welleck et al. 2020);
* `loss.agg`: `AdaptiveGradientGate` (AGG, Yu et al. 2022) changes no loss: it gates
  the gradient that reaches rare tokens' output-embedding rows, through
  `Objective.prepare_model`.

With every `loss.*` at its default the loss, its gradients and the logged sums are
exactly those of `rare_weighted_loss`. The logged sums are always plain
cross-entropy of the model's own logits. `Objective` is the one entry point the
training loop calls: `prepare_model` once, the objective per micro-batch,
`step_end` after each optimizer step, `state` / `load_state` with each checkpoint.
Cross-entropy is computed in float32 whatever the autocast dtype of the logits,
since bf16 rounds losses around 3 to steps of 1/64.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

FREQUENT_BUCKET, RARE_BUCKET = 0, 2  # data/rare/buckets.npy: 0 frequent, 1 medium, 2 rare, 3 unseen


def rare_mask(buckets, vocab_size: int, bucket: int = RARE_BUCKET) -> torch.Tensor:
    """Bool [vocab_size]: True for token ids in `bucket` (ids past the buckets: False)."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    b = torch.from_numpy(np.array(buckets[:vocab_size], dtype=np.int64))
    mask[:len(b)] = b == bucket
    return mask


def rare_weighted_loss(logits: torch.Tensor, targets: torch.Tensor, is_rare: torch.Tensor,
                       rare_weight: float, selected: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted loss to optimise, and detached sums for logging.

    logits [B, T, V] (any float dtype), targets [B, T] (next tokens), is_rare [V] bool;
    `selected` [B, T] bool: the targets that weigh 1 + rare_weight (default: the rare ones).
    Returns (loss, stats) with stats = [ce_sum, tokens, rare_ce_sum, rare_tokens]
    in float32 (always of the rare bucket), so plain CE = ce_sum / tokens and rare CE =
    rare_ce_sum / rare_tokens can be summed over micro-batches and ranks before dividing.

    >>> logits = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75]]]))
    >>> loss, stats = rare_weighted_loss(logits, torch.tensor([[0, 1]]),
    ...                                  torch.tensor([False, True]), 2.0)
    >>> round(loss.item(), 4), [round(s, 4) for s in stats.tolist()]
    (0.389, [0.9808, 2.0, 0.2877, 1.0])
    """
    vocab = logits.size(-1)
    ce = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1), reduction="none")
    rare = is_rare[targets.reshape(-1)]
    if rare_weight:
        chosen = rare if selected is None else selected.reshape(-1)
        weights = 1.0 + rare_weight * chosen.float()
        loss = (ce * weights).sum() / weights.sum()
    else:
        loss = ce.mean()
    with torch.no_grad():
        stats = torch.stack([ce.sum(), torch.tensor(float(ce.numel()), device=ce.device),
                             (ce * rare).sum(), rare.sum().float()])
    return loss, stats


# --------------------------------------------------------------------------- per-token weights

def tlat_weights(counts, form: str, a: float, t: float) -> torch.Tensor:
    """Token-level adaptive training (Gu et al., EMNLP 2020): float32 [V] weight per token.

    With c = Count / median(Count of the tokens seen in train), as the authors' code
    normalises it (github.com/ictnlp/TLAT-NMT, criterions/label_smoothed_cross_entropy.py):

        tlat_exp:  f(c) = exp(-T * c)
        tlat_chi2: f(c) = c^2 * exp(-T * c)
        w = 1 + A * f(c) / max f

    (max over the tokens seen in train), so weights run from 1 (frequent tokens) to
    1 + A (the most favoured seen token; an unseen one gets at most that); the paper's
    `A * f + 1` with f scaled to a maximum of 1, which the code fixes at A = e - 1.
    The exponential form favours the rarest tokens most, the chi-square form peaks at
    c = 2 / T and gives very rare tokens less. Worked example, counts 1, 2, 4 (median 2:
    c = 0.5, 1, 2), A = 1, T = 1:

        exp:  f = 0.607, 0.368, 0.135 -> w = 1 + f / 0.607 = 2.0, 1.607, 1.223
        chi2: f = 0.152, 0.368, 0.541 -> w = 1 + f / 0.541 = 1.280, 1.680, 2.0

    >>> [round(w, 3) for w in tlat_weights(np.array([1, 2, 4]), "tlat_exp", 1.0, 1.0).tolist()]
    [2.0, 1.607, 1.223]
    >>> [round(w, 3) for w in tlat_weights(np.array([1, 2, 4]), "tlat_chi2", 1.0, 1.0).tolist()]
    [1.28, 1.68, 2.0]
    """
    counts = np.asarray(counts, dtype=np.float64)
    seen = counts[counts > 0]
    c = counts / (np.median(seen) if len(seen) else 1.0)
    f = np.exp(-t * c) if form == "tlat_exp" else c ** 2 * np.exp(-t * c)
    top = f[counts > 0].max() if len(seen) else 1.0  # unseen tokens (never targets) do not set it
    return torch.from_numpy(1.0 + a * np.minimum(f / max(top, 1e-300), 1.0)).float()


def face_weights(counts: torch.Tensor) -> torch.Tensor:
    """FACE's pre-weights (Jiang et al. 2019, arXiv 1902.09191), float32 [V], mean 1.

    RF_v = count_v / sum(count) (relative frequency), w_v = 1 - RF_v / max(RF)
    (a = -1 / max RF: the most frequent token weighs 0, an unseen one 1), then
    normalised to mean 1 over the vocabulary: w_v * V / sum(w). Worked example,
    counts 6, 3, 1, 0: RF = 0.6, 0.3, 0.1, 0; w = 0, 0.5, 0.833, 1; sum 2.333;
    times 4 / 2.333:

    >>> [round(w, 3) for w in face_weights(torch.tensor([6, 3, 1, 0])).tolist()]
    [0.0, 0.857, 1.429, 1.714]
    """
    rf = counts.double() / counts.sum().clamp_min(1)
    w = 1.0 - rf / rf.max().clamp_min(1e-300)
    return (w * len(w) / w.sum().clamp_min(1e-300)).float()


class FaceWeights:
    """FACE's frequencies, counted as training goes and turned into weights every `refresh` steps.

    The counts start from the train counts (so weights exist from step 0); each step
    adds the frequencies of the targets (`source: targets`) or of the model's argmax
    predictions (`source: predictions`) of every micro-batch, summed over the DDP
    ranks at the step's end; every `refresh` steps the weights are recomputed from the
    counts (`face_weights`). Its state (counts, weights) goes into the checkpoint.
    """

    def __init__(self, counts, source: str, refresh: int, device=None):
        self.source, self.refresh = source, refresh
        self.counts = torch.as_tensor(np.asarray(counts, dtype=np.int64)).to(device)
        self.pending = torch.zeros_like(self.counts)
        self.weights = face_weights(self.counts)

    def observe(self, logits: torch.Tensor, y: torch.Tensor) -> None:
        with torch.no_grad():
            seen = y if self.source == "targets" else logits.detach().argmax(-1)
            self.pending += torch.bincount(seen.reshape(-1), minlength=len(self.counts))

    def step_end(self, done: int, all_reduce) -> None:
        all_reduce(self.pending)
        self.counts += self.pending
        self.pending.zero_()
        if done % self.refresh == 0:
            self.weights = face_weights(self.counts)

    def state(self) -> dict:
        return {"counts": self.counts.cpu(), "weights": self.weights.cpu()}

    def load_state(self, state: dict) -> None:
        self.counts = state["counts"].to(self.counts.device)
        self.weights = state["weights"].to(self.weights.device)
        self.pending = torch.zeros_like(self.counts)


# --------------------------------------------------------------------------- per-token losses

def focal(ce: torch.Tensor, gamma: float) -> torch.Tensor:
    """Focal loss (Lin et al. 2017) from cross-entropy: (1 - p_t)^gamma * ce, p_t = exp(-ce).

    gamma = 0 is cross-entropy. Worked example, p_t = 0.5 (ce = log 2 = 0.693), gamma = 2:
    0.5^2 * 0.693 = 0.173; a well-predicted p_t = 0.9 (ce 0.105) keeps 0.01 * 0.105.

    >>> [round(x, 4) for x in focal(-torch.log(torch.tensor([0.5, 0.9])), 2.0).tolist()]
    [0.1733, 0.0011]
    """
    return (-torch.expm1(-ce)).pow(gamma) * ce


def unlikelihood(logits: torch.Tensor, targets: torch.Tensor, selected: torch.Tensor,
                 candidates: torch.Tensor) -> torch.Tensor:
    """Token-level unlikelihood (Welleck et al., ICLR 2020), summed over the selected targets.

    At each selected target t, the negative candidates C_t are the tokens of `candidates`
    (the frequent bucket) whose logit is above the target's; UL_t = -sum_{c in C_t}
    log(1 - p_c), with p the model's own softmax (float32). logits [N, V], targets,
    selected [N]. Worked example, p = 0.5, 0.3, 0.2, target 2, token 0 frequent, 1 not:
    C = {0}, UL = -log(1 - 0.5) = 0.693.

    >>> logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    >>> round(unlikelihood(logits, torch.tensor([2]), torch.tensor([True]),
    ...                    torch.tensor([True, False, False])).item(), 4)
    0.6931
    """
    rows = selected.nonzero().squeeze(1)
    if rows.numel() == 0:
        return logits.float().sum() * 0.0  # keeps the graph (and DDP) the same every step
    z = logits[rows].float()
    above = z > z.gather(1, targets[rows, None])
    negative = above & candidates[None, :]
    p = torch.softmax(z, dim=-1).masked_fill(~negative, 0.0)
    return -torch.log1p(-p.clamp(max=1.0 - 1e-6)).sum()


# --------------------------------------------------------------------------- AGG

class AdaptiveGradientGate:
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

    def __init__(self, vocab_size: int, alpha: float, memory: int, device=None):
        self.alpha, self.memory = alpha, max(1, int(memory))
        self.steps = 0  # optimizer steps finished
        self.window: list[tuple[torch.Tensor, torch.Tensor]] = []  # (ids, counts) per finished step
        self.window_sum = torch.zeros(vocab_size, dtype=torch.int64, device=device)
        self.pending = torch.zeros_like(self.window_sum)  # this step's targets so far
        self.targets = self.g1 = self.g2 = self.rare_rows = None
        self.any_rare = False

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


# --------------------------------------------------------------------------- the entry point

def needs_counts(loss_params) -> bool:
    """Whether `loss.*` reads the train token counts (data/rare/counts.npy)."""
    return loss_params.token_weight != "uniform" or loss_params.logit_adjust_tau > 0


class Objective:
    """The loss `train` optimises, per `loss.*` (module docstring).

    Called with a batch's logits, targets and the train-split positions its
    windows start at (`starts`, int64 [B]); the term index turns those into the
    term positions among the targets.

        >>> from rarelm.rare import TermIndex
        >>> index = TermIndex(np.array([[2, 2, 0]]), max_length=2)  # a term on positions 2, 3
        >>> is_rare = torch.tensor([False, False, True])          # token 2 is in the rare bucket
        >>> y = torch.tensor([[2, 0, 1]])                          # targets at positions 1, 2, 3
        >>> [Objective(t, 2.0, is_rare, index).selected(y, np.array([0])).tolist()
        ...  for t in ("rare_bucket", "terms", "both")]
        [[[True, False, False]], [[False, True, True]], [[True, True, True]]]

    The other `loss.*` come in `params` (a `LossParams`), with the bucket of frequent
    tokens (`is_frequent`, for unlikelihood), the train `counts` where `needs_counts`,
    and `steps_per_epoch` (AGG's memory); `from_params` builds it all from buckets.
    """

    def __init__(self, targets: str, rare_weight: float, is_rare: torch.Tensor, term_index=None,
                 *, params=None, is_frequent: torch.Tensor | None = None, counts=None,
                 steps_per_epoch: int = 1):
        from rarelm.params import LossParams

        if targets not in ("rare_bucket", "terms", "both"):
            raise ValueError(f"loss.targets = {targets!r}")
        if targets != "rare_bucket" and term_index is None:
            raise ValueError(f"loss.targets = {targets} needs the term index")
        self.targets, self.rare_weight = targets, rare_weight
        self.is_rare, self.term_index = is_rare, term_index
        p = self.params = params or LossParams()
        device, vocab = is_rare.device, len(is_rare)
        if needs_counts(p) and counts is None:
            from rarelm.errors import RarelmError

            what = (f"loss.token_weight = {p.token_weight}" if p.token_weight != "uniform"
                    else f"loss.logit_adjust_tau = {p.logit_adjust_tau}")
            raise RarelmError(f"{what} needs the train token counts (data/rare/counts.npy); "
                              "run the rare_terms stage first")
        self.token_weight = self.face = self.log_prior = self.agg = None
        if p.token_weight in ("tlat_exp", "tlat_chi2"):
            self.token_weight = tlat_weights(counts, p.token_weight, p.tlat_a, p.tlat_t).to(device)
        elif p.token_weight == "face":
            self.face = FaceWeights(counts, p.face_source, p.face_refresh, device)
        if p.logit_adjust_tau > 0:
            from rarelm.rare import log_prior

            self.log_prior = torch.from_numpy(p.logit_adjust_tau * log_prior(counts)).float().to(device)
        if p.agg:
            self.agg = AdaptiveGradientGate(vocab, p.agg_alpha, steps_per_epoch, device)
        self.is_frequent = is_frequent if is_frequent is not None else torch.zeros_like(is_rare)
        # anything beyond `rare_weighted_loss`'s weighted cross-entropy (AGG changes gradients only)
        self.reshaped = (p.token_weight != "uniform" or p.focal_gamma > 0
                         or p.logit_adjust_tau > 0 or p.unlikelihood > 0)

    @classmethod
    def from_params(cls, params, buckets, vocab_size: int, device, term_index=None, counts=None,
                    steps_per_epoch: int = 1) -> Objective:
        """The objective of `params` (LossParams) for a model with `vocab_size` outputs."""
        return cls(params.targets, params.rare_weight, rare_mask(buckets, vocab_size).to(device),
                   term_index, params=params, counts=counts, steps_per_epoch=steps_per_epoch,
                   is_frequent=rare_mask(buckets, vocab_size, FREQUENT_BUCKET).to(device))

    def selected(self, y: torch.Tensor, starts: np.ndarray) -> torch.Tensor:
        """Bool [B, T]: the targets that weigh 1 + rare_weight."""
        rare = self.is_rare[y]
        if self.targets == "rare_bucket":
            return rare
        terms = torch.from_numpy(self.term_index.target_mask(starts, y.size(1))).to(y.device)
        return terms if self.targets == "terms" else terms | rare

    def prepare_model(self, model) -> None:
        """Once, before DDP or compile wrap the model: AGG routes its output layer through the gate."""
        if self.agg is None:
            return
        head = model.get_output_embeddings()
        if not isinstance(head, torch.nn.Linear):
            from rarelm.errors import RarelmError

            raise RarelmError(f"loss.agg = true needs a linear output layer; this model's is "
                              f"{type(head).__name__}")
        self.agg.wrap(head)

    def __call__(self, logits: torch.Tensor, y: torch.Tensor, starts: np.ndarray
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.agg is not None:
            self.agg.observe(y)
        if self.face is not None:
            self.face.observe(logits, y)
        if not self.reshaped:
            if not self.rare_weight:
                return rare_weighted_loss(logits, y, self.is_rare, 0.0)
            return rare_weighted_loss(logits, y, self.is_rare, self.rare_weight,
                                      self.selected(y, starts))
        p, vocab = self.params, logits.size(-1)
        raw = logits.float().reshape(-1, vocab)
        targets = y.reshape(-1)
        adjusted = raw if self.log_prior is None else raw + self.log_prior
        ce = F.cross_entropy(adjusted, targets, reduction="none")
        per_target = focal(ce, p.focal_gamma) if p.focal_gamma > 0 else ce
        selected = (self.selected(y, starts).reshape(-1)
                    if self.rare_weight or p.unlikelihood > 0 else None)
        weights = 1.0 + self.rare_weight * selected.float() if self.rare_weight else None
        vocab_weight = self.face.weights if self.face is not None else self.token_weight
        if vocab_weight is not None:
            weights = vocab_weight[targets] * (1.0 if weights is None else weights)
        if weights is None:
            loss = per_target.mean()
        else:
            loss = (per_target * weights).sum() / weights.sum().clamp_min(1e-12)
        if p.unlikelihood > 0:
            ul = unlikelihood(raw, targets, selected, self.is_frequent)
            loss = loss + p.unlikelihood * ul / targets.numel()
        with torch.no_grad():
            plain = ce if self.log_prior is None else F.cross_entropy(raw, targets, reduction="none")
            rare = self.is_rare[targets]
            stats = torch.stack([plain.sum(), torch.tensor(float(plain.numel()), device=plain.device),
                                 (plain * rare).sum(), rare.sum().float()])
        return loss, stats

    def step_end(self, done: int, dist=None) -> None:
        """After optimizer step `done`: FACE sums its counts over the ranks (and refreshes), AGG
        moves the step into its window."""
        if self.face is not None:
            self.face.step_end(done, dist.all_reduce if dist is not None else (lambda t: None))
        if self.agg is not None:
            self.agg.step_end()

    def state(self) -> dict:
        """This rank's objective state for a checkpoint (CPU tensors, weights_only-loadable)."""
        return {**({"face": self.face.state()} if self.face is not None else {}),
                **({"agg": self.agg.state()} if self.agg is not None else {})}

    def load_state(self, state: dict | None) -> None:
        state = state or {}
        if self.face is not None and "face" in state:
            self.face.load_state(state["face"])
        if self.agg is not None and "agg" in state:
            self.agg.load_state(state["agg"])
