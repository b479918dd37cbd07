"""The headline experiment: every rare-term remedy against the baseline, as DVC experiments.

    make headline                      # = rarelm headline: queue, run, compare, write the README table
    rarelm headline --plan headline.yaml --out docs/headline

The plan (headline.yaml) lists configurations as `dvc exp run -S` overrides on top of
`common`, and `decode` variants that change only `evaluate`'s params of a trained
configuration (DVC's run cache restores that configuration's trained model, so only
`evaluate` runs). Three rounds, each a batch of queued experiments run by `dvc queue start
-j 1` (the experiments share the machine's cores), named `hl-<configuration>-s<seed>`:

1. screen: every configuration and decode variant on the first seed;
2. combine: the best `combine` screened configurations whose overrides do not clash, merged
   into one configuration (`combination`), on the first seed;
3. replicate: the baseline and the `finalists` best configurations on every other seed.

"Best" is the difference to the baseline in exact match on term occurrences seen at most 15
times in train (the paired term bootstrap of `rarelm.compare`), among the configurations whose
frequent-bucket perplexity stays within `ppl_frequent_tolerance` (2%) of the baseline's. An
experiment that already exists under its name is not run again, so an interrupted command picks
up where it stopped.
Then two comparisons (`rarelm.compare.compare`): the screening round (first seed, every
configuration) and the final one (every seed, baseline and finalists), written to
`<out>/screen/` and `<out>/final/` (index.html, report.md, report.json; `<out>` is
docs/headline by default, kept in git), the exact-match curve to
`<out>/exact_match_by_train_count.svg`, and both tables with the rounds' durations into the
README between `<!-- headline:start -->` and `<!-- headline:end -->`. No figure is typed by
hand.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from rarelm.errors import RarelmError

PREFIX = "hl-"
START, END = "<!-- headline:start -->", "<!-- headline:end -->"
RANK_SLICE = "train_count<=15"
FIGURE = "exact_match_by_train_count.svg"


@dataclasses.dataclass(frozen=True)
class Plan:
    """headline.yaml: what to run."""

    common: list[str]
    seeds: list[int]
    configurations: dict[str, list[str]]  # name -> overrides; the first is the baseline
    decode: dict[str, dict[str, Any]]  # name -> {"of": configuration, "set": overrides}
    finalists: int = 2
    combine: int = 2
    # only configurations whose frequent-bucket perplexity is within this fraction of the
    # baseline's are ranked: a remedy must not buy rare terms with the common text
    ppl_frequent_tolerance: float = 0.02

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        path = Path(path)
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise RarelmError(f"{path}: cannot read the headline plan ({exc})") from None
        try:
            plan = cls(common=[str(s) for s in raw.get("common") or []],
                       seeds=[int(s) for s in raw["seeds"]],
                       configurations={str(k): [str(s) for s in v or []]
                                       for k, v in raw["configurations"].items()},
                       decode={str(k): {"of": str(v["of"]), "set": [str(s) for s in v["set"]]}
                               for k, v in (raw.get("decode") or {}).items()},
                       finalists=int(raw.get("finalists", 2)), combine=int(raw.get("combine", 2)),
                       ppl_frequent_tolerance=float(raw.get("ppl_frequent_tolerance", 0.02)))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise RarelmError(f"{path}: not a headline plan ({type(exc).__name__}: {exc}); "
                              "see rarelm/headline.py") from None
        if not plan.seeds or not plan.configurations:
            raise RarelmError(f"{path}: the plan needs seeds and at least one configuration (the baseline)")
        unknown = [d["of"] for d in plan.decode.values() if d["of"] not in plan.configurations]
        if unknown:
            raise RarelmError(f"{path}: decode variant of unknown configuration {unknown[0]!r}")
        return plan

    @property
    def baseline(self) -> str:
        return next(iter(self.configurations))

    def overrides(self, name: str, extra: dict[str, list[str]]) -> list[str]:
        """A configuration's or decode variant's -S overrides, without common and seed."""
        if name in self.decode:
            return [*self.overrides(self.decode[name]["of"], extra), *self.decode[name]["set"]]
        return extra.get(name) or self.configurations[name]


def experiment(name: str, seed: int) -> str:
    return f"{PREFIX}{name}-s{seed}"


def combination(ranked: list[str], overrides: Callable[[str], list[str]], n: int) -> list[str]:
    """Merge the overrides of the first `n` ranked configurations whose keys do not clash.

    >>> table = {"a": ["loss.targets=terms", "loss.rare_weight=2"], "b": ["loss.rare_weight=4"],
    ...          "c": ["alpha=1"]}
    >>> combination(["a", "b", "c"], table.__getitem__, 2)
    ['loss.targets=terms', 'loss.rare_weight=2', 'alpha=1']
    """
    merged: dict[str, str] = {}
    taken = 0
    for name in ranked:
        sets = dict(s.split("=", 1) for s in overrides(name))
        if not sets or set(sets) & set(merged):
            continue
        merged.update(sets)
        taken += 1
        if taken == n:
            break
    return [f"{k}={v}" for k, v in merged.items()] if taken == n else []


# ---------------------------------------------------------------- DVC


def _dvc(args: list[str], repo: Path, check: bool = True) -> str:
    out = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, capture_output=True, text=True)
    if check and out.returncode:
        raise RarelmError(f"dvc {' '.join(args[:3])} failed: {' '.join(out.stderr.split())[-300:]}")
    return out.stdout


def existing(repo: Path) -> set[str]:
    from rarelm.compare import experiment_refs

    return {name for name, _, _ in experiment_refs(repo)}


def queued(repo: Path) -> set[str]:
    """Names of the experiments `dvc queue status` shows as queued or running."""
    return {line.split()[1] for line in _dvc(["queue", "status"], repo).splitlines()[1:]
            if len(line.split()) > 2 and line.split()[-1] in ("Queued", "Running")}


def run_batch(repo: Path, batch: list[tuple[str, list[str]]], log: Callable[[str], None],
              poll: float = 20) -> int:
    """Queue (name, overrides) experiments that do not exist yet, run them one at a time, wait.

    One already queued or running (an earlier, interrupted command's) is waited for, not queued
    again. Returns how many experiments it ran or waited for.
    """
    done, pending = existing(repo), queued(repo)
    todo = [(name, sets) for name, sets in batch if name not in done]
    for name, sets in todo:
        if name in pending:
            continue
        log(f"queue {name}: {' '.join(sets)}")
        _dvc(["exp", "run", "--queue", "-q", "-n", name, *[x for s in sets for x in ("-S", s)]], repo)
    if not todo:
        return 0
    # `dvc queue start` returns at once when a worker runs, else it is the worker: in the background
    worker = subprocess.Popen([sys.executable, "-m", "dvc", "queue", "start", "-j", "1"], cwd=repo,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    names = {name for name, _ in todo}
    t0 = time.time()
    while True:
        time.sleep(poll)
        waiting = names & queued(repo)
        if not waiting:
            break
        log(f"{time.time() - t0:5.0f} s: {len(waiting)} of {len(todo)} queued or running")
    worker.wait()
    failed = sorted(names - existing(repo))
    if failed:
        raise RarelmError(f"experiments failed: {', '.join(failed)} (see `dvc queue logs NAME`)")
    return len(todo)


# ---------------------------------------------------------------- the rounds


def ranking(repo: Path, plan: Plan, names: list[str], seed: int) -> list[tuple[str, float]]:
    """Screened configurations by their exact-match difference on terms seen <= 15 times, best first.

    Those whose frequent-bucket perplexity exceeds the baseline's by more than
    `ppl_frequent_tolerance` are left out (they stay in the screening table).
    """
    report = _compare(repo, plan, [plan.baseline], names, [seed])
    summaries = {c["label"]: c["summary"] for c in report["configurations"]}
    base = summaries[plan.baseline].get("ppl_frequent")

    def within(name: str) -> bool:
        ppl = summaries[name].get("ppl_frequent")
        return base is None or ppl is None or ppl <= base * (1 + plan.ppl_frequent_tolerance)

    return sorted(((c, _diff(report, c)) for c in names if within(c)), key=lambda x: -x[1])


def _compare(repo: Path, plan: Plan, base: list[str], names: list[str], seeds: list[int]) -> dict:
    from rarelm import compare as cmp

    def runs(name: str) -> list:
        return [cmp.load_run(experiment(name, s), repo) for s in seeds]

    report = cmp.compare(runs(base[0]), [r for n in names for r in runs(n)], metrics=["exact_match"])
    labels = {experiment(n, s): n for n in [*base, *names] for s in seeds}
    for c in report["configurations"]:  # the plan's names, not the params that differ
        old, c["label"] = c["label"], labels[c["runs"][0]["name"]]
        for row in report["rows"]:
            if row["configuration"] == old:
                row["configuration"] = c["label"]
    return report


def _row(report: dict, config: str, slice_: str) -> dict:
    return next(r for r in report["rows"] if r["configuration"] == config and r["slice"] == slice_
                and r["aggregate"] == "occurrences" and r["metric"] == "exact_match")


def _diff(report: dict, config: str) -> float:
    return _row(report, config, RANK_SLICE).get("diff") or 0.0


def headline(repo: Path, plan: Plan, out: Path, readme: Path | None,
             log: Callable[[str], None] = print, poll: float = 20) -> dict:
    """Run the three rounds and write the comparisons; returns what the README table shows."""
    repo, out = Path(repo).resolve(), Path(out)
    first, others = plan.seeds[0], plan.seeds[1:]
    extra: dict[str, list[str]] = {}

    def batch(names: list[str], seeds: list[int]) -> list[tuple[str, list[str]]]:
        return [(experiment(n, s), [*plan.common, f"seed={s}", *plan.overrides(n, extra)])
                for s in seeds for n in names]

    # A round that finds its experiments done (a re-run to rewrite the tables) keeps the time
    # the earlier command measured for it.
    previous = _read_json(out / "headline.json").get("rounds_s", {})
    rounds: dict[str, float] = {}

    swept: list[str] = []

    def timed(name: str, experiments: list[tuple[str, list[str]]]) -> None:
        swept.extend(e for e, _ in experiments)
        t0 = time.time()
        ran = run_batch(repo, experiments, log, poll)
        rounds[name] = time.time() - t0 if ran or name not in previous else previous[name]

    screened = [*plan.configurations, *plan.decode]
    timed("screen", batch(screened, [first]))
    ranked = ranking(repo, plan, screened[1:], first)
    trained = [n for n, _ in ranked if n in plan.configurations]
    if plan.combine >= 2:
        sets = combination(trained, lambda n: plan.overrides(n, extra), plan.combine)
        if sets and sets not in [plan.overrides(n, extra) for n in plan.configurations]:
            extra["combination"] = sets
            timed("combine", batch(["combination"], [first]))
            screened.append("combination")
            ranked = ranking(repo, plan, screened[1:], first)
    finalists = [n for n, _ in ranked[:plan.finalists]]
    timed("replicate", batch([plan.baseline, *finalists], others))

    screen = _compare(repo, plan, [plan.baseline], screened[1:], [first])
    final = _compare(repo, plan, [plan.baseline], finalists, plan.seeds)
    result = {"rounds_s": rounds, "cpu": cpu_name(), "plan": dataclasses.asdict(plan),
              "combination": extra.get("combination", []), "finalists": finalists,
              "ranking": ranked, "screen": screen, "final": final}
    write_outputs(result, out, readme)
    _log_sweep(repo, out, swept, finalists)
    return result


def _log_sweep(repo: Path, out: Path, swept: list[str], finalists: list[str]) -> None:
    """The sweep as a parent MLflow run over its experiments' runs, the reports as its artifacts."""
    from rarelm import tracking
    from rarelm.params import load_params

    try:
        experiment = load_params(repo / "params.yaml").tracking.experiment
    except RarelmError:  # the experiments ran with their own params: nothing to group by here
        return
    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repo / 'mlflow.db'}"  # the repo's store
    commit = tracking.git_commit(repo)[:7]
    tracking.log_sweep(experiment, f"headline-{commit}", swept, out / "final", uri=uri, note=(
        f"rarelm headline at commit {commit}: {len(swept)} experiments in three rounds; finalists "
        f"{', '.join(finalists) or 'none'}. The final comparison (paired term bootstrap over seeds) "
        "is in this run's artifacts; the screening round in docs/headline/screen."))


