"""How long each stage takes on a corpus of a given size: the whole DAG without DVC, timed.

Runs check, prepare, tokenize, rare_terms, weights, train and evaluate as `python -m stages.<name>`
on params.yaml with some keys changed, into a folder of its own (nothing under data/, models/ or
metrics/ is touched; no DVC experiment, no MLflow run: tracking off), and prints one JSON line:
the corpus's characters and documents, each stage's wall seconds, and train's tokens/s:

    python bench/own_corpus_times.py /tmp/t corpus.path=data/raw/foldoc_en.txt.gz \\
        corpus.reference_glossary= tokenizer.name_or_path=base/model model.name_or_path=base/model \\
        train.max_steps=50

Train's time is set by train.max_steps (x batch x block tokens at the printed tokens/s), not by the
corpus; the others grow with it (evaluate with the test split). docs/own_corpus.md, "How long it takes".
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from rarelm.params import read_yaml
from rarelm.report.plan_runner import with_overrides

REPO = Path(__file__).resolve().parents[1]


def write_params(path: Path, overrides: list[str]) -> None:
    """params.yaml with `key=value` overrides, read as DVC reads -S values (`key=` is the empty string)."""
    params = read_yaml((REPO / "params.yaml").read_text(encoding="utf-8"), REPO / "params.yaml")
    overrides = [o if not o.endswith("=") else f'{o}""' for o in overrides]
    data = with_overrides(params, ["tracking.required=false", "tracking.log_model=false", *overrides])
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")


def main(out: Path, overrides: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=False)
    params = out / "params.yaml"
    write_params(params, overrides)
    d = {name: str(out / name) for name in ("prepared", "tokenized", "rare", "weights", "model", "datastore")}
    m = {name: str(out / f"{name}.json") for name in ("prepare", "tokenize", "rare_terms", "weights", "train",
                                                       "eval", "summary")}
    stages = {
        "check": ["--out", str(out / "checked.txt")],
        "prepare": ["--out", d["prepared"], "--metrics", m["prepare"]],
        "tokenize": ["--prepared", d["prepared"], "--out", d["tokenized"], "--metrics", m["tokenize"]],
        "rare_terms": ["--prepared", d["prepared"], "--tokenized", d["tokenized"], "--out", d["rare"],
                       "--metrics", m["rare_terms"]],
        "weights": ["--tokenized", d["tokenized"], "--rare", d["rare"], "--out", d["weights"],
                    "--metrics", m["weights"], "--plot", str(out / "weights.csv")],
        "train": ["--tokenized", d["tokenized"], "--rare", d["rare"], "--weights", d["weights"],
                  "--out", d["model"], "--metrics", m["train"], "--plots", str(out / "train.csv"),
                  "--cache", str(out / "cache"), "--no-progress"],
        "datastore": ["--model", d["model"], "--tokenized", d["tokenized"], "--out", d["datastore"]],
        "evaluate": ["--model", d["model"], "--prepared", d["prepared"], "--tokenized", d["tokenized"],
                     "--rare", d["rare"], "--datastore", d["datastore"], "--metrics", m["eval"],
                     "--summary", m["summary"], "--occurrences", str(out / "occurrences.jsonl"),
                     "--plots", str(out / "plots"), "--train-metrics", m["train"]],
    }
    seconds = {}
    for name, args in stages.items():
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", f"stages.{name}", "--params", str(params), *args],
                                cwd=REPO, capture_output=True, text=True)
        seconds[name] = round(time.perf_counter() - start, 1)
        (out / f"{name}.log").write_text(result.stdout + result.stderr, encoding="utf-8")
        if result.returncode:
            sys.exit(f"{name} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    prepared = json.loads(Path(m["prepare"]).read_text())
    train = json.loads(Path(m["train"]).read_text())
    characters = sum(prepared[split]["characters"] for split in ("train", "val", "test"))
    print(json.dumps({"overrides": overrides, "documents": prepared["documents"],
                      "characters": characters, "seconds": seconds,
                      "train_steps": train["steps"], "train_tokens_per_s": round(train["tokens_per_s"])}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
