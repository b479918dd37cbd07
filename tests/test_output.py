"""What the training step hands the objective (rarelm/train/output.py): hidden states where the
model's logits are its output layer of them, else the logits; and training on them ends where
training on the full logits does.

Tolerance of the weights after N steps (AdamW, lr 1e-3, chunks of 16 tokens): the distance
between the two runs' weights within 1e-4 (fp32) / 0.1 (bf16 autocast, test_train.py's bound
for micro-batches against one batch) of the distance the weights moved. fp32 sums the same
products in another order, so the gradients agree to ~1e-7
relative, but AdamW divides each update by the gradient's own size, so a parameter whose true
gradient is 0 (the attention's key bias: softmax ignores a constant) moves by lr times its
rounding noise, which differs between the two: measured 2.9e-6 at most there, 3.5e-7 elsewhere,
the distance 2.0e-5 of the distance moved. bf16: the weight gradient's bf16 rounding differs
(test_linear_ce.py), which AdamW's normalised steps carry into the weights, as in
test_train.py's micro-batch test: measured 1.9% (rare weight) and 5.2% (unlikelihood + focal)
of the distance moved, while either bf16 run is as far from the fp32 one (4.3% / 5.3%).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rarelm.train.output import OutputLayer, output_layer
from tests.helpers import VOCAB, adamw_steps, distance, tiny_gpt2

COUNTS = np.arange(VOCAB) + 1  # the objective's token counts


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
@pytest.mark.parametrize("loss", [{"rare_weight": 2.0}, {"unlikelihood": 0.5, "focal_gamma": 1.0}])
def test_weights_after_n_steps_equal_the_full_logits_ones(dtype, loss, monkeypatch):
    from rarelm.objectives import linear_ce

    monkeypatch.setattr(linear_ce, "CHUNK_ELEMENTS", 16 * VOCAB)  # 64 tokens a step: 4 chunks
    start = tiny_gpt2().state_dict()
    full = adamw_steps(tiny_gpt2(), OutputLayer(), dtype, counts=COUNTS, **loss)
    model = tiny_gpt2()
    output = output_layer(model, chunked=True)
    assert output.chunked
    chunked = adamw_steps(model, output, dtype, counts=COUNTS, **loss)
    moved = distance(full, start)
    assert moved > 1e-3
    assert 0 < distance(chunked, full) < (1e-4 if dtype is None else 0.1) * moved


def test_a_model_that_changes_its_logits_after_the_output_layer_keeps_the_full_logits():
    """A bias on the output layer, or logits rescaled after it (as Gemma 2's soft-capping does):
    the hidden-state path would be wrong, so the model's forward stays as it is."""
    from transformers import GPT2LMHeadModel

    class Capped(GPT2LMHeadModel):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = 30.0 * torch.tanh(out.logits / 30.0)
            return out

    capped = Capped(tiny_gpt2().config)
    biased = tiny_gpt2()
    biased.lm_head.bias = torch.nn.Parameter(torch.zeros(VOCAB))
    ids = torch.zeros(1, 4, dtype=torch.long)
    for model in (capped, biased):
        output = output_layer(model, chunked=True)
        assert not output.chunked
        with output.hidden_states():
            assert model(input_ids=ids).logits.shape[-1] == VOCAB
    assert not output_layer(tiny_gpt2(), chunked=False).chunked


def test_the_check_leaves_the_rngs_and_the_training_mode_as_they_were():
    model = tiny_gpt2().train()
    torch.manual_seed(5)
    before = torch.get_rng_state()
    assert output_layer(model, chunked=True).chunked
    assert torch.equal(torch.get_rng_state(), before) and model.training
