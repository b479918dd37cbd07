"""The pipeline's paths, one source of truth: where each stage reads and writes by default.

POSIX paths relative to the repository root, spelled as dvc.yaml spells them; dvc.yaml's outs,
metrics and plots are exactly OUTPUTS (tests/test_paths.py checks both ways). The stage scripts
take them as their options' defaults, so a stage run by hand writes where `dvc repro` does:

    >>> EVAL_METRICS, OUTPUTS["evaluate"][0]
    ('metrics/eval.json', 'metrics/eval_occurrences.jsonl')
"""

PARAMS = "params.yaml"
# the check stage's marker: its text never changes (rarelm/check.py); prepare depends on it
CHECKED = "data/checked.txt"
RAW = "data/raw"  # the corpora and glossaries (`rarelm demo` writes the demo's)
PREPARED = "data/prepared"
TOKENIZED = "data/tokenized"
RARE = "data/rare"
WEIGHTS = "data/weights"
MODEL = "models/model"
DATASTORE = "data/datastore"  # kNN-LM keys and values (an empty marker with knn.enabled false)
METRICS = "metrics"
PLOTS = "plots"
TRAIN_CACHE = ".cache/train"  # checkpoints, outside DVC's outputs (DVC deletes those before a run)

MLFLOW_RUN = "mlflow_run.json"  # in the model folder: the MLflow run that trained it
PREPARE_METRICS = f"{METRICS}/prepare.json"
TOKENIZE_METRICS = f"{METRICS}/tokenize.json"
RARE_TERMS_METRICS = f"{METRICS}/rare_terms.json"
WEIGHTS_METRICS = f"{METRICS}/weights.json"
TRAIN_METRICS = f"{METRICS}/train.json"
EVAL_METRICS = f"{METRICS}/eval.json"
# the headline figures (evaluate writes it): the one file dvc.yaml declares as `metrics:`, so that
# `dvc exp show` and `dvc metrics show` open on them; the files above are plain outputs
SUMMARY_METRICS = f"{METRICS}/summary.json"
EVAL_OCCURRENCES = f"{METRICS}/eval_occurrences.jsonl"  # one row per evaluated term occurrence
WEIGHTS_PLOT = f"{PLOTS}/weights.csv"
TRAIN_PLOT = f"{PLOTS}/train.csv"
EVAL_BUCKETS_PLOT = f"{PLOTS}/eval_buckets.csv"
EVAL_BANDS_PLOT = f"{PLOTS}/eval_term_bands.csv"

# every output of each DVC stage (outs, metrics and plots of dvc.yaml)
OUTPUTS = {
    "check": (CHECKED,),
    "prepare": (PREPARED, PREPARE_METRICS),
    "tokenize": (TOKENIZED, TOKENIZE_METRICS),
    "rare_terms": (RARE, RARE_TERMS_METRICS),
    "weights": (WEIGHTS, WEIGHTS_METRICS, WEIGHTS_PLOT),
    "train": (MODEL, TRAIN_PLOT, TRAIN_METRICS),
    "datastore": (DATASTORE,),
    "evaluate": (EVAL_OCCURRENCES, EVAL_METRICS, SUMMARY_METRICS, EVAL_BUCKETS_PLOT, EVAL_BANDS_PLOT),
}
