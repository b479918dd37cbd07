#!/usr/bin/env bash
# A lent one-GPU machine in two calls (docs/smollm2.md "On a lent GPU"): at most 64 MiB travels a call,
# the machine has torch + CUDA but no dvc, mlflow or gguf, and keeps /tmp between calls only while
# warm (~30 s). SmolLM2's 98 MB GGUF therefore travels in two parts.
#
#   bash bench/gpu_lease.sh pack          # here, first: .lease/c1 and .lease/c2 (git-ignored), the data
#                                         # stages of the plan run here (rarelm run-plan --only data)
#   bash bench/gpu_lease.sh check         # call 1 (carry .lease/c1): stash it in /tmp/persist, install
#                                         # its wheels, bench/gpu_check.sh (MFU, profile, the Trainer)
#                                         # in the packed commit's code (/tmp/persist/proj)
#   bash bench/gpu_lease.sh plan          # call 2 (carry .lease/c2), at once after call 1: join and
#                                         # convert the GGUF, rarelm run-plan the plan on the GPU
#   bash bench/gpu_lease.sh shape         # one call alone (carry .lease/c1 and .lease/smtok; gguf.00
#                                         # unused): SmolLM2's shape with random weights through
#                                         # pack's timing.yaml (as it is, fine-tune and term loss at
#                                         # 100 steps, the plan's common params): timings only
#
# PLAN (smollm2/foldoc_en.yaml), JOBS (9: every training and the as-is evaluations at once), PART1
# (bytes of the GGUF in call 1), SETS (extra --set's on every experiment; default: tracking off).
# Call 2 writes $OUT/records.tgz (the plan's records, rarelm/report/records.py's layout, refreshed
# every 30 s so a call stopped at its limit still brings back what finished), $OUT/logs.tgz and
# $OUT/log.txt. Back here: tar xzf records.tgz -C docs/realtext/smollm2_foldoc_en, then
# rarelm headline --plan smollm2/foldoc_en.yaml --out docs/realtext/smollm2_foldoc_en.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?usage: bash bench/gpu_lease.sh pack|check|plan|shape}
PLAN=${PLAN:-smollm2/foldoc_en.yaml}
JOBS=${JOBS:-9}
PART1=${PART1:-39000000}
SETS=${SETS:---set tracking.required=false}  # no mlflow there
GGUF=smollm2/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
P=/tmp/persist
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "${OUT:-/tmp}/log.txt"; }

case $MODE in
pack)
    PYTHON=${PYTHON:-python}
    [ -f "$GGUF" ] || { echo "gpu_lease: no $GGUF: run make smollm2 first" >&2; exit 2; }
    rm -rf .lease/c1 .lease/c2 && mkdir -p .lease/c1/whl .lease/c2
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d .lease/c1/whl transformers==5.24.0 gguf==0.19.0 ruamel.yaml==0.19.1
    "$PYTHON" -m stages.run_plan --plan "$PLAN" --out .lease/pack_out --work .lease/work --only data $SETS
    tar czf .lease/c1/data.tgz -C .lease/work $(cd .lease/work && ls -d prepare-* tokenize-* rare_terms-* weights-*)
    head -c "$PART1" "$GGUF" > .lease/c1/gguf.00
    tail -c +$(( PART1 + 1 )) "$GGUF" > .lease/c2/gguf.01
    git rev-parse HEAD > .lease/c1/commit
    mkdir -p .lease/smtok && find smollm2/model -maxdepth 1 -type f ! -name '*.safetensors' -exec cp {} .lease/smtok/ \;
    # shape's plan, timings only: the plan's common params, as it is, fine-tune and term loss at 100 steps
    "$PYTHON" - "$PLAN" .lease/c1/timing.yaml <<'EOF'
import sys

import yaml

plan, out = yaml.safe_load(open(sys.argv[1])), sys.argv[2]
steps = ["train.max_steps=100", "train.eval_every=50"]
configurations = {"as-is": ["train.max_steps=0"], "finetune": steps,
                  "term-loss": [*steps, "loss.targets=terms", "loss.rare_weight=2", "loss.normalize=targets"]}
yaml.safe_dump({"common": plan["common"], "screen_seeds": [], "final_seeds": [1], "prefix": "timing-",
                "section": "timing", "configurations": configurations}, open(out, "w"), sort_keys=False)
EOF
    # the code that runs there: this commit's, whatever the work tree holds meanwhile
    git archive --format=tar.gz -o .lease/c1/proj.tgz HEAD rarelm stages bench params.yaml dvc.yaml smollm2 \
        data/general/en.txt
    du -sb .lease/c1 .lease/c2
    ;;
