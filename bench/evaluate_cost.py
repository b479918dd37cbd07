"""Where the evaluate stage's time goes on one split: each part of `evaluate_split` timed alone.

Run from a workspace where `prepare`, `tokenize` and `rare_terms` ran (data/prepared,
data/tokenized, data/rare and params.yaml), on one thread as `eval.threads` defaults to. A model of
the fine-tune's size stands for the fine-tune (the cost does not depend on the weights):

    python bench/evaluate_cost.py --model base/model --general data/general/zh.txt

Prints seconds per part (the term generation's teacher-forced NLL and its completion decode are
also shown alone, inside it) and the figures they produced (docs/evaluation.md, "Cost of the
user-facing metrics on a real-text split").
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("base/model"))
    parser.add_argument("--general", default="", help="a general-text slice to score too (data/general/)")
    parser.add_argument("--split", default="test")
    args = parser.parse_args()

    import torch

    from rarelm.artifacts.buckets import load_buckets
    from rarelm.artifacts.terms import load_terms
    from rarelm.artifacts.tokenized import TokenizedData, load_tokenizer
    from rarelm.evaluate import splits, term_generation
    from rarelm.evaluate.common import EvalContext, SplitText
    from rarelm.evaluate.general_text import general_metrics
    from rarelm.evaluate.model_folder import load_causal_lm
    from rarelm.params import EvalParams, load_params
    from rarelm.prepare.corpus import read_split

    torch.set_num_threads(1)
    params = load_params("params.yaml")
    times: dict[str, float] = {}

    def timed(module, name: str, label: str) -> None:
        inner = getattr(module, name)

        @functools.wraps(inner)
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                times[label] = times.get(label, 0.0) + time.perf_counter() - t
        setattr(module, name, wrapper)

    timed(splits.term_search, "find_occurrences", "find term occurrences in text")
    timed(splits, "score_tokens", "teacher-forced scoring of every token")
    timed(splits, "evaluate_terms", "term generation (all)")
    timed(term_generation, "continuation_scores", "  of which the teacher-forced term NLL")
    timed(term_generation, "_complete", "  of which the completion given the first token")
    timed(splits, "diversity", "diversity")
    timed(splits, "false_insertion", "false insertion")

    data = TokenizedData.open(Path("data/tokenized"))
    buckets = load_buckets(Path("data/rare"), data.vocab_size).astype("int64")
    terms = load_terms(Path("data/rare/terms.jsonl"))
    tokenizer = load_tokenizer(data.tokenizer_dir, data.vocab_size)
    model = load_causal_lm(args.model, "cpu")
    documents = list(read_split(Path("data/prepared"), args.split))
    start = time.perf_counter()
    ctx = EvalContext(model, tokenizer, data.eot_id, params.eval, params.seed)
    split = SplitText(args.split, data.tokens(args.split), data.offsets(args.split), documents)
    result = splits.evaluate_split(ctx, split, buckets, terms)
    total = time.perf_counter() - start
    general = {}
    if args.general:
        t = time.perf_counter()
        general = general_metrics(EvalContext(model, tokenizer, data.eot_id,
                                              EvalParams(batch_size=params.eval.batch_size)),
                                  args.general, data.vocab_size, 128)
        times[f"general text ({args.general})"] = time.perf_counter() - t
    m = result.metrics
    print(json.dumps({"evaluate_split_s": round(total, 1), **{k: round(v, 1) for k, v in times.items()},
                      "n_eval_tokens": m["n_eval_tokens"], "n_eval_terms": m["n_eval_terms"],
                      "term_exact_match": m["term_exact_match"],
                      "term_completion_match": m["term_completion_match"], "term_ppl": m["term_ppl"],
                      **general}, indent=1))


if __name__ == "__main__":
    main()
