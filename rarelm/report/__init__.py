"""Reporting: comparing evaluated runs (`rarelm compare`), the headline experiment (`rarelm headline`)
and the reproducibility checks (`python -m rarelm.report.reprocheck`).

compare: run_data (one run's rows and params) <- git_runs, mlflow_runs <- runs (load_run);
configurations (replicates) -> occurrences (alignment, slices) -> statistics (bootstrap, sign
test) -> compare (the report dict) -> tables (markdown), page (HTML/SVG, write_report);
mlflow_runs.log_report logs a report into the baseline's MLflow run.
headline: headline_plan (the plan and its rules), dvc_queue (queued experiments), records (what a
comparison reads of each finished experiment, kept with the report), headline (the rounds),
headline_outputs (reports, figure, the tables on docs/results.md).
"""
