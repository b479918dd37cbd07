"""Stage `weights`: one sampling weight per training sample, from `weights.score` and `alpha`.

    python -m stages.weights
    dvc exp run -S alpha=0.7        # re-runs weights and what follows it, nothing before

Reads the tokenized train split and data/rare/ (token counts and buckets, terms and where they
occur), writes:

    data/weights/weights.npy   float64 [samples], mean 1; weight i belongs to window i of
                               rarelm.artifacts.tokenized.Samples
    data/weights/scores.npy    float64 [samples], log score of each window (weights = scores at `alpha`;
                               training recomputes weights from them when weights.schedule varies alpha)
    data/weights/summary.json  the same as metrics/weights.json
    metrics/weights.json       alpha, Kish effective sample size (ess, ess_fraction), rare_exposure,
                               exposure per bucket, term_exposure per term train-count band (and le8:
                               terms seen <= 8 times), top1pct_weight_share, min, max, max_over_min
    plots/weights.csv          histogram of log10 weights (log10_weight, samples)

The formulas are in rarelm/weights/scoring.py.
"""

from pathlib import Path

import typer

from rarelm import paths
from rarelm.errors import RarelmError, user_errors
from rarelm.files import atomic_dir, outputs_together, write_csv, write_json
from rarelm.params import load_params

app = typer.Typer(add_completion=False, help=__doc__)


def check_term_lengths(terms: Path, block_size: int) -> None:
    """Refuse a glossary term longer than `evaluate` can test in model.block_size tokens: a prompt
    of at least one token, then room for the term twice plus 4 (rarelm/evaluate/splits.py). Was
    refused only by evaluate, after training, in a line that did not name it. (Here, not in
    rare_terms: this stage declares model.block_size, rare_terms does not.)"""
    import json

    most = (block_size - 5) // 2
    try:
        rows = [json.loads(line) for line in terms.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError):
        return  # missing or malformed: `compute` says so in its own line
    for row in rows:
        lengths = [len(ids) for ids in row.get("token_ids") or []] if isinstance(row, dict) else []
        if row.get("source") == "glossary" and lengths and min(lengths) > most:
            term = str(row.get("term", ""))
            shown = term if len(term) <= 60 else term[:57] + "..."
            raise RarelmError(
                f"rare.glossary: the term {shown!r} is {min(lengths)} tokens long; evaluate tests terms "
                f"of at most {most} tokens with model.block_size = {block_size} (a prompt, then the term "
                "twice); shorten or remove it, then re-run rare_terms")


@app.command()
def weights(
    params_file: Path = typer.Option(paths.PARAMS, "--params", help="params.yaml to read"),
    tokenized: Path = typer.Option(paths.TOKENIZED, help="the tokenize stage's folder"),
    rare_dir: Path = typer.Option(paths.RARE, "--rare", help="the rare_terms stage's folder"),
    out: Path = typer.Option(paths.WEIGHTS, help="output folder"),
    metrics: Path = typer.Option(paths.WEIGHTS_METRICS, help="metrics file"),
    plot: Path = typer.Option(paths.WEIGHTS_PLOT, help="weight histogram (CSV)"),
) -> None:
    """Weight every training sample by the rarity of its tokens or of the terms it holds."""
    # on use: numpy would add ~0.3 s to every `rarelm` command's start-up (`rarelm --help`)
    import numpy as np

    from rarelm.weights.stage import compute

    with user_errors("weights"):
        params = load_params(params_file, hold=True)  # outputs refused if it changes meanwhile
        check_term_lengths(rare_dir / "terms.jsonl", params.model.block_size)
        values, scores, stats, histogram = compute(params, tokenized, rare_dir)
        with outputs_together():  # the three outputs change together, or none does
            with atomic_dir(out) as tmp:
                np.save(tmp / "weights.npy", values)
                np.save(tmp / "scores.npy", scores)
                write_json(tmp / "summary.json", stats)
            write_json(metrics, stats)
            write_csv(plot, ["log10_weight", "samples"], histogram, cell=str)  # bins rounded to 6 decimals
    rare, terms = stats["rare_exposure"], stats["term_exposure"]["le8"]["exposure"]
    print(f"weights: {stats['samples']} samples, score {stats['score']}, alpha {stats['alpha']:g}, max/min "
          f"{stats['max_over_min']:.3g}, ESS {stats['ess_fraction']:.1%}, rare-token exposure "
          f"{'n/a' if rare is None else f'{rare:.3f}x'}, terms seen <= 8 times "
          f"{'n/a' if terms is None else f'{terms:.2f}x'}, top 1% hold {stats['top1pct_weight_share']:.1%}")


if __name__ == "__main__":
    app()
