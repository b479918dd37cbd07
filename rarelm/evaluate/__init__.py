"""The `evaluate` stage's measurements (how well a model predicts and writes rare tokens and terms),
the decoding they share with `rarelm generate`, and `rarelm generate` itself.

For each split in `eval.splits` (`splits.evaluate_split`; `splits.combine` makes
metrics/eval.json), four measurements, each with the counts behind it:

1. Teacher-forced scoring (`token_scoring`): every token after the first, summed
   per frequency bucket of the target and on the tokens covering term occurrences:
   `ppl`, `ppl_<bucket>`, `acc_<bucket>`, `recall_at_5_<bucket>`, `rare_token_acc`,
   `rare_token_recall_at_5`, `ppl_term`, ..., and the model's probability mass on
   term-start tokens where no term starts (`false_insertion_start_mass`).
2. Rare-term generation (`term_generation`): every occurrence of a term of
   data/rare/terms.jsonl in the split's text (capped at `eval.max_terms`, round
   robin over terms); prompt = up to `eval.context_tokens` tokens before the first
   token covering the term; greedy decoding until the text covers lead + term as
   written there. One row per occurrence (metrics/eval_occurrences.jsonl);
   `term_metrics` turns the rows into `term_exact_match`, `term_nll_per_char`, `term_ppl`
   (term perplexity), `term_completion_match` (the rest of the term written once its first
   token is given), `term_token_acc`, `term_choice_acc`, their variants (by mention, by
   train-count band and stratum: seen 0-1, 2-15, 16+ times) and `em50_train_count`.
3. Diversity (`diversity`): `eval.diversity_prompts` prompts spread evenly over
   the split, each continued by `eval.diversity_tokens` tokens sampled at
   temperature 1, against the human text that followed.
4. False insertion (`false_insertion`): `eval.insertion_prompts` sampled
   continuations of `eval.insertion_tokens` tokens; extracted terms per 1,000
   tokens in them vs in the split's text (`false_insertion_rate`).

With `eval.logit_adjust_tau` > 0 all four measure the post-hoc logit-adjusted
model, `logits - tau * log pi` (pi: the train unigram prior), the model a user
would deploy (`decoding.logit_adjustment`; `logit_bias` None = the model as trained).

With `eval.general_text` (by default `auto`: data/general/<language>.txt), general text held out
from the base model's pretraining is scored as `ppl_general_model` by the model alone, the
forgetting guard, and as `ppl_general` by what is evaluated (the same figure unless kNN-LM or the
cache is mixed in) (`general_text`; data/general/); with `eval.general_text_outside` (`auto`:
data/general/<language>.outside.txt), general text from outside the base's pretraining family as
`ppl_general_outside`, the model alone.

The other modules: `stage` (the `evaluate` stage start to end: load, measure every split, write
the outputs together, log them into the training run), `model_folder` (load a Hugging Face causal LM folder),
`decoding` (batched greedy and sampled continuations), `scoring` (teacher-forced
scores of given continuations), `mlflow_log` (the results into the training run),
`generate` (`rarelm generate`), `common` (`EvalContext`: what every measurement of one evaluation
reads, built once by the stage and passed down; `SplitText`: the split measured; progress, ratio).
"""
