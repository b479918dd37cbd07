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
from rarelm.errors import user_errors
from rarelm.params import load_params

app = typer.Typer(add_completion=False, help=__doc__)


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
    from rarelm.weights.stage import run, summary

    with user_errors("weights"):
        params = load_params(params_file, hold=True)  # outputs refused if it changes meanwhile
        stats = run(params, tokenized, rare_dir, out, metrics, plot)
    print(summary(stats))


if __name__ == "__main__":
    app()
