"""The headline experiment: every rare-term remedy against the baseline, as DVC experiments.

    make headline                      # = rarelm headline: queue, run, compare, write docs/results.md
    rarelm headline --plan headline.yaml --out records/headline

The plan (headline.yaml) lists configurations as `dvc exp run -S` overrides on top of
`common`, and `decode` variants that change only `evaluate`'s params of a trained
configuration (DVC's run cache restores that configuration's trained model, so only
`evaluate` runs). Each round's experiments evaluate only the split it is judged on
(`eval.splits`, set by the round).
Three rounds, each a batch of queued experiments run by `dvc queue start -j 1` (the
experiments share the machine's cores), named `hl-<configuration>-s<seed>`:

1. screen: every configuration and decode variant on the `screen_seeds`, judged on the
   `screen_split` (val); each decode variant queues right after its configuration;
2. combine: the best `combine` screened configurations whose overrides do not clash, merged
   into one configuration (`combination`), on the screening seeds, judged on val;
3. confirm: the baseline and the `finalists` best configurations on the `final_seeds`, which
   must differ from the screening seeds, compared on the `final_split` (test). No run that took
   part in the choice, and no test figure, is in the final comparison.

The rules, fixed in the plan before any result is seen: a configuration is ranked only if its
overall perplexity (all tokens, not one bucket) is within `ppl_tolerance` (2%) of the baseline's
and its false-insertion rate (`false_insertion_rate`: extracted terms per 1,000 sampled tokens
over the same rate in the text; or, with `insertion_metric: false_insertion_start_mass`, the
model's mass on term-start tokens where no term starts) within `insertion_tolerance` (10%,
relative) of the baseline's; the ranked ones are ordered by their difference to the baseline in
term NLL per character (lower first), ties by term-token accuracy (higher first), both from the
paired term x seed bootstrap of `rarelm.report.compare` on the screening split. Each experiment
is recorded under `<out>/runs/` as it finishes (rarelm/report/records.py), and the comparisons
read the records; one that exists under its name or is recorded is not run again, so an
interrupted command picks up where it stopped, in this clone or in another one with the records.
Then two comparisons (`rarelm.report.compare.compare`): the screening round (screening seeds, val,
every configuration) and the final one (final seeds, test, baseline and finalists), written to
`<out>/screen/` and `<out>/final/` (index.html, report.md, report.json; `<out>` is
records/headline by default, kept in git), the term NLL per character and exact match by train
count to `<out>/term_nll_by_train_count.svg` and `<out>/exact_match_by_train_count.svg`
(headline_outputs.FIGURES), and both tables with the rounds' durations into the results page
(docs/results.md) between `<!-- headline:start -->` and `<!-- headline:end -->`
(`<!-- <section>:start -->` for a plan with its own `section`); README.md only links there. No
figure is typed by hand. The plan and its rules: headline_plan.py; the queue: dvc_queue.py; the
tables: headline_outputs.py.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

from rarelm.errors import RarelmError
from rarelm.params import load_params
from rarelm.report.compare import compare, report_row
from rarelm.report.dvc_queue import existing, run_batch
from rarelm.report.headline_outputs import cpu_name, read_json, run_table, table, write_outputs
from rarelm.report.headline_plan import (
    RANK_METRIC,
    RANK_SLICE,
    TABLE_METRICS,
    Plan,
    combination,
)
from rarelm.report.page import write_report
from rarelm.report.records import load_recorded, record, recorded
from rarelm.report.winner import prepare_registration, within_guard
from rarelm.tracking.naming import git_commit
from rarelm.tracking.sweep import log_sweep


def ranking(repo: Path, out: Path, plan: Plan, names: list[str], seeds: list[int]) -> list[tuple[str, float]]:
    """Screened configurations that pass the guard, best first: (name, term NLL/char difference).

    The guard (fixed in the plan): overall perplexity within `ppl_tolerance` of the baseline's
    and false-insertion figure within `insertion_tolerance` of the baseline's, on the screening
    split; a figure a run lacks does not exclude it. The others stay in the screening table.
    """
    return ranked(_compare(repo, out, plan, [plan.baseline], names, seeds, plan.screen_split), plan, names)


def ranked(report: dict, plan: Plan, names: list[str]) -> list[tuple[str, float]]:
    """`names` of a screening comparison that pass the plan's guard, best first (see ranking)."""
    summaries = {c["label"]: c["summary"] for c in report["configurations"]}
    base = summaries[plan.baseline]
    scored = [(c, _diff(report, c, RANK_METRIC), _diff(report, c, plan.tie_metric)) for c in names
              if within_guard(summaries[c], base, guard(plan))]
    return [(c, rank) for c, rank, _ in sorted(scored, key=lambda x: (x[1], -x[2]))]


