"""Exposure of rare terms vs effective sample size, for `weights.score` settings: a markdown table.

    python bench/term_exposure.py [--params params.yaml] [--tokenized data/tokenized] [--rare data/rare]

Runs the weights stage's own code (`rarelm.weights.stage.compute`) on the pipeline's
tokenized data and rare_terms outputs (`dvc repro rare_terms` first) for each
setting below, and prints one row per setting: the Kish effective sample size
(fraction of samples) and the exposure of term occurrences per train-count band
relative to uniform sampling (1.00 = unchanged; `le8` = terms seen <= 8 times).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

SETTINGS = [  # (score, alpha, term_beta, term_floor)
    ("frequency", 0.7, None, None),
    ("frequency", 1.0, None, None),
    ("terms", 0.5, 1.0, 0.05),
    ("terms", 1.0, 1.0, 0.05),
    ("terms", 1.5, 1.0, 0.05),
    ("terms", 1.0, 1.0, 0.01),
    ("terms", 1.0, 2.0, 0.01),
]
BANDS = ["2-3", "4-7", "8-15", "le8", "16-31", "32-63", "64-127", "128-255"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--tokenized", type=Path, default=Path("data/tokenized"))
    parser.add_argument("--rare", type=Path, default=Path("data/rare"))
    args = parser.parse_args()

    from rarelm.params import load_params
    from rarelm.weights.stage import compute

    base = load_params(args.params)
    print("| weights.score | alpha | term_beta | term_floor | ESS | "
          + " | ".join(f"terms {b}" if b != "le8" else "terms <= 8" for b in BANDS) + " |")
    print("|" + " --- |" * (5 + len(BANDS)))
    for score, alpha, beta, floor in SETTINGS:
        wp = dataclasses.replace(base.weights, score=score,
                                 term_beta=beta if beta is not None else base.weights.term_beta,
                                 term_floor=floor if floor is not None else base.weights.term_floor)
        params = dataclasses.replace(base, alpha=alpha, weights=wp)
        _, _, stats, _ = compute(params, args.tokenized, args.rare)
        exposure = stats["term_exposure"]
        cells = [f"{exposure[b]['exposure']:.2f}x" if b in exposure and exposure[b]["exposure"] else "-"
                 for b in BANDS]
        print(f"| {score} | {alpha:g} | {'' if beta is None else f'{beta:g}'} | "
              f"{'' if floor is None else f'{floor:g}'} | {stats['ess_fraction']:.0%} | "
              + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
