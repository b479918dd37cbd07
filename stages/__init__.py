"""One Typer script per DVC stage; `python -m stages.<name>` is what dvc.yaml runs.

The contract: stages/<x>.py holds the Typer options (defaults from rarelm/paths.py, which dvc.yaml
lists the same; they override it for use outside DVC), loads params inside `user_errors("<x>")`,
calls `run(params, <paths>)` of rarelm/<x>/stage.py (rarelm/check.py for `check`), which does the
whole stage and writes its outputs atomically and together, and prints that module's `summary`.
Importing any stage first follows DVC (rarelm/process.py `follow_dvc`: signals, the workspace).
"""

from rarelm.process import follow_dvc

follow_dvc()
