#!/usr/bin/env bash
# A lent one-GPU machine in a few calls (docs/real_models.md "On a lent GPU"): at most 64 MiB travels a
# call, the work tree included; the machine has torch + CUDA but no dvc, mlflow or gguf, and keeps
# /tmp between calls only while warm (~30 s). A model's GGUF therefore travels in parts: SmolLM2's
# 98 MB in two calls, Gemma 3's 253 MB in five (MODEL=gemma3).
#
#   bash bench/gpu_lease.sh slim          # here, first: records/, base/, data/, tests/ and docs/ out of
#                                         # git's index and ignored (files untouched), so the work tree
#                                         # that travels is 2.7 MB;
#                                         # `unslim` puts them back when the lease is over
#   bash bench/gpu_lease.sh pack          # here: .lease/c1 .. .lease/cN (git-ignored): this commit's code,
#                                         # wheels, the plan's data stages (rarelm run-plan --only data)
#                                         # and the GGUF in parts; it prints the N calls to make
#   bash bench/gpu_lease.sh check         # call 1 (carry .lease/c1): stash it in /tmp/persist, install
#                                         # its wheels, bench/gpu_check.sh (MFU, profile, the Trainer)
#                                         # in the packed commit's code (/tmp/persist/proj)
#   bash bench/gpu_lease.sh stash K       # call K (carry .lease/cK), at once after call K-1: stash it
#                                         # (K=1: as check without the checks, ~10 s)
#   bash bench/gpu_lease.sh plan          # call N (carry .lease/cN), at once after call N-1: join the
#                                         # GGUF's parts (sha256 checked), convert, rarelm run-plan,
#                                         # stopped CALL_S (570) s after the call began; `plan` again
#                                         # (carrying nothing) goes on where it stopped
#   bash bench/gpu_lease.sh shape         # one call alone (carry .lease/c1 and .lease/tok): the model's
#                                         # shape with random weights through pack's timing.yaml (as it
#                                         # is, fine-tune and term loss at 100 steps): timings only
#                                         # (pack with PART1=0 if the two pass 64 MiB together)
#
# MODEL (smollm2 or gemma3: its folder, GGUF and default PLAN: smollm2/foldoc_en.yaml,
# gemma3/manpages_zh.yaml), JOBS (concurrent trainings and evaluations: 9 for smollm2, 6 for
# gemma3), PART1 (bytes of the GGUF in call 1), PART (bytes in each later call), SETS (extra --set's
# on every experiment; default: tracking off). The plan call writes $OUT/records.tgz (the plan's
# records, rarelm/report/records.py's layout, refreshed every 30 s so a call stopped at its limit
# still brings back what finished), $OUT/logs.tgz and $OUT/log.txt. Back here: tar xzf records.tgz
# -C records/realtext/<plan's folder>, then rarelm headline --plan PLAN --out records/realtext/<folder>.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?usage: bash bench/gpu_lease.sh slim|unslim|pack|check|stash K|plan|shape}
MODEL=${MODEL:-smollm2}
case $MODEL in
smollm2) GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf JOBS=${JOBS:-9} PLAN=${PLAN:-smollm2/foldoc_en.yaml}
         PART1=${PART1:-41000000} PART=${PART:-59400000}
         GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 ;;
gemma3)  GGUF_NAME=gemma-3-270m-q4_k_m.gguf JOBS=${JOBS:-6} PLAN=${PLAN:-gemma3/manpages_zh.yaml}
         PART1=${PART1:-32000000} PART=${PART:-56000000}
         GGUF_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 ;;
*) echo "gpu_lease: MODEL=$MODEL: must be smollm2 or gemma3" >&2; exit 2 ;;
esac
GGUF=$MODEL/gguf/$GGUF_NAME
SETS=${SETS:---set tracking.required=false}  # no mlflow there
P=${PERSIST:-/tmp/persist}
T0=$(date +%s)
OUT=${OUT:-/tmp}
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/log.txt"; }
# stash K: what call K carried, kept under $P while the machine stays warm; call 1's code unpacked and
# its wheels installed
stash() {
    mkdir -p "$P" && cp -r ".lease/c$1/." "$P"/
    [ "$1" != 1 ] || { mkdir -p "$P/proj" && tar xzf "$P/proj.tgz" -C "$P/proj"
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$P"/whl/*.whl; }
    log "call $1: $(ls "$P" | grep -c '^gguf\.') of $(cat "$P/parts" 2>/dev/null || echo '?') GGUF parts stashed"
}
SLIM_MARK="# bench/gpu_lease.sh slim"
SLIM="records base data tests docs"  # what the calls do not need: the code there is call 1's proj.tgz

case $MODE in
slim)
    EXCLUDE=$(git rev-parse --git-path info/exclude)
    grep -qF "$SLIM_MARK" "$EXCLUDE" 2>/dev/null && { echo "gpu_lease: already slim" >&2; exit 2; }
    git diff --quiet HEAD -- $SLIM || { echo "gpu_lease: $SLIM: uncommitted changes; commit them first" >&2; exit 2; }
    git rm -r -q --cached --ignore-unmatch $SLIM
    { echo "$SLIM_MARK"; for d in $SLIM; do echo "/$d/"; done; } >> "$EXCLUDE"
    echo "$(git ls-files -z | du --files0-from=- -cb | tail -n 1 | cut -f1) bytes tracked now ($SLIM out of" \
        "the index; bash bench/gpu_lease.sh unslim puts them back)"
    ;;
