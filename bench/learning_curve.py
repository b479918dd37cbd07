"""Learning curve: term exact match by train-count band, against the training budget, over seeds.

    .venv/bin/python bench/learning_curve.py --lang en --steps 250 500 1000 2000 --seeds 1337 1
    .venv/bin/python bench/learning_curve.py --lang zh --steps 250 500 1000 2000 --seeds 1337 1
    .venv/bin/python bench/learning_curve.py --lang en --collect   # re-read finished experiments only

Queues one DVC experiment per (steps, seed) (`dvc exp run --queue -n lc-<lang>-<steps>-s<seed>
-S train.max_steps=<steps> -S seed=<seed>`, plus the Chinese demo's corpus params for zh),
runs the queue with one worker (`dvc queue start -j 1`; the experiments share 2 cores), waits,
then reads every experiment's metrics from its git commit (refs/exps/...) and writes
records/curves/learning_curve_<lang>.csv (one row per experiment and band) and .md (a table per
seed: exact match per band, overall, first mentions, closed-set choice, em50, tokens/s).
Needs an activated environment (dvc's stages run `python`).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZH = ["corpus.path=data/raw/demo_zh.txt.gz", "corpus.language=zh",
      "corpus.reference_glossary=data/raw/demo_zh.glossary.tsv"]


def dvc(*args: str, check: bool = True) -> str:
    out = subprocess.run(["dvc", *args], cwd=ROOT, capture_output=True, text=True)
    if check and out.returncode:
        sys.exit(f"dvc {' '.join(args)} failed: {out.stderr.strip()[-500:]}")
    return out.stdout


def name(lang: str, steps: int, seed: int) -> str:
    return f"lc-{lang}-{steps}-s{seed}"


def queue(lang: str, steps: list[int], seeds: list[int]) -> None:
    for n in steps:
        for seed in seeds:
            dvc("exp", "remove", name(lang, n, seed), check=False)
            sets = [f"train.max_steps={n}", f"seed={seed}", *(ZH if lang == "zh" else [])]
            dvc("exp", "run", "--queue", "-n", name(lang, n, seed), *[x for s in sets for x in ("-S", s)])
    dvc("queue", "start", "-j", "1")
    started = time.time()
    while True:
        status = dvc("queue", "status")
        waiting = sum(line.split()[-2:].count("Queued") + line.split()[-2:].count("Running")
                      for line in status.splitlines()[1:] if line.strip())
        if waiting == 0:
            break
        print(f"{time.time() - started:6.0f} s: {waiting} experiments queued or running", flush=True)
        time.sleep(30)
    failed = [line for line in dvc("queue", "status").splitlines() if "Failed" in line]
    if failed:
        print("failed experiments:\n" + "\n".join(failed), file=sys.stderr)


def experiments() -> dict[str, dict]:
    """name -> {"eval": ..., "train": ...} for every finished DVC experiment, whatever its baseline
    commit (`dvc exp show` lists only HEAD's; the experiments live under git's refs/exps/)."""
    from rarelm.report.git_runs import experiment_refs

    found = {}
    for exp_name, _, commit in experiment_refs(ROOT):
        metrics = {}
        for part in ("eval", "train"):
            out = subprocess.run(["git", "show", f"{commit}:metrics/{part}.json"], cwd=ROOT,
                                 capture_output=True, text=True)
            if out.returncode == 0:
                metrics[part] = json.loads(out.stdout)
        found[exp_name] = metrics
    return found


def collect(lang: str, out: Path) -> None:
    rows = []
    for exp_name, m in sorted(experiments().items()):
        parts = exp_name.split("-")
        if len(parts) != 4 or parts[:2] != ["lc", lang] or "eval" not in m:
            continue
        steps, seed, ev, tr = int(parts[2]), int(parts[3][1:]), m["eval"], m.get("train", {})
        prefix = "n_eval_terms_band_"
        bands = sorted({k.removeprefix(prefix) for k in ev if k.startswith(prefix)},
                       key=lambda b: int(b.split("-")[0]))
        for band in bands:
            rows.append({"lang": lang, "steps": steps, "seed": seed, "band": band,
                         "occurrences": ev[f"n_eval_terms_band_{band}"],
                         "exact_match": ev[f"term_exact_match_band_{band}"],
                         "choice_acc": ev.get(f"term_choice_acc_band_{band}"),
                         "overall_exact_match": ev["term_exact_match"],
                         "first_mention_exact_match": ev.get("term_exact_match_first"),
                         "le15_exact_match": ev.get("term_exact_match_le15"),
                         "choice_acc_all": ev.get("term_choice_acc"), "em50": ev.get("em50_train_count"),
                         "ppl_frequent": ev.get("ppl_frequent"), "tokens_per_s": tr.get("tokens_per_s"),
                         "train_seconds": tr.get("train_seconds")})
    if not rows:
        sys.exit(f"no finished lc-{lang}-* experiments found")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    bands = sorted({r["band"] for r in rows}, key=lambda b: int(b.split("-")[0]))
    fmt = lambda v: "" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = [f"| seed | steps | {' | '.join(bands)} | all | first mentions | <= 15 | choice | em50 | "
             "ppl frequent | tokens/s |", "|" + " --- |" * (len(bands) + 9)]
    runs = sorted({(r["seed"], r["steps"]) for r in rows})
    for seed, steps in runs:
        rs = {r["band"]: r for r in rows if (r["seed"], r["steps"]) == (seed, steps)}
        any_r = next(iter(rs.values()))
        lines.append(f"| {seed} | {steps} | " + " | ".join(fmt(rs[b]["exact_match"]) if b in rs else ""
                                                           for b in bands)
                     + f" | {fmt(any_r['overall_exact_match'])} | {fmt(any_r['first_mention_exact_match'])}"
                     f" | {fmt(any_r['le15_exact_match'])} | {fmt(any_r['choice_acc_all'])}"
                     f" | {fmt(any_r['em50'])} | {fmt(any_r['ppl_frequent'])}"
                     f" | {any_r['tokens_per_s'] or 0:,.0f} |")
    occ = {r["band"]: r["occurrences"] for r in rows}
    lines.append("| occurrences | | " + " | ".join(str(occ[b]) for b in bands) + " |" + " |" * 7)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lang", choices=["en", "zh"], default="en")
    parser.add_argument("--steps", type=int, nargs="+", default=[250, 500, 1000, 2000])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1337, 1])
    parser.add_argument("--collect", action="store_true", help="only read finished experiments")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not args.collect:
        queue(args.lang, args.steps, args.seeds)
    collect(args.lang, args.out or ROOT / "records" / "curves" / f"learning_curve_{args.lang}")


if __name__ == "__main__":
    main()