def guard(plan: Plan) -> dict[str, float]:
    """The plan's guard: eval.json figure -> relative tolerance of the baseline's (forgetting,
    ppl_general_model and ppl_general_outside: the model alone on general text of the base's own
    kind and from outside its family, without decode-time mixing, each guards only where the runs
    hold it: eval.general_text, eval.general_text_outside set)."""
    return {"ppl": plan.ppl_tolerance, plan.insertion_metric: plan.insertion_tolerance,
            "ppl_general_model": plan.general_tolerance, "ppl_general_outside": plan.general_tolerance}


def _compare(repo: Path, out: Path, plan: Plan, base: list[str], names: list[str], seeds: list[int],
             split: str) -> dict:
    """The comparison of `names` with the baseline on `seeds` and `split`, labelled by the plan's
    names, from the experiments' records (rarelm/report/records.py)."""
    def runs(name: str) -> list:
        return [load_recorded(repo, out, plan.experiment(name, s), split) for s in seeds]

    report = compare(runs(base[0]), [r for n in names for r in runs(n)], metrics=TABLE_METRICS)
    labels = {plan.experiment(n, s): n for n in [*base, *names] for s in seeds}
    for c in report["configurations"]:  # the plan's names, not the params that differ
        old, c["label"] = c["label"], labels[c["runs"][0]["name"]]
        for row in [*report["rows"], *report["run_rows"]]:
            if row["configuration"] == old:
                row["configuration"] = c["label"]
    return report


def _diff(report: dict, config: str, metric: str) -> float:
    """A configuration's difference to the baseline over all occurrences (0 for the baseline)."""
    return report_row(report, config, RANK_SLICE, metric).get("diff") or 0.0


def _records_complete(repo: Path, out: Path, experiments: list[str]) -> None:
    """A folder `rarelm run-plan` wrote (its runner.json) holds that command's records: an experiment
    missing there is one line, not hours of DVC experiments queued behind the user's back."""
    if not (out / "runner.json").is_file():
        return
    have = recorded(out) | existing(repo)  # one directory scan, one `git` listing of the experiments
    missing = [e for e in experiments if e not in have]
    if missing:
        raise RarelmError(f"{out}: {len(missing)} of the plan's {len(experiments)} experiments have no "
                          f"record (first: {missing[0]}); this folder holds `rarelm run-plan`'s records: "
                          "run it with the same --plan and --out first (or remove runner.json to run them "
                          "as DVC experiments)")


def headline(repo: Path, plan: Plan, out: Path, page: Path | None,
             log: Callable[[str], None] = print, poll: float = 20, register: bool = False) -> dict:
    """Run the rounds (or the fixed comparison), write the comparisons and the tables into the
    results page `page` (None: not); returns what the tables show. With `register`, the final
    round's winner (rarelm/report/winner.py, under the plan's guard) becomes a new version of the
    registered model that the repo's params.yaml names."""
    repo, out = Path(repo).resolve(), Path(out)
    # A round that finds its experiments done (a re-run to rewrite the tables) keeps the time
    # the earlier command measured for it, and, if no round ran now, the machine it ran on.
    earlier = read_json(out / "headline.json")
    previous = earlier.get("rounds_s", {})
    rounds: dict[str, float] = {}
    swept: list[str] = []
    ran_here: list[str] = []

    def timed(name: str, experiments: list[tuple[str, list[str]]]) -> None:
        swept.extend(e for e, _ in experiments)
        t0 = time.time()
        ran = run_batch(repo, experiments, log, poll, done=recorded(out),
                        finished=lambda experiment: record(repo, out, experiment))
        if ran or name not in previous:
            rounds[name] = time.time() - t0
            ran_here.append(name)
        else:
            rounds[name] = previous[name]

    choice = _fixed(plan) if plan.fixed else _choose(repo, out, plan, timed)
    screened, finalists = choice["screened"], choice["finalists"]
    confirm = plan.batch([plan.baseline, *finalists], plan.final_seeds, choice["extra"], plan.final_split)
    _records_complete(repo, out, [e for e, _ in confirm])
    timed("confirm", confirm)
    screen = (None if plan.fixed else
              _compare(repo, out, plan, [plan.baseline], screened[1:], plan.screen_seeds, plan.screen_split))
    final = _compare(repo, out, plan, [plan.baseline], finalists, plan.final_seeds, plan.final_split)
    machine = {"cpu": cpu_name(), "cores": os.cpu_count()}
    if not ran_here and "cpu" in earlier:  # the times above are the earlier machine's
        machine = {k: earlier[k] for k in ("cpu", "cores") if k in earlier}
    result = {"rounds_s": rounds, **machine, "plan": dataclasses.asdict(plan),
              "combination": choice["extra"].get("combination", []), "finalists": finalists,
              "ranking": choice["ranking"], "screen": screen, "final": final}
    winner = None
    if register:  # checked before any output: a winner the registry cannot take is the one-line error
        winner = prepare_registration(final, repo, repo / "params.yaml", guard=guard(plan), uri=_store(repo),
                                      tie_metric=plan.tie_metric,
                                      by=f"rarelm headline ({plan.section}, {plan.final_split} split, "
                                         f"seeds {', '.join(map(str, plan.final_seeds))})")
    write_outputs(result, out, page)
    _log_sweep(repo, plan, out, swept, finalists)
    if winner is not None:
        log(f"registered the winner {winner.label} (run {winner.run_id}) as {winner.register()}")
    return result


