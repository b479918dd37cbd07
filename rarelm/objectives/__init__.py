"""The training objectives: cross-entropy, reweighted and reshaped per `loss.*`.

The baseline (`rare_weight.py`) weighs the targets `loss.targets` selects
(`selection.py`) 1 + `loss.rare_weight`. The published rare-token remedies compose
with it, one module each, with its formula, source and a worked example:

    w_t  = (1 + rare_weight * selected_t) * token_weight[y_t]   loss.token_weight
    l_t  = (1 - p_t)^gamma * -log p_t                            loss.focal_gamma (0: CE)
    p    = softmax(logits + tau * log pi)                        loss.logit_adjust_tau (0: as is)
    loss = sum(w_t * l_t) / D                                    loss.normalize: D = sum(w_t) | N
           + unlikelihood * sum_t UL_t / N                       loss.unlikelihood (0: off)
           + frequent_unlikelihood * sum_{t selected} UL'_t / N  loss.frequent_unlikelihood (0: off)
           + kl_base * sum_{t not selected} KL_t / N             loss.kl_base (0: off)

(N: the number of targets.)

* token_weight: `tlat.py` (token-level adaptive training, Gu et al. 2020: exponential
  or chi-square in the train count), `face.py` (FACE, Jiang et al. 2019: from the
  relative frequency of the targets or of the model's argmax predictions, refreshed
  during training); uniform = 1;
* `focal.py` (Lin et al. 2017), `logit_adjust.py` (Menon et al. 2021; pi = the train
  unigram prior), `unlikelihood.py` (Welleck et al. 2020, as published: previous-context
  negatives at every target), `frequent_unlikelihood.py` (the repo's earlier variant:
  frequent tokens ranked above the selected targets);
* aimed at the trade between the terms and the general text (issue 22): `normalize.py`
  (the unselected targets keep their plain-CE share), `kl_base.py` (KL to the frozen
  starting model on the unselected targets), and `loss.targets: terms_after_first`
  (`selection.py`: a term's tokens after its first);
* `agg.py`: `loss.agg`, adaptive gradient gating (AGG, Yu et al. 2022) changes no
  loss: it gates the gradient that reaches rare tokens' output-embedding rows.

With every `loss.*` at its default the loss, its gradients and the logged sums are
exactly those of `rare_weighted_loss`. The logged sums are always plain
cross-entropy of the model's own logits. `objective.Objective` is the one entry
point the training loop calls: `prepare_model` once, the objective per micro-batch
(logits, or the `hidden.HiddenStates` they come from, targets, window starts, input ids:
from hidden states the loss is chunked over tokens, `linear_ce.py`, and the full logits
are made only for a remedy that needs them, `Remedy.needs_logits`),
`step_end` after each optimizer step, `state` / `load_state` with each checkpoint.

Adding a remedy is four things, nowhere else:
1. one module here with one class behind the protocol of `remedy.py` (`from_params`
   returns None where its params turn it off; only the hooks it needs);
2. its params in `LossParams` (rarelm/params/sections.py) and params.yaml;
3. one registration line: its class in `REMEDIES` (objective.py);
4. one test in tests/test_objectives.py, against a value computed by hand.
"""
