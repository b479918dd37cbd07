"""Configurations: runs whose params differ only by the seed are replicates of one configuration.

Two runs with the same params and the same seed are not replicates (they differ in code: other
commits) and stay apart. The baseline configuration comes first; every other is labelled by the
params in which it differs from the baseline:

    >>> _differences({"alpha": "0.7", "seed": "1"}, {"alpha": "0", "seed": "1"})
    ['alpha=0.7']
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rarelm.errors import RarelmError
from rarelm.report.run_data import RunData

REPLICATE_KEYS = ("seed",)  # params that vary between replicates of one configuration


@dataclasses.dataclass
class Configuration:
    """Replicates (runs that differ only by seed) pooled: one label, values [replicates, occurrences]."""

    label: str
    runs: list[RunData]
    values: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def seeds(self) -> list[str]:
        return [r.seed for r in self.runs]

    def mean(self, metric: str) -> np.ndarray:
        """Each occurrence's value averaged over the replicates."""
        return self.values[metric].mean(axis=0)


def _config_params(run: RunData) -> dict[str, str]:
    return {k: v for k, v in run.params.items() if k not in REPLICATE_KEYS}


def _differences(params: dict[str, str], base: dict[str, str]) -> list[str]:
    keys = sorted(set(params) | set(base))
    return [f"{k}={params.get(k, '(absent)')}" for k in keys if params.get(k) != base.get(k)]


def group_runs(baseline: list[RunData], runs: list[RunData]) -> list[Configuration]:
    """The baseline configuration first, then one per distinct params-but-seed, in order of appearance.

    A run with the baseline's params (seed aside) joins the baseline as a replicate.
    Replicates have distinct seeds: a run whose seed its configuration already holds
    (same params, same seed: other code, e.g. another commit) starts a configuration
    of its own, labelled with its name, as does one whose label (its first three
    differences) another configuration has already. The same run given twice counts once.
    """
    base_params = _config_params(baseline[0])
    for run in baseline[1:]:
        diff = _differences(_config_params(run), base_params)
        if diff:
            raise RarelmError(f"--baseline runs {baseline[0].name} and {run.name} differ in more than "
                              f"the seed ({', '.join(diff[:3])}); give seeds of one configuration")
    seen: set[tuple[str, str]] = set()
    base = Configuration("baseline", [])
    groups: dict[tuple, Configuration] = {((), 0): base}
    for run in [*baseline, *runs]:
        if (run.source, run.ident) in seen:
            continue
        seen.add((run.source, run.ident))
        if any(run is b for b in baseline):
            base.runs.append(run)
            continue
        params = _config_params(run)
        key = () if params == base_params else tuple(sorted(params.items()))
        n = 0
        while (key, n) in groups and run.seed in groups[key, n].seeds:
            n += 1
        if (key, n) not in groups:
            diff = _differences(params, base_params)
            label = ", ".join(diff[:3]) + (f" +{len(diff) - 3} more" if len(diff) > 3 else "")
            if n or label in {c.label for c in groups.values()}:  # the first three differences alike
                label = f"{label} ({run.name})" if label else run.name
            groups[key, n] = Configuration(label, [])
        groups[key, n].runs.append(run)
    return list(groups.values())