unslim)
    EXCLUDE=$(git rev-parse --git-path info/exclude)
    git reset -q -- $SLIM
    sed -i "\\|^$SLIM_MARK\$|,+$(wc -w <<< "$SLIM")d" "$EXCLUDE"
    git status --short -- $SLIM | head -n 5
    ;;
pack)
    PYTHON=${PYTHON:-python}
    [ -f "$GGUF" ] || { echo "gpu_lease: no $GGUF: run make $MODEL first" >&2; exit 2; }
    rm -rf .lease && mkdir -p .lease/c1/whl .lease/tok
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d .lease/c1/whl transformers==5.24.0 gguf==0.19.0 ruamel.yaml==0.19.1
    "$PYTHON" -m stages.run_plan --plan "$PLAN" --out .lease/pack_out --work .lease/work --only data $SETS
    tar czf .lease/c1/data.tgz -C .lease/work $(cd .lease/work && ls -d prepare-* tokenize-* rare_terms-* weights-*)
    mkdir -p .lease/c1/notices && find "$MODEL/gguf" -maxdepth 1 -type f ! -name '*.gguf' -exec cp {} .lease/c1/notices/ \;
    head -c "$PART1" "$GGUF" > .lease/c1/gguf.00
    tail -c +$(( PART1 + 1 )) "$GGUF" | split -b "$PART" -d -a 2 --numeric-suffixes=1 - .lease/gguf.
    N=1
    shopt -s nullglob
    for f in .lease/gguf.*; do N=$(( N + 1 )); mkdir -p ".lease/c$N" && mv "$f" ".lease/c$N/${f#.lease/}"; done
    echo "$N" > .lease/c1/parts
    git rev-parse HEAD > .lease/c1/commit
    find "$MODEL/model" -maxdepth 1 -type f ! -name '*.safetensors' -exec cp {} .lease/tok/ \;
    # shape's plan, timings only: the plan's common params, as it is, fine-tune and term loss at 100 steps
    "$PYTHON" - "$PLAN" .lease/c1/timing.yaml <<'PY'
import sys

import yaml

plan, out = yaml.safe_load(open(sys.argv[1])), sys.argv[2]
steps = ["train.max_steps=100", "train.eval_every=50"]
configurations = {"as-is": ["train.max_steps=0"], "finetune": steps,
                  "term-loss": [*steps, "loss.targets=terms", "loss.rare_weight=2", "loss.normalize=targets"]}
yaml.safe_dump({"common": plan["common"], "screen_seeds": [], "final_seeds": [1], "prefix": "timing-",
                "section": "timing", "configurations": configurations}, open(out, "w"), sort_keys=False)
PY
    # the code that runs there: this commit's, whatever the work tree holds meanwhile
    git archive --format=tar.gz -o .lease/c1/proj.tgz HEAD rarelm stages bench params.yaml dvc.yaml "$MODEL" \
        data/general/en.txt data/general/zh.txt
    TREE=$(git ls-files -z | du --files0-from=- -cb | tail -n 1 | cut -f1)
    for k in $(seq 1 "$N"); do
        SIZE=$(( $(du -sb ".lease/c$k" | cut -f1) + TREE ))
        WHAT="bash bench/gpu_lease.sh stash $k"
        [ "$k" != "$N" ] || WHAT="bash bench/gpu_lease.sh plan"
        echo "call $k: carry .lease/c$k, MODEL=$MODEL $WHAT  ($(( SIZE / 1048576 )) MiB with the work tree)"
        [ "$SIZE" -le 67108864 ] || echo "gpu_lease: call $k would carry more than 64 MiB: bash bench/gpu_lease.sh slim, or a smaller PART1/PART" >&2
    done
    ;;
check)
    stash 1
    cd "$P/proj"
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
    { nvidia-smi -L || true; nproc; python3 -c "import torch, transformers; print(torch.__version__, torch.version.cuda, transformers.__version__)"; } | tee "$OUT/env.txt"
    mkdir -p "$OUT/profile"
    PYTHON=python3 PROFILE_OUT=$OUT/profile COMPILE=${COMPILE:-} timeout "${CHECK_S:-300}" bash bench/gpu_check.sh \
        > "$OUT/gpu_check.log" 2>&1 || log "gpu_check rc=$?"
    gzip -f "$OUT/profile/trace.json" 2>/dev/null || true
    grep -v "^step" "$OUT/gpu_check.log" | tail -n 60
    log "call 1 done"
    ;;