# ---------------------------------------------------------------- outputs


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ci(row: dict) -> str:
    if row.get("diff") is None:
        return ""
    return f"{row['diff']:+.3f} [{row['diff_lo']:+.3f}, {row['diff_hi']:+.3f}]"


def table(report: dict) -> str:
    """Markdown: per configuration, exact match (all, <= 15) with differences, ppl_frequent, em50."""
    base = report["configurations"][0]["summary"]
    lines = ["| configuration | seeds | exact match | diff [95% CI] | exact match <= 15 | diff [95% CI] "
             "| ppl frequent (vs baseline) | em50 |",
             "| --- | ---: | ---: | --- | ---: | --- | ---: | ---: |"]
    for c in report["configurations"]:
        label, summary = c["label"], c["summary"]
        every, rare = _row(report, label, "all"), _row(report, label, RANK_SLICE)
        ppl = summary.get("ppl_frequent")
        rel = f" ({ppl / base['ppl_frequent'] - 1:+.1%})" if ppl and base.get("ppl_frequent") else ""
        em50 = summary.get("em50_train_count")
        lines.append(f"| {label} | {len(c['runs'])} | {every['value']:.3f} | {_ci(every)} | "
                     f"{rare['value']:.3f} | {_ci(rare)} | "
                     f"{'' if ppl is None else f'{ppl:.4f}'}{rel} | "
                     f"{'< 2 or n/a' if em50 is None else f'{em50:.1f}'} |")
    return "\n".join(lines)


