"""Experiment tracking: one MLflow run per trained model, and what is made of it afterwards.

The store is `$MLFLOW_TRACKING_URI`, or else the embedded SQLite store
`sqlite:///<repo root>/mlflow.db` where the repo root is `$DVC_ROOT` (set by DVC,
even inside the temporary copies that queued experiments run in) or the
current folder. `import mlflow` (~2 s) happens only when a run starts.

- `uri`         which store, where its artifacts go, bounded network calls
- `store`       a SQLite store created and migrated once under a lock; its paths follow a copy
- `experiment`  the experiment the runs go to (tagged as model training for the UI)
- `naming`      a run's name, tags (git commit, DVC experiment, stage) and description
- `redaction`   credentials never leave the process: URIs redacted in every line and file
- `metrics`     which figures are MLflow metrics (`summary/`, `train/`, `val/`), the rest artifacts
- `run`         the Run a stage logs into: `start_run` (train), `open_run` (evaluate)
- `datasets`, `tables`, `model_log`   what a run logs besides metrics
- `sweep`       a sweep as a parent run over its experiments' runs
- `ui`          the UI's link to the runs (`python -m rarelm.tracking ui-url`, `make ui`)
- `registry`    registered versions and the `champion` alias (`rarelm register`, `rarelm champion`)
- `release`     the git tag that lets `dvc artifacts get` find the model (`rarelm release`)
- `export`      models/model as a complete Hugging Face folder (files 0644) with its model card
- `card`        the model card (huggingface_hub's ModelCard): base model, data licence, eval results
- `serving`     the MLflow model (a pyfunc) that serves models/model; imports nothing from rarelm
"""
