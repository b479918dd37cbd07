"""What in-context retrieval costs at decode time against plain scoring (issue 52's guard: at most 3x),
through the real evaluate stage: two experiments of a plan that `rarelm run-plan` already ran (their
model and data stages in --work), evaluated again here with a small budget into a temporary folder,
in turns (baseline, run, baseline, run, ...), each turn a fresh process. The stage prints the
seconds of each phase (finding terms, scoring tokens, term generation, ...); the ratio is the run's
median over the baseline's, per phase and for the scoring phases together. Nothing in --work or
the plan's records is written.

    .venv/bin/python -P bench/retrieval_cost.py --plan gemma3/first_mention_manpages_zh_test.yaml \\
        --work .cache/run-plan --baseline as-is --run retrieval-2x64 --repeats 2

The budget (--set, on top of the plan's params): by default 48 term occurrences, 2,048 scored
tokens, no general text and no sampled continuations, so a turn of Gemma 3 takes about a minute
on 2 CPU cores. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from rarelm.params import read_yaml
from rarelm.paths import PARAMS
from rarelm.report.headline_plan import Plan
from rarelm.report.plan_runner import declared_params, stage_argv, stage_folders, with_overrides

BUDGET = ["eval.max_terms=48", "eval.max_tokens=2048", 'eval.general_text=""', "eval.insertion_prompts=0",
          "eval.diversity_prompts=0", "tracking.required=false"]
PHASE = re.compile(r"(finding terms|scoring tokens|term generation|diversity|false insertion) ([\d.]+) s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path, help="the run-plan --work that ran the plan")
    ap.add_argument("--baseline", required=True, help="a configuration or decode variant of the plan")
    ap.add_argument("--run", required=True, help="the one whose cost is compared")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="more overrides (key=value)")
    args = ap.parse_args()
    repo = Path.cwd()
    plan = Plan.load(args.plan)
    base = read_yaml((repo / PARAMS).read_text(encoding="utf-8"), repo / PARAMS)
    declared = declared_params(repo / "dvc.yaml")
    batch = dict(plan.batch([args.baseline, args.run], plan.final_seeds[:1], {}, plan.final_split))
    names = list(batch)  # the two experiments of the first seed, baseline first
    phases: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        argvs = {}
        for name in names:
            params = with_overrides(base, [*batch[name], *BUDGET, *args.sets])
            folders = stage_folders(params, declared, args.work)
            missing = [str(f) for f in folders.values() if not (f / "done").exists()]
            if missing:
                sys.exit(f"retrieval_cost: {name} needs {missing[0]}: "
                         f"run rarelm run-plan --plan {args.plan} first")
            root = Path(tmp) / name
            root.mkdir()
            text = yaml.safe_dump(params, sort_keys=False, allow_unicode=True)
            (root / PARAMS).write_text(text, encoding="utf-8")
            argvs[name] = stage_argv("evaluate", root, folders)
        for turn in range(args.repeats):
            for name in names:
                done = subprocess.run(argvs[name], capture_output=True, text=True)
                if done.returncode:
                    sys.exit(f"retrieval_cost: {name}: {done.stderr.strip().splitlines()[-1]}")
                line = next(x for x in done.stderr.splitlines() + done.stdout.splitlines()
                            if " split: finding terms" in x)
                phases[name].append({p: float(s) for p, s in PHASE.findall(line)})
                print(f"turn {turn + 1} {name}: {line.split(': ', 1)[1]}", flush=True)
    medians = {name: {p: statistics.median(t[p] for t in turns) for p in turns[0]}
               for name, turns in phases.items()}
    for m in medians.values():
        m["scoring and generation"] = m["scoring tokens"] + m["term generation"]
    ratio = {p: medians[names[1]][p] / medians[names[0]][p]
             for p in ("scoring tokens", "term generation", "scoring and generation")}
    for p, r in ratio.items():
        print(f"{p:24s} {medians[names[0]][p]:7.1f} s -> {medians[names[1]][p]:7.1f} s  {r:.2f}x")
    print(json.dumps({"baseline": names[0], "run": names[1], "budget": [*BUDGET, *args.sets],
                      "repeats": args.repeats, "median_s": medians, "ratio": ratio}))


if __name__ == "__main__":
    main()
