"""The headline experiment: every rare-term remedy against the baseline, as DVC experiments.

    make headline                      # = rarelm headline: queue, run, compare, write the README table
    rarelm headline --plan headline.yaml --out docs/headline

The plan (headline.yaml) lists configurations as `dvc exp run -S` overrides on top of
`common`, and `decode` variants that change only `evaluate`'s params of a trained
configuration (DVC's run cache restores that configuration's trained model, so only
`evaluate` runs). `common` must make evaluate score both splits (`eval.splits=[val,test]`).
Three rounds, each a batch of queued experiments run by `dvc queue start -j 1` (the
experiments share the machine's cores), named `hl-<configuration>-s<seed>`:

1. screen: every configuration and decode variant on the `screen_seeds`, judged on the
   `screen_split` (val);
2. combine: the best `combine` screened configurations whose overrides do not clash, merged
   into one configuration (`combination`), on the screening seeds, judged on val;
3. confirm: the baseline and the `finalists` best configurations on the `final_seeds`, which
   must differ from the screening seeds, compared on the `final_split` (test). No run that took
   part in the choice, and no test figure, is in the final comparison.

The rules, fixed in the plan before any result is seen: a configuration is ranked only if its
overall perplexity (all tokens, not one bucket) is within `ppl_tolerance` (2%) of the
baseline's and its false-insertion rate (`false_insertion_rate`: extracted terms per 1,000
sampled tokens over the same rate in the text) within `insertion_tolerance` (10%, relative) of
the baseline's; the ranked ones are ordered by their difference to the baseline in term NLL
per character (lower first), ties by term-token accuracy (higher first), both from the paired
term x seed bootstrap of `rarelm.compare` on the screening split. An experiment that already
exists under its name is not run again, so an interrupted command picks up where it stopped.
Then two comparisons (`rarelm.compare.compare`): the screening round (screening seeds, val,
every configuration) and the final one (final seeds, test, baseline and finalists), written to
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
RANK_SLICE = "all"
RANK_METRIC, TIE_METRIC = "nll_per_char", "token_acc"  # lower first; then higher first
TABLE_METRICS = (RANK_METRIC, TIE_METRIC, "exact_match")
FIGURE = "exact_match_by_train_count.svg"


@dataclasses.dataclass(frozen=True)
class Plan:
    """headline.yaml: what to run."""

    common: list[str]
    screen_seeds: list[int]  # the seeds that choose the finalists
    final_seeds: list[int]  # fresh seeds that confirm them (none of the screening seeds)
    configurations: dict[str, list[str]]  # name -> overrides; the first is the baseline
    decode: dict[str, dict[str, Any]]  # name -> {"of": configuration, "set": overrides}
    finalists: int = 2
    combine: int = 2
    # only configurations whose overall perplexity (all tokens) is within this fraction of the
    # baseline's are ranked: a remedy must not buy rare terms with the common text
    ppl_tolerance: float = 0.02
    # ... and whose false-insertion rate is within this fraction (relative) of the baseline's
    insertion_tolerance: float = 0.10
    screen_split: str = "val"  # the split the choice is made on
    final_split: str = "test"  # the split the finalists are confirmed on

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        path = Path(path)
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise RarelmError(f"{path}: cannot read the headline plan ({exc})") from None
        try:
            plan = cls(common=[str(s) for s in raw.get("common") or []],
                       screen_seeds=[int(s) for s in raw["screen_seeds"]],
                       final_seeds=[int(s) for s in raw["final_seeds"]],
                       configurations={str(k): [str(s) for s in v or []]
                                       for k, v in raw["configurations"].items()},
                       decode={str(k): {"of": str(v["of"]), "set": [str(s) for s in v["set"]]}
                               for k, v in (raw.get("decode") or {}).items()},
                       finalists=int(raw.get("finalists", 2)), combine=int(raw.get("combine", 2)),
                       ppl_tolerance=float(raw.get("ppl_tolerance", 0.02)),
                       insertion_tolerance=float(raw.get("insertion_tolerance", 0.10)),
                       screen_split=str(raw.get("screen_split", "val")),
                       final_split=str(raw.get("final_split", "test")))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise RarelmError(f"{path}: not a headline plan ({type(exc).__name__}: {exc}); "
                              "see rarelm/headline.py") from None
        if not plan.screen_seeds or not plan.final_seeds or not plan.configurations:
            raise RarelmError(f"{path}: the plan needs screen_seeds, final_seeds and at least one "
                              "configuration (the baseline)")
        reused = sorted(set(plan.screen_seeds) & set(plan.final_seeds))
        if reused:
            raise RarelmError(f"{path}: final_seeds repeat screening seed {reused[0]}; the finalists are "
                              "confirmed on seeds that took no part in choosing them")
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


def ranking(repo: Path, plan: Plan, names: list[str], seeds: list[int]) -> list[tuple[str, float]]:
    """Screened configurations that pass the guard, best first: (name, term NLL/char difference).

    The guard (fixed in the plan): overall perplexity within `ppl_tolerance` of the baseline's
    and false-insertion rate within `insertion_tolerance` of the baseline's, on the screening
    split; a figure a run lacks does not exclude it. The others stay in the screening table.
    """
    report = _compare(repo, plan, [plan.baseline], names, seeds, plan.screen_split)
    summaries = {c["label"]: c["summary"] for c in report["configurations"]}
    base = summaries[plan.baseline]

    def within(name: str) -> bool:
        return all(base.get(key) is None or summaries[name].get(key) is None
                   or summaries[name][key] <= base[key] * (1 + tolerance)
                   for key, tolerance in (("ppl", plan.ppl_tolerance),
                                          ("false_insertion_rate", plan.insertion_tolerance)))

    scored = [(c, _diff(report, c, RANK_METRIC), _diff(report, c, TIE_METRIC)) for c in names if within(c)]
    return [(c, rank) for c, rank, _ in sorted(scored, key=lambda x: (x[1], -x[2]))]


def _compare(repo: Path, plan: Plan, base: list[str], names: list[str], seeds: list[int], split: str) -> dict:
    from rarelm import compare as cmp

    def runs(name: str) -> list:
        return [cmp.load_run(experiment(name, s), repo, split=split) for s in seeds]

    report = cmp.compare(runs(base[0]), [r for n in names for r in runs(n)], metrics=TABLE_METRICS)
    labels = {experiment(n, s): n for n in [*base, *names] for s in seeds}
    for c in report["configurations"]:  # the plan's names, not the params that differ
        old, c["label"] = c["label"], labels[c["runs"][0]["name"]]
        for row in [*report["rows"], *report["run_rows"]]:
            if row["configuration"] == old:
                row["configuration"] = c["label"]
    return report


def _row(report: dict, config: str, slice_: str, metric: str = "exact_match") -> dict:
    return next(r for r in report["rows"] if r["configuration"] == config and r["slice"] == slice_
                and r["aggregate"] == "occurrences" and r["metric"] == metric)


def _diff(report: dict, config: str, metric: str) -> float:
    return _row(report, config, RANK_SLICE, metric).get("diff") or 0.0


def headline(repo: Path, plan: Plan, out: Path, readme: Path | None,
             log: Callable[[str], None] = print, poll: float = 20) -> dict:
    """Run the three rounds and write the comparisons; returns what the README table shows."""
    repo, out = Path(repo).resolve(), Path(out)
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
    timed("screen", batch(screened, plan.screen_seeds))
    ranked = ranking(repo, plan, screened[1:], plan.screen_seeds)
    trained = [n for n, _ in ranked if n in plan.configurations]
    if plan.combine >= 2:
        sets = combination(trained, lambda n: plan.overrides(n, extra), plan.combine)
        if sets and sets not in [plan.overrides(n, extra) for n in plan.configurations]:
            extra["combination"] = sets
            timed("combine", batch(["combination"], plan.screen_seeds))
            screened.append("combination")
            ranked = ranking(repo, plan, screened[1:], plan.screen_seeds)
    finalists = [n for n, _ in ranked[:plan.finalists]]
    timed("confirm", batch([plan.baseline, *finalists], plan.final_seeds))

    screen = _compare(repo, plan, [plan.baseline], screened[1:], plan.screen_seeds, plan.screen_split)
    final = _compare(repo, plan, [plan.baseline], finalists, plan.final_seeds, plan.final_split)
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
        f"{', '.join(finalists) or 'none'}. The final comparison (paired bootstrap over terms and seeds) "
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


def _run_cell(report: dict, config: str, key: str) -> str:
    """A run-level figure's mean over seeds and its change to the baseline's, e.g. `1.7046 (+0.4%)`."""
    row = next((r for r in report.get("run_rows", []) if r["configuration"] == config and r["metric"] == key),
               None)
    if row is None:
        return "n/a"
    rel = f" ({row['relative']:+.1%})" if row.get("relative") is not None else ""
    return f"{row['value']:.4f}{rel}"


def table(report: dict) -> str:
    """Markdown: per configuration, the term metrics with differences and intervals (terms x seeds),
    overall perplexity and false-insertion rate beside the baseline's."""
    names = {"nll_per_char": "term NLL/char", "token_acc": "term-token acc", "exact_match": "exact match"}
    metrics = [m for m in TABLE_METRICS if m in report["metrics"]]
    head = "".join(f" {names[m]} | diff [95% CI] |" for m in metrics)
    lines = [f"| configuration | seeds | terms |{head} ppl (vs baseline) | false insertion (vs baseline) |",
             "| --- | ---: | ---: |" + " ---: | --- |" * len(metrics) + " ---: | ---: |"]
    for c in report["configurations"]:
        label = c["label"]
        cells = [label, str(len(c["runs"])), str(report["terms"])]
        for m in metrics:
            row = _row(report, label, RANK_SLICE, m)
            cells += [f"{row['value']:.3f}", _ci(row)]
        cells += [_run_cell(report, label, "ppl"), _run_cell(report, label, "false_insertion_rate")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def readme_section(result: dict, figure: str) -> str:
    rounds = ", ".join(f"{k} {v / 60:.0f} min" for k, v in result["rounds_s"].items())
    plan = result["plan"]
    combo = (f" The combination round merged: `{' '.join(result['combination'])}`."
             if result["combination"] else "")
    final_seeds = ", ".join(map(str, plan["final_seeds"]))
    return "\n".join([
        START,
        f"Generated by `make headline` (rarelm/headline.py, plan headline.yaml: "
        f"`{' '.join(plan['common'])}`). Rounds on {result['cpu']} (2 cores): {rounds}.{combo}",
        "",
        f"Rules fixed in the plan before any result was seen: configurations are chosen on the "
        f"{plan['screen_split']} split with seed(s) {', '.join(map(str, plan['screen_seeds']))}; only "
        f"those within {plan['ppl_tolerance']:.0%} of the baseline's overall perplexity and "
        f"{plan['insertion_tolerance']:.0%} (relative) of its false-insertion rate are ranked, by term "
        f"NLL per character (then term-token accuracy); the {plan['finalists']} best are confirmed on "
        f"the {plan['final_split']} split with seeds {final_seeds}, which took no part in the choice.",
        "",
        f"**Final round** ({plan['final_split']} split, seeds {final_seeds}; intervals: paired "
        "bootstrap over terms and seeds together; ppl and false insertion: means over seeds):",
        "",
        table(result["final"]),
        "",
        f"![exact match by train count]({figure})",
        "",
        f"**Screening round** ({plan['screen_split']} split, seed(s) "
        f"{', '.join(map(str, plan['screen_seeds']))}; finalists: {', '.join(result['finalists'])}):",
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