check)
    mkdir -p "$P/proj" && cp -r .lease/c1/. "$P"/ && tar xzf "$P/proj.tgz" -C "$P/proj"
    cd "$P/proj"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$P"/whl/*.whl
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
    { nvidia-smi -L || true; nproc; python3 -c "import torch, transformers; print(torch.__version__, torch.version.cuda, transformers.__version__)"; } | tee "$OUT/env.txt"
    mkdir -p "$OUT/profile"
    PYTHON=python3 PROFILE_OUT=$OUT/profile COMPILE=${COMPILE:-} timeout "${CHECK_S:-300}" bash bench/gpu_check.sh \
        > "$OUT/gpu_check.log" 2>&1 || log "gpu_check rc=$?"
    gzip -f "$OUT/profile/trace.json" 2>/dev/null || true
    grep -v "^step" "$OUT/gpu_check.log" | tail -n 60
    log "call 1 done"
    ;;
plan)
    [ -f "$P/gguf.00" ] || { log "no $P/gguf.00: the machine went cold after call 1; run check again"; exit 3; }
    PART2=$PWD/.lease/c2/gguf.01
    cd "$P/proj"
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    export TOKENIZERS_PARALLELISM=false
    mkdir -p /tmp/gguf .lease/work
    cat "$P/gguf.00" "$PART2" > "/tmp/gguf/$(basename "$GGUF")"
    echo "$GGUF_SHA256  /tmp/gguf/$(basename "$GGUF")" | sha256sum -c - >> "$OUT/log.txt"
    python3 -m rarelm.pretrained convert --params smollm2/params.yaml --gguf-dir /tmp/gguf --out smollm2/model \
        2>&1 | tail -n 1 | tee -a "$OUT/log.txt"
    tar xzf "$P/data.tgz" -C .lease/work
    log "converted; data stages unpacked"
    ( while sleep 30; do [ -d /tmp/sm/runs ] && tar czf "$OUT/records.tgz.part" -C /tmp/sm runs runner.json 2>/dev/null \
        && mv "$OUT/records.tgz.part" "$OUT/records.tgz"; nvidia-smi --query-gpu=utilization.gpu,memory.used \
        --format=csv,noheader >> "$OUT/log.txt"; done ) &
    WATCH=$!
    python3 -m stages.run_plan --plan "$PLAN" --out /tmp/sm --work .lease/work --jobs "$JOBS" $SETS \
        --commit "$(cat "$P/commit")" 2>&1 | tee -a "$OUT/log.txt" || log "run-plan rc=$?"
    kill $WATCH 2>/dev/null || true
    tar czf "$OUT/records.tgz" -C /tmp/sm runs runner.json headline.json 2>/dev/null || tar czf "$OUT/records.tgz" -C /tmp/sm runs
    tar czf "$OUT/logs.tgz" -C .lease/work logs $(cd .lease/work && ls -d train-*/train.csv train-*/train.json 2>/dev/null)
    log "call 2 done"
    ;;
shape)
    mkdir -p "$P/proj" && tar xzf .lease/c1/proj.tgz -C "$P/proj"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .lease/c1/whl/*.whl
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
    SMTOK=$PWD/.lease/smtok COMMIT=$(cat .lease/c1/commit) TIMING=$PWD/.lease/c1/timing.yaml
    mkdir -p "$P/proj/.lease/work" && tar xzf .lease/c1/data.tgz -C "$P/proj/.lease/work"
    cd "$P/proj"
    python3 -c 'import shutil, sys, torch; from pathlib import Path; from transformers import AutoConfig, LlamaForCausalLM
src, out = Path(sys.argv[1]), Path("smollm2/model"); torch.manual_seed(0)
LlamaForCausalLM(AutoConfig.from_pretrained(src)).save_pretrained(out)  # the shape, random weights
[shutil.copy(f, out / f.name) for f in src.iterdir() if not (out / f.name).exists()]' "$SMTOK"
    timeout "${SHAPE_S:-170}" python3 -m stages.run_plan --plan "$TIMING" --out /tmp/t \
        --work .lease/work --jobs 6 $SETS --commit "$COMMIT" 2>&1 | tee -a "$OUT/log.txt" || log "run-plan rc=$?"
    grep -h "split:\|^train:\|^step " .lease/work/logs/*.log | cut -c1-300
    tar czf "$OUT/logs.tgz" -C .lease/work logs
    ;;
*) echo "usage: bash bench/gpu_lease.sh pack|check|plan|shape" >&2; exit 2 ;;
esac