def so_far(repo: Path, plan: Plan, out: Path, log: Callable[[str], None] = print) -> dict:
    """The screening round as far as it got, while a long headline runs: every configuration whose
    screening experiments have all finished, against the baseline on the screening split, with the
    plan's guard. Queues nothing; writes <out>/screen_so_far/ and logs the tables. Returns the report."""
    if plan.fixed:
        raise RarelmError("a fixed comparison (no screen_seeds) has no screening round to look at")
    repo, out, every = Path(repo).resolve(), Path(out), [*plan.configurations, *plan.decode]
    done = existing(repo) | recorded(out)
    names = [n for n in every if all(plan.experiment(n, s) in done for s in plan.screen_seeds)]
    if plan.baseline not in names:
        raise RarelmError(f"the baseline's screening experiment "
                          f"{plan.experiment(plan.baseline, plan.screen_seeds[0])} has not finished yet")
    report = _compare(repo, out, plan, [plan.baseline], names[1:], plan.screen_seeds, plan.screen_split)
    write_report(report, out / "screen_so_far")
    passing = [name for name, _ in ranked(report, plan, names[1:])]
    pending = [n for n in every if n not in names]
    log(f"{len(names) - 1} of {len(every) - 1} configurations screened "
        f"({plan.screen_split} split, seeds {', '.join(map(str, plan.screen_seeds))}); "
        f"within the guard, best first: {', '.join(passing) or 'none'}; "
        f"not yet: {', '.join(pending) or 'none'}")
    log(table(report, plan.insertion_metric))
    log(run_table(report, plan.insertion_metric))
    return report


def _store(repo: Path) -> str:
    """The store the experiments logged into: MLFLOW_TRACKING_URI, else the repo's."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repo / 'mlflow.db'}"


def _fixed(plan: Plan) -> dict:
    """A fixed comparison (no screen_seeds): every configuration goes to the final round, unchosen."""
    names = [*plan.configurations, *plan.decode]
    return {"screened": names, "finalists": names[1:], "ranking": [], "extra": {}}


def _choose(repo: Path, out: Path, plan: Plan, timed: Callable) -> dict:
    """Screen every configuration on the screening seeds, combine the best, rank: the finalists."""
    extra: dict[str, list[str]] = {}
    screened = [*plan.configurations, *plan.decode]
    timed("screen", plan.batch(plan.queue_order(screened), plan.screen_seeds, extra, plan.screen_split))
    ranked = ranking(repo, out, plan, screened[1:], plan.screen_seeds)
    trained = [n for n, _ in ranked if n in plan.configurations]
    if plan.combine >= 2:
        sets = combination(trained, lambda n: plan.overrides(n, extra), plan.combine)
        if sets and sets not in [plan.overrides(n, extra) for n in plan.configurations]:
            extra["combination"] = sets
            timed("combine", plan.batch(["combination"], plan.screen_seeds, extra, plan.screen_split))
            screened.append("combination")
            ranked = ranking(repo, out, plan, screened[1:], plan.screen_seeds)
    return {"screened": screened, "finalists": [n for n, _ in ranked[:plan.finalists]],
            "ranking": ranked, "extra": extra}


def _log_sweep(repo: Path, plan: Plan, out: Path, swept: list[str], finalists: list[str]) -> None:
    """The sweep as a parent MLflow run over its experiments' runs, the reports as its artifacts."""
    try:
        mlflow_experiment = load_params(repo / "params.yaml").tracking.experiment
    except RarelmError:  # the experiments ran with their own params: nothing to group by here
        return
    uri = _store(repo)
    commit = git_commit(repo)[:7]
    rounds = "a fixed comparison" if plan.fixed else "three rounds"
    log_sweep(mlflow_experiment, f"{plan.section}-{commit}", swept, out / "final", uri=uri, note=(
        f"rarelm headline at commit {commit}: {len(swept)} experiments in {rounds}; finalists "
        f"{', '.join(finalists) or 'none'}. The final comparison (paired bootstrap over terms and seeds) "
        "is in this run's artifacts" + ("." if plan.fixed else f"; the screening round in {out / 'screen'}.")
    ))


def main(plan_path: Path, repo: Path, out: Path, page: Path | None, register: bool = False,
         screened_so_far: bool = False) -> dict:
    """`rarelm headline`: load the plan, run the rounds, write the outputs (register the winner);
    with `screened_so_far`, only the screening round's finished experiments, compared."""
    plan = Plan.load(plan_path)
    if screened_so_far:
        return so_far(repo, plan, out, log=lambda m: print(m, flush=True))
    return headline(repo, plan, out, page, log=lambda m: print(f"headline: {m}", flush=True),
                    register=register)