def readme_section(result: dict, figure: str) -> str:
    rounds = ", ".join(f"{k} {v / 60:.0f} min" for k, v in result["rounds_s"].items())
    plan = result["plan"]
    combo = (f" The combination round merged: `{' '.join(result['combination'])}`."
             if result["combination"] else "")
    return "\n".join([
        START,
        f"Generated by `make headline` (rarelm/headline.py, plan headline.yaml: "
        f"`{' '.join(plan['common'])}`, seeds {', '.join(map(str, plan['seeds']))}). "
        f"Rounds on {result['cpu']} (2 cores): {rounds}.{combo}",
        "",
        "**Final round** (every seed; intervals: paired bootstrap over terms, seeds pooled; "
        "em50 is the mean over seeds, missing where a seed's rarest band is above 50%):",
        "",
        table(result["final"]),
        "",
        f"![exact match by train count]({figure})",
        "",
        f"**Screening round** (seed {plan['seeds'][0]} only; the finalists were the best "
        f"{plan['finalists']} on terms seen <= 15 times among those within "
        f"{plan['ppl_frequent_tolerance']:.0%} of the baseline's frequent-token perplexity: "
        f"{', '.join(result['finalists'])}):",
        "",
        table(result["screen"]),
        END,
    ])


def write_outputs(result: dict, out: Path, readme: Path | None) -> None:
    from rarelm import compare as cmp
    from rarelm.files import atomic_file, write_json

    for name in ("screen", "final"):
        (out / name).mkdir(parents=True, exist_ok=True)
        cmp.write_report(result[name], out / name)
    plt = cmp._figures()
    if plt is not None:
        with atomic_file(out / FIGURE) as f:
            f.write(cmp.curve_svg(result["final"], plt))
    write_json(out / "headline.json", {k: v for k, v in result.items() if k not in ("screen", "final")})
    if readme is not None:
        text = readme.read_text(encoding="utf-8")
        if START not in text or END not in text:
            raise RarelmError(f"{readme}: no {START} ... {END} markers for the headline table")
        head, rest = text.split(START, 1)
        tail = rest.split(END, 1)[1]
        with atomic_file(readme) as f:
            f.write(head + readme_section(result, os.path.relpath(out / FIGURE, readme.parent)) + tail)


def main(plan_path: Path, repo: Path, out: Path, readme: Path | None) -> dict:
    plan = Plan.load(plan_path)
    return headline(repo, plan, out, readme, log=lambda m: print(f"headline: {m}", flush=True))

