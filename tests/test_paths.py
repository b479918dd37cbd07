"""rarelm/paths.py is the DAG's layout: dvc.yaml declares exactly its outputs, stage by stage."""

from pathlib import Path

import yaml

from rarelm import paths

ROOT = Path(__file__).resolve().parent.parent


def _declared(stage: dict) -> list[str]:
    """The paths of a dvc.yaml stage's outs, metrics and plots (an entry is a path or {path: opts})."""
    found = []
    for kind in ("outs", "metrics", "plots"):
        for entry in stage.get(kind, []):
            found.extend([entry] if isinstance(entry, str) else entry)
    return found


def test_dvc_yaml_outputs_are_paths_outputs():
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    declared = {name: sorted(_declared(stage)) for name, stage in dvc["stages"].items()}
    assert declared == {name: sorted(outs) for name, outs in paths.OUTPUTS.items()}


def test_dvc_yaml_plots_and_artifact_use_paths():
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    for plot in dvc["plots"]:
        for spec in plot.values():
            assert set(spec["y"]) == {paths.TRAIN_PLOT}
    assert dvc["artifacts"]["rarelm"]["path"] == paths.MODEL


def test_stage_commands_read_params_yaml_and_write_under_the_layout():
    every = [p for outs in paths.OUTPUTS.values() for p in outs]
    assert len(every) == len(set(every))
    folders = (paths.CHECKED, paths.PREPARED, paths.TOKENIZED, paths.RARE, paths.WEIGHTS, paths.MODEL,
               paths.DATASTORE)
    assert all(p in folders or p.startswith((paths.METRICS + "/", paths.PLOTS + "/")) for p in every)
    assert (ROOT / paths.PARAMS).is_file()
