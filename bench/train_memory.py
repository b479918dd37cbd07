"""Memory and speed per rank: DDP against FSDP2 (and LoRA) at 2 ranks, through the train stage.

    python bench/train_memory.py [--steps 30] [--repeats 2] [--n-layer 8 --n-embd 256 --n-head 8]

Needs the demo pipeline's data (data/tokenized, data/rare, data/weights: `make repro`
or `dvc repro weights`). Each run is the real stage, `python -m stages.train`, with
params.yaml's settings except: a model of `--n-layer` x `--n-embd` (default 8 x 256,
6.8M parameters with the demo's 4096-token vocabulary: 6.8x the demo model),
`train.max_steps = --steps`, no checkpoint, validation only at the end, no model
logged to MLflow (a throw-away SQLite store). Its outputs go to a temporary folder.

* `ddp`   train.strategy: ddp (each rank holds the whole model, gradients, AdamW state)
* `fsdp`  train.strategy: fsdp (FSDP2 shards all three over the ranks)
* `lora`  DDP, LoRA rank 8 on c_attn of the model the first ddp run trained, as a
          pretrained model (only the adapters train)

Per run, from the stage's metrics/train.json: `state_bytes_per_rank` (parameters +
gradients + AdamW state that one rank holds, the largest over the ranks) and
`tokens_per_s` (all ranks, whole run: start-up of the loop aside, validation
included); from polling the worker processes every 20 ms: the peak resident memory
of a rank (RSS, which also holds Python, torch, the data's page cache and the
activations). Runs are interleaved and repeated; each figure is the median of its
repeats. The last line is one JSON object with every run and the ratios
{"fsdp_state_over_ddp", "fsdp_tokens_per_s_over_ddp", "lora_state_over_ddp", ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]


def run_stage(work: Path, name: str, params: dict) -> dict:
    """One train stage run with `params`; its metrics plus the peak RSS of its largest rank."""
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    args = [sys.executable, "-m", "stages.train", "--params", str(folder / "params.yaml"),
            "--out", str(folder / "model"), "--metrics", str(folder / "train.json"),
            "--plots", str(folder / "train.csv"), "--cache", str(folder / "cache"), "--no-progress"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    with open(folder / "log.txt", "w") as log:
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        launcher, peak = psutil.Process(proc.pid), {}
        while proc.poll() is None:
            try:
                for worker in launcher.children(recursive=True):
                    if "stages.train" in " ".join(worker.cmdline()):
                        peak[worker.pid] = max(peak.get(worker.pid, 0), worker.memory_info().rss)
            except psutil.Error:
                pass  # a worker that just ended
            time.sleep(0.02)
    if proc.returncode:
        sys.exit(f"train_memory: run {name} failed (exit {proc.returncode}):\n"
                 + (folder / "log.txt").read_text()[-3000:])
    metrics = json.loads((folder / "train.json").read_text())
    return {"state_bytes_per_rank": metrics["state_bytes_per_rank"],
            "tokens_per_s": metrics["tokens_per_s"], "parameters": metrics["parameters"],
            "trainable_parameters": metrics["trainable_parameters"],
            "peak_rss_bytes_per_rank": max(peak.values(), default=0),
            "precision": metrics["precision"], "model": str(folder / "model")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--n-layer", type=int, default=8)
    parser.add_argument("--n-embd", type=int, default=256)
    parser.add_argument("--n-head", type=int, default=8)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    args = parser.parse_args()
    for needed in ("data/tokenized/meta.json", "data/rare/buckets.npy", "data/weights/weights.npy"):
        if not (REPO / needed).is_file():
            sys.exit(f"train_memory: {needed} is missing: run `make repro` (or `dvc repro weights`) first")

    base = yaml.safe_load(args.params.read_text())
    base["model"].update(n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head,
                         name_or_path="", lora={"rank": 0})
    base["train"].update(nproc=2, max_steps=args.steps, eval_every=args.steps,
                         log_every=max(1, args.steps // 3), checkpoint_every=args.steps + 1)
    base["tracking"].update(log_model=False, system_metrics=False)
    results: dict[str, list[dict]] = {"ddp": [], "fsdp": [], "lora": []}
    with tempfile.TemporaryDirectory(prefix="train_memory.") as tmp:
        work = Path(tmp)
        for repeat in range(args.repeats):
            for strategy in ("ddp", "fsdp"):
                params = json.loads(json.dumps(base))
                params["train"]["strategy"] = strategy
                results[strategy].append(run_stage(work, f"{strategy}-{repeat}", params))
                print(f"{strategy} #{repeat}: {results[strategy][-1]}", flush=True)
            if repeat == 0:  # the first DDP model becomes the pretrained model LoRA starts from
                pretrained = work / "pretrained"
                shutil.copytree(results["ddp"][0]["model"], pretrained)
            params = json.loads(json.dumps(base))
            params["model"].update(name_or_path=str(pretrained),
                                   lora={"rank": args.lora_rank, "alpha": 2.0 * args.lora_rank})
            results["lora"].append(run_stage(work, f"lora-{repeat}", params))
            print(f"lora #{repeat}: {results['lora'][-1]}", flush=True)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    summary: dict = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                     "ranks": 2, "steps": args.steps, "repeats": args.repeats,
                     "precision": results["ddp"][0]["precision"],
                     "parameters": results["ddp"][0]["parameters"],
                     "lora_trainable_parameters": results["lora"][0]["trainable_parameters"]}
    print("\n| run | state bytes / rank | bytes / parameter / rank | peak RSS / rank | tokens/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in ("ddp", "fsdp", "lora"):
        state, rss, speed = (median(name, k) for k in ("state_bytes_per_rank",
                                                        "peak_rss_bytes_per_rank", "tokens_per_s"))
        summary[name] = {"state_bytes_per_rank": state, "peak_rss_bytes_per_rank": rss,
                         "tokens_per_s": speed}
        print(f"| {name} | {state / 2**20:,.1f} MiB | {state / summary['parameters']:.2f} | "
              f"{rss / 2**20:,.0f} MiB | {speed:,.0f} |")
    for name in ("fsdp", "lora"):
        for key, short in (("state_bytes_per_rank", "state"), ("peak_rss_bytes_per_rank", "rss"),
                           ("tokens_per_s", "tokens_per_s")):
            summary[f"{name}_{short}_over_ddp"] = round(summary[name][key] / summary["ddp"][key], 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
