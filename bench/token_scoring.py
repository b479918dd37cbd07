"""Teacher-forced token scoring (`score_tokens`): logits post-processed in row chunks against whole.

`rarelm/evaluate/token_scoring.py` reduces the logits of a batch (NLL's logsumexp, the top-5,
the mass on term-start tokens) `ROWS` rows at a time; the whole-batch way (one logsumexp over
32 x 128 x vocabulary) was what it did before. Both run interleaved here on the same model,
windows, bucket ids, term and term-start masks, `eval.threads`' default of one thread and
`eval.batch_size`' default of 32 windows; the two must give the same metrics bit for bit. Also
timed: the forward alone with and without the KV cache it no longer builds (`use_cache=False`).

    python bench/token_scoring.py --model base/model --tokens 200000 --repeats 3
"""

from __future__ import annotations

import argparse
from pathlib import Path

import harness


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("base/model"))
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import numpy as np
    import torch

    from rarelm.evaluate import token_scoring
    from rarelm.evaluate.common import EvalContext
    from rarelm.evaluate.model_folder import load_causal_lm
    from rarelm.params import EvalParams

    torch.set_num_threads(args.threads)
    model = load_causal_lm(args.model, "cpu")
    vocab, block = model.config.vocab_size, model.config.n_positions
    rng = np.random.default_rng(0)  # the time depends on the shapes, not on the values
    tokens = rng.integers(0, vocab, args.tokens).astype(np.uint16)
    buckets = rng.integers(0, 4, vocab)
    terms = rng.random(args.tokens) < 0.01
    starts = terms & (rng.random(args.tokens) < 0.3)

    def score(rows: int) -> tuple[float, dict]:
        token_scoring.ROWS = rows
        ctx = EvalContext(model, None, 0, EvalParams(batch_size=32))
        seconds, stats = harness.timed(lambda: token_scoring.score_tokens(
            ctx, tokens, buckets, block, term_mask=terms, start_mask=starts))
        return seconds, stats.metrics()

    windows = torch.as_tensor(tokens[:32 * block].astype(np.int64)).reshape(32, block)

    def forward(use_cache: bool) -> float:
        with torch.no_grad():
            return harness.timed(lambda: model(input_ids=windows, use_cache=use_cache))[0]

    times: dict[str, list[float]] = {}
    results = {}
    for _ in range(args.repeats):
        for label, rows in (("whole batch", 1 << 30), ("chunks of 128 rows", 128)):
            seconds, results[label] = score(rows)
            times.setdefault(label, []).append(seconds)
        for use_cache in (True, False):
            times.setdefault(f"forward, use_cache={use_cache}", []).append(forward(use_cache))
    best = {label: min(values) for label, values in times.items()}
    harness.print_json({"model": str(args.model), "tokens": args.tokens, "threads": args.threads,
                        "vocab": vocab, "best_s": best, "all_s": times,
                        "speedup": best["whole batch"] / best["chunks of 128 rows"],
                        "same_metrics": results["whole batch"] == results["chunks of 128 rows"]})


if __name__ == "__main__":
    main()