stash)
    K=${2:?usage: bash bench/gpu_lease.sh stash K (the number of the call: .lease/cK travels with it)}
    [ -d ".lease/c$K" ] || { log "no .lease/c$K here: carry it with this call"; exit 2; }
    [ "$K" = 1 ] || [ -f "$P/parts" ] || { log "nothing stashed before call $K: the machine went cold; start again at call 1"; exit 3; }
    stash "$K"
    ;;
plan)
    [ ! -f .lease/c1/parts ] || stash 1  # a GGUF small enough for call 1 alone: one call
    [ -f "$P/parts" ] || { log "nothing stashed: the machine went cold; start again at call 1"; exit 3; }
    cp .lease/c*/gguf.* "$P"/ 2>/dev/null || true  # a repeated plan call carries nothing
    N=$(cat "$P/parts")
    cd "$P/proj"
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    export TOKENIZERS_PARALLELISM=false
    if [ -f "$MODEL/model/config.json" ]; then
        log "the model and the data stages are here from an earlier plan call: run-plan goes on where it stopped"
    else
        for k in $(seq 0 $(( N - 1 ))); do
            [ -f "$P/gguf.$(printf %02d "$k")" ] || { log "gguf.$(printf %02d "$k") (call $(( k + 1 )) carried it) missing: the machine went cold; start again at call 1"; exit 3; }
        done
        mkdir -p /tmp/gguf .lease/work
        cat "$P"/gguf.* > "/tmp/gguf/$GGUF_NAME"
        cp -r "$P/notices/." /tmp/gguf/   # the licence files convert writes beside the weights
        echo "$GGUF_SHA256  /tmp/gguf/$GGUF_NAME" | sha256sum -c - >> "$OUT/log.txt"
        python3 -m rarelm.pretrained convert --params "$MODEL/params.yaml" --gguf-dir /tmp/gguf --out "$MODEL/model" \
            2>&1 | tail -n 1 | tee -a "$OUT/log.txt"
        tar xzf "$P/data.tgz" -C .lease/work
        log "converted; data stages unpacked"
    fi
    ( while sleep 30; do [ -d /tmp/sm/runs ] && tar czf "$OUT/records.tgz.part" -C /tmp/sm runs runner.json 2>/dev/null \
        && mv "$OUT/records.tgz.part" "$OUT/records.tgz"; nvidia-smi --query-gpu=utilization.gpu,memory.used \
        --format=csv,noheader >> "$OUT/log.txt" 2>/dev/null || true; done ) &
    WATCH=$!
    # stopped (SIGTERM: its stage processes too) CALL_S seconds after this call began, so the records
    # come back before the machine's limit; `plan` again in the next call goes on from there
    LEFT=$(( ${CALL_S:-570} - $(date +%s) + T0 ))
    [ "$LEFT" -gt 10 ] || LEFT=1  # timeout 0 would mean no limit
    timeout "$LEFT" python3 -m stages.run_plan --plan "$PLAN" --out /tmp/sm \
        --work .lease/work --jobs "$JOBS" $SETS --commit "$(cat "$P/commit")" 2>&1 | tee -a "$OUT/log.txt" \
        || log "run-plan rc=$? (124: stopped at CALL_S; run plan again to go on)"
    kill $WATCH 2>/dev/null || true
    [ ! -d /tmp/sm/runs ] || tar czf "$OUT/records.tgz" -C /tmp/sm $(cd /tmp/sm && ls -d runs runner.json headline.json 2>/dev/null)
    tar czf "$OUT/logs.tgz" -C .lease/work logs $(cd .lease/work && ls -d train-*/train.csv train-*/train.json 2>/dev/null)
    log "plan call done"
    ;;
shape)
    stash 1
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
    TOK=$PWD/.lease/tok COMMIT=$(cat .lease/c1/commit) TIMING=$PWD/.lease/c1/timing.yaml
    mkdir -p "$P/proj/.lease/work" && tar xzf .lease/c1/data.tgz -C "$P/proj/.lease/work"
    cd "$P/proj"
    python3 -c 'import shutil, sys, torch; from pathlib import Path; from transformers import AutoConfig, AutoModelForCausalLM
src, out = Path(sys.argv[1]), Path(sys.argv[2]); torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src)).save_pretrained(out)  # the shape, random weights
[shutil.copy(f, out / f.name) for f in src.iterdir() if not (out / f.name).exists()]' "$TOK" "$MODEL/model"
    timeout "${SHAPE_S:-170}" python3 -m stages.run_plan --plan "$TIMING" --out /tmp/t \
        --work .lease/work --jobs 6 $SETS --commit "$COMMIT" 2>&1 | tee -a "$OUT/log.txt" || log "run-plan rc=$?"
    grep -h "split:\|^train:\|^step " .lease/work/logs/*.log | cut -c1-300
    tar czf "$OUT/logs.tgz" -C .lease/work logs
    ;;
*) echo "usage: bash bench/gpu_lease.sh slim|unslim|pack|check|stash K|plan|shape" >&2; exit 2 ;;
esac
