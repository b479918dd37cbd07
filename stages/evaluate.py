"""Stage `evaluate`: trained model + tokenized splits + rare terms -> metrics/eval.json, plots.

    python -m stages.evaluate
    rarelm evaluate --model some/other/model

Writes metrics/eval.json (see rarelm/evaluate/ for every key), metrics/summary.json (its headline
figures per split and training's tokens/s from metrics/train.json: the file DVC reads as metrics),
metrics/eval_occurrences.jsonl (one row per evaluated term occurrence: the term, its
train count and band, mention type, what was due and what the model wrote, exact match,
first-token hit, NLL per token, per term and per character, term-token accuracy, first-token
rank, closed-set rank; `rarelm compare` pairs runs on these rows),
plots/eval_buckets.csv (perplexity and accuracy per frequency bucket and on term tokens)
and plots/eval_term_bands.csv (term generation accuracy per train-count band), and logs
the same into the MLflow run that trained the model (models/model/mlflow_run.json, when it
names the store this stage logs to: MLFLOW_TRACKING_URI, else the repo's mlflow.db; else a run
of its own) as `eval/<key>` metrics and `eval/` artifacts; the per-occurrence rows (test-corpus
text) only as `tracking.log_text` says.
"""

import time
from pathlib import Path

import typer

from rarelm import paths
from rarelm.errors import user_errors
from rarelm.evaluate import stage  # its `summary`: the --summary option's name here
from rarelm.params import load_params

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def evaluate(
    params_file: Path = typer.Option(paths.PARAMS, "--params", help="params.yaml to read"),
    model_dir: Path = typer.Option(paths.MODEL, "--model", help="model folder (any local causal LM)"),
    prepared: Path = typer.Option(paths.PREPARED, help="the prepare stage's folder (documents' text)"),
    tokenized: Path = typer.Option(paths.TOKENIZED, help="the tokenize stage's folder"),
    rare: Path = typer.Option(paths.RARE, help="the rare_terms stage's folder"),
    datastore: Path = typer.Option(paths.DATASTORE, help="the datastore stage's folder (kNN-LM)"),
    metrics: Path = typer.Option(paths.EVAL_METRICS, help="metrics file"),
    summary: Path = typer.Option(paths.SUMMARY_METRICS, help="headline metrics (what `dvc exp show` shows)"),
    train_metrics: Path = typer.Option(None, help="the model's training metrics, for the headline's tokens/s "
                                       "[default: metrics/train.json with the default --model]"),
    occurrences: Path = typer.Option(paths.EVAL_OCCURRENCES, help="per-occurrence results (JSON lines)"),
    plots: Path = typer.Option(paths.PLOTS, help="folder for the plot CSVs"),
) -> None:
    """Perplexity per bucket, rare-token accuracy, rare-term generation, diversity, false insertion."""
    started = time.perf_counter()
    with user_errors("evaluate"):
        params = load_params(params_file, hold=True)  # outputs refused if it changes meanwhile
        inputs = stage.Inputs(model_dir, prepared, tokenized, rare, datastore, train_metrics)
        outputs = stage.Outputs(metrics, summary, occurrences, plots)
        result = stage.run(params, inputs, outputs)
    print(stage.summary(result, time.perf_counter() - started, outputs))


if __name__ == "__main__":
    app()
