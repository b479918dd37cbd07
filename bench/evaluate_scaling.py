"""Rare-term evaluation on a real corpus: per-occurrence (eval.batch_size 1) against batched (32).

Times `rarelm.evaluate.term_generation.evaluate_terms` (greedy decodes, teacher-forced term
NLL and the closed-set choice among the candidate terms: the phase that took 83% of the
evaluate stage on foldoc_en) at two sizes (occurrences x candidate terms) and two models:
the committed base (base/model, 6 x 128) and a 2 x 64 GPT-2 with the same vocabulary built
here (random weights: the time depends on the shapes, not on the weights). Both paths run
interleaved, size by size; the rows of the two paths must be equal (ranks, tokens, matches).
Needs a workspace whose data/ holds foldoc_en prepared and tokenized by the base tokenizer and
its rare_terms output (`dvc repro rare_terms` with corpus.path=data/raw/foldoc_en.txt.gz,
tokenizer.name_or_path=base/model):

    python bench/evaluate_scaling.py --workspace . --sizes 20x250 40x1000   # one JSON line per run
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", type=Path, default=Path("."))
    parser.add_argument("--sizes", nargs="+", default=["20x250", "40x1000"], help="occurrences x terms")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from rarelm.artifacts.terms import load_terms
    from rarelm.artifacts.tokenized import TokenizedData, load_tokenizer
    from rarelm.evaluate.common import EvalContext, SplitText
    from rarelm.evaluate.model_folder import load_causal_lm
    from rarelm.evaluate.term_generation import evaluate_terms
    from rarelm.params import EvalParams
    from rarelm.prepare.corpus import read_split
    from rarelm.rare_terms import term_search

    torch.set_num_threads(1)  # eval.threads' default
    ws = args.workspace
    data = TokenizedData.open(ws / "data/tokenized")
    tokenizer = load_tokenizer(data.tokenizer_dir, data.vocab_size)
    documents = list(read_split(ws / "data/prepared", "test"))
    tokens, offsets = data.tokens("test"), data.offsets("test")
    all_terms = load_terms(ws / "data/rare/terms.jsonl")
    base = load_causal_lm(ws / "base/model", "cpu")
    torch.manual_seed(0)
    small = GPT2LMHeadModel(GPT2Config(vocab_size=base.config.vocab_size, n_positions=128, n_embd=64,
                                       n_layer=2, n_head=2, bos_token_id=data.eot_id,
                                       eos_token_id=data.eot_id)).eval()
    for name, model in (("base 6x128", base), ("small 2x64", small)):
        for size in args.sizes:
            n_occ, n_terms = map(int, size.split("x"))
            terms = all_terms[:n_terms]
            per_term = term_search.find_occurrences(tokenizer, documents, tokens, offsets, terms)
            rows, seconds = {}, {}
            for batch in (1, args.batch_size):
                started = time.perf_counter()
                ctx = EvalContext(model, tokenizer, data.eot_id,
                                  EvalParams(max_terms=n_occ, context_tokens=64, batch_size=batch))
                rows[batch] = evaluate_terms(ctx, SplitText("test", tokens, offsets, documents), terms,
                                             per_term)
                seconds[batch] = time.perf_counter() - started
            same = all(_exact(a) == _exact(b) for a, b in zip(rows[1], rows[args.batch_size], strict=True))
            print(json.dumps({"model": name, "occurrences": len(rows[1]), "terms": n_terms,
                              "per_occurrence_s": round(seconds[1], 1),
                              "batched_s": round(seconds[args.batch_size], 1),
                              "speedup": round(seconds[1] / seconds[args.batch_size], 2),
                              "rows_equal": same}), flush=True)


def _exact(row: dict) -> dict:
    """A row without its NLLs (float32 rounding may differ between the paths)."""
    return {k: v for k, v in row.items() if not k.startswith("nll")}


if __name__ == "__main__":
    main()
