"""What the training step hands the objective: the model's logits, or its last hidden states and
output matrix, from which the objective computes the loss chunk by chunk (rarelm/objectives/linear_ce.py)
without ever making the [B, T, V] logits.

    output = output_layer(model, chunked=True)        # once, before DDP / compile wrap the model
    with precision.autocast(), output.hidden_states():
        scores = output.scores(model(input_ids=x).logits, precision.dtype)
    loss, stats = objective(scores, y, starts, x)

Any causal LM whose logits are exactly its output embeddings (`get_output_embeddings()`, a
bias-free `torch.nn.Linear`) applied to what reaches them: checked on the model itself, once,
by one short forward with and without the output layer (`_logits_are_the_head_of_hidden`), so
a model that changes its logits after the output layer (Gemma 2's final soft-capping, a logit
scale) or has a bias there keeps the full-logits path, as do objectives that need the full
logits (`Objective.needs_logits`: KL to the base, frequent-token unlikelihood, FACE from
predictions, AGG) and FSDP (its output matrix is sharded outside the forward). The hidden
states come out of the model's own forward (through DDP, gradient checkpointing and compile
alike), computed once: inside `hidden_states()` the output layer passes its input through.

>>> from transformers import GPT2Config, GPT2LMHeadModel
>>> model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=16, n_positions=8,
...                                         bos_token_id=0, eos_token_id=0))
>>> output = output_layer(model, chunked=True)
>>> with output.hidden_states():
...     tuple(model(input_ids=torch.zeros(1, 4, dtype=torch.long)).logits.shape)
(1, 4, 8)
>>> tuple(model(input_ids=torch.zeros(1, 4, dtype=torch.long)).logits.shape)  # outside: logits
(1, 4, 16)
"""

from __future__ import annotations

import contextlib

import torch

from rarelm.objectives.hidden import HiddenStates


class OutputLayer:
    """The full-logits path (`head` None) or the chunked one through `head`, its products by
    `mm(a, b)` (None: torch's; rarelm.train.matmul.mm: oneDNN where that is faster)."""

    def __init__(self, head: torch.nn.Linear | None = None, mm=None):
        self.head, self.passing, self.mm = head, False, mm

    @property
    def chunked(self) -> bool:
        return self.head is not None

    @contextlib.contextmanager
    def hidden_states(self):
        """Within it the model's forward returns its last hidden states as `.logits`."""
        self.passing = self.chunked
        try:
            yield
        finally:
            self.passing = False

    def scores(self, out: torch.Tensor, dtype=None) -> torch.Tensor | HiddenStates:
        """What the objective takes: the logits as they are, or `HiddenStates` for the output
        matrix in `dtype` (the autocast dtype; None: fp32)."""
        return out if self.head is None else HiddenStates(out, self.head.weight, dtype, self.mm)


def output_layer(model, chunked: bool, mm=None) -> OutputLayer:
    """The chunked path where `chunked` is wanted and the model's logits are its output layer of
    its hidden states (its products by `mm`); the full-logits path otherwise."""
    head = model.get_output_embeddings() if chunked else None
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return OutputLayer()
    output = OutputLayer(head, mm)
    plain_forward = head.forward

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        return hidden if output.passing else plain_forward(hidden)

    head.forward = forward
    if not _logits_are_the_head_of_hidden(model, output):
        head.forward = plain_forward
        return OutputLayer()
    return output


def _logits_are_the_head_of_hidden(model, output: OutputLayer) -> bool:
    """Whether the model's logits equal its output matrix times what its forward feeds the output
    layer (fp32, eval mode, 8 tokens; the RNGs untouched: no dropout, nothing sampled)."""
    device = output.head.weight.device
    ids = (torch.arange(8, device=device) % output.head.weight.size(0))[None]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits
            with output.hidden_states():
                hidden = model(input_ids=ids, use_cache=False).logits
            if hidden.shape[-1] != output.head.weight.size(1):
                return False
            rebuilt = hidden @ output.head.weight.t()
            return rebuilt.shape == logits.shape and torch.allclose(rebuilt, logits, rtol=1e-4,
                                                                    atol=1e-5)
    finally:
        model.train(was_training)
