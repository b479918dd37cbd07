#!/usr/bin/env bash
# The training loop on GPUs, checked end to end in a few minutes (under 10):
#
#   1. bf16 autocast      the real train stage, precision bf16, under torchrun (NCCL, 1-process DDP)
#   2. fp16 + GradScaler  the same with precision fp16 (the scaler's scale must stay finite)
#   3. throughput         a GPT-2-124M-sized model (12 x 768, block 1024, vocab 50257), bf16,
#                         through the real stage
#   4. FSDP               train.strategy fsdp over every GPU (NCCL, at most 8; needs >= 2), bf16,
#                         the model of run 1: its loss and the bytes each rank holds
#   5. LoRA               model.lora rank 8 on run 1's model as the pretrained one (1 GPU), bf16:
#                         only the adapters train, the merged model is saved
#   6. profile + Trainer  bench/train_step_profile.py on run 3's model and batch: the host syncs of
#                         one step, a torch.profiler table and trace of 5 steps ($PROFILE_OUT), and
#                         transformers' Trainer on the same model, windows and precision (tokens/s, ratio)
#   7. pinned memory      rarelm.train.batches.to_batch gives CUDA tensors copied from pinned host memory;
#      and MFU            model FLOPs/s of run 3 over the bf16 matmul peak measured on the same
#                         GPU (8192^3 matmuls), not a datasheet figure
#   COMPILE=1 adds run 3 again with train.compile (60 steps; its tokens/s and wall time, compile included)
#
#   bash bench/gpu_check.sh                 # from the repo root; PYTHON=... to pick the interpreter
#
# Runs on synthetic token data in a temporary folder (nothing under data/ or models/ is
# touched) with its own MLflow store there. Without a CUDA device it falls back to the
# same steps on CPU with a tiny model (gloo instead of NCCL; no fp16, no FSDP, no pinned memory;
# run 1 stands in for run 3) so the script itself stays tested. The last line is one JSON object.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
PROFILE_OUT=${PROFILE_OUT:-$WORK/profile}  # profile.txt and trace.json of step 6 (kept if set outside)
export MLFLOW_TRACKING_URI="sqlite:///$WORK/mlflow.db"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

DEVICE=$("$PYTHON" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')
GPUS=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
if [ "$DEVICE" = cpu ]; then
    echo "gpu_check: no CUDA device here: running the CPU fallback (tiny model, gloo)"
fi

# Synthetic inputs in the pipeline's layout: tokenized split arrays + a tokenizer, buckets, weights.
"$PYTHON" - "$WORK" "$DEVICE" <<'EOF'
import sys
from pathlib import Path

import numpy as np

from rarelm.files import write_json
from rarelm.tokenize.tokenization import save_hf_tokenizer, train_bpe

work, device = Path(sys.argv[1]), sys.argv[2]
vocab = 50257 if device == "cuda" else 512
tok = work / "tokenized"
(tok / "tokenizer").mkdir(parents=True)
save_hf_tokenizer(train_bpe(iter(["gpu check text"] * 10), 260, 1), tok / "tokenizer")
rng = np.random.default_rng(0)
sizes = {"train": 4_000_000 if device == "cuda" else 40_000, "val": 200_000 if device == "cuda" else 4_000,
         "test": 1_000}
# Zipf-like ids, so the loss can fall and the rare bucket is not empty.
for split, n in sizes.items():
    ids = np.minimum(rng.zipf(1.2, n) - 1, vocab - 1).astype("<u2")
    ids.tofile(tok / f"{split}.tokens")
    np.save(tok / f"{split}.offsets.npy", np.array([0, n], dtype=np.int64))
write_json(tok / "meta.json", {"dtype": "uint16", "vocab_size": vocab, "eot_id": 0, "tokenizer": "synthetic",
                               "splits": {s: {"tokens": n, "documents": 1} for s, n in sizes.items()}})
(work / "rare").mkdir()
buckets = np.zeros(vocab, dtype=np.int8)
buckets[vocab // 10:] = 2
np.save(work / "rare" / "buckets.npy", buckets)
EOF

# A params file for one run: $1 = name, then key=value overrides; weights sized for its block_size.
params() {
    local name=$1; shift
    "$PYTHON" - "$WORK" "$name" "$@" <<'EOF'
import sys
from pathlib import Path

import numpy as np
import yaml

from rarelm.artifacts.tokenized import Samples, TokenizedData

work, name, overrides = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
p = yaml.safe_load(Path("params.yaml").read_text())
p["tracking"].update(experiment="gpu-check", log_model=False)
for item in overrides:
    key, value = item.split("=", 1)
    section, leaf = key.split(".")
    p[section][leaf] = yaml.safe_load(value)
(work / f"{name}.yaml").write_text(yaml.safe_dump(p))
tokens = TokenizedData.open(work / "tokenized").tokens("train")
(work / f"weights-{name}").mkdir(exist_ok=True)
np.save(work / f"weights-{name}" / "weights.npy", np.ones(len(Samples(tokens, p["model"]["block_size"]))))
EOF
}

# One run of the real stage under torchrun with $2 processes, default 1 (a process group: NCCL on CUDA).
train() {
    local name=$1
    "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "${2:-1}" -m stages.train \
        --params "$WORK/$name.yaml" --tokenized "$WORK/tokenized" --rare "$WORK/rare" \
        --weights "$WORK/weights-$name" --out "$WORK/models/$name" --metrics "$WORK/metrics/$name.json" \
        --plots "$WORK/plots/$name.csv" --cache "$WORK/cache" --no-progress | tail -n 1
}

if [ "$DEVICE" = cuda ]; then
    SMALL="model.n_layer=2 model.n_head=4 model.n_embd=256 model.block_size=256 train.batch_size=16"
    BIG="model.n_layer=12 model.n_head=12 model.n_embd=768 model.block_size=1024 train.batch_size=16"
else
    SMALL="model.n_layer=1 model.n_head=2 model.n_embd=32 model.block_size=32 train.batch_size=4"
    BIG="$SMALL"
fi
COMMON="train.nproc=1 train.log_every=5 train.eval_every=1000 train.eval_batches=2 train.checkpoint_every=1000"

echo "gpu_check: 1/7 bf16 autocast through the train stage"
params bf16 $SMALL $COMMON train.max_steps=30 train.precision=bf16 train.warmup_steps=5
train bf16
if [ "$DEVICE" = cuda ]; then
    echo "gpu_check: 2/7 fp16 with GradScaler through the train stage"
    params fp16 $SMALL $COMMON train.max_steps=30 train.precision=fp16 train.warmup_steps=5
    train fp16
else
    echo "gpu_check: 2/7 skipped: fp16 with a GradScaler needs CUDA"
fi
if [ "$DEVICE" = cuda ]; then
    echo "gpu_check: 3/7 throughput of the GPT-2-124M-sized model"
    params big $BIG $COMMON train.max_steps=40 train.precision=bf16 train.warmup_steps=5
    train big
else  # the tiny model again would add nothing: run 1 stands in for it
    cp -r "$WORK/models/bf16" "$WORK/models/big"
    cp "$WORK/metrics/bf16.json" "$WORK/metrics/big.json"; cp "$WORK/plots/bf16.csv" "$WORK/plots/big.csv"
fi

FSDP_RANKS=$(( GPUS > 8 ? 8 : GPUS ))
if [ "$DEVICE" = cpu ]; then  # FSDP over gloo is what tests/test_train.py and test_reliability.py run
    echo "gpu_check: 4/7 skipped on CPU: the test suite runs FSDP over gloo"
elif [ "$FSDP_RANKS" -ge 2 ]; then
    echo "gpu_check: 4/7 FSDP over $FSDP_RANKS processes through the train stage"
    params fsdp $SMALL $COMMON train.max_steps=30 train.precision=bf16 train.warmup_steps=5 \
        train.strategy=fsdp train.nproc=$FSDP_RANKS
    train fsdp "$FSDP_RANKS"
else
    echo "gpu_check: 4/7 skipped: FSDP needs 2 GPUs, this machine has $GPUS"
fi
echo "gpu_check: 5/7 LoRA on run 1's model through the train stage"
params lora $SMALL $COMMON train.max_steps=30 train.precision=bf16 train.warmup_steps=5 train.lr=0.002 \
    "model.name_or_path=$WORK/models/bf16" "model.lora={rank: 8, alpha: 16.0}"
train lora

if [ "$DEVICE" = cuda ] && [ -n "${COMPILE:-}" ]; then
    echo "gpu_check: 5b/7 the GPT-2-124M-sized model with train.compile (COMPILE=1; its compile time counted)"
    params compiled $BIG $COMMON train.max_steps=60 train.precision=bf16 train.warmup_steps=5 train.compile=true
    train compiled
fi
echo "gpu_check: 6/7 where our step's time goes (torch.profiler, host syncs) and the HF Trainer on the same"
echo "gpu_check:     model and batch (bench/train_step_profile.py; PROFILE_OUT=$PROFILE_OUT)"
params profile $BIG $COMMON train.max_steps=1000 train.precision=bf16 train.warmup_steps=5
"$PYTHON" bench/train_step_profile.py --params "$WORK/profile.yaml" --tokenized "$WORK/tokenized" \
    --rare "$WORK/rare" --weights "$WORK/weights-profile" --out "$PROFILE_OUT" --steps 30 --warmup 5 \
    | tee "$WORK/profile.log" | tail -n 1 > "$WORK/profile.json"
grep -v '^{' "$WORK/profile.log" | head -n 40

echo "gpu_check: 7/7 pinned memory, and the bf16 matmul peak for MFU"
"$PYTHON" - "$WORK" "$DEVICE" <<'EOF'
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from rarelm.artifacts.tokenized import Samples, TokenizedData
from rarelm.train.batches import to_batch

work, device_name = Path(sys.argv[1]), sys.argv[2]
device = torch.device(device_name)
samples = Samples(TokenizedData.open(work / "tokenized").tokens("train"), 32)
x, y = to_batch(samples, np.arange(8) * 32, 32, device)
pinned = None
if device.type == "cuda":
    assert x.is_cuda and y.is_cuda
    pinned = torch.zeros(4).pin_memory().is_pinned()
    assert pinned, "pin_memory() gave unpinned memory"

def peak_tflops(n: int, dtype) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    reps = 20 if device.type == "cuda" else 3
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12

peak = peak_tflops(8192, torch.bfloat16) if device.type == "cuda" else peak_tflops(1024, torch.float32)
result = {"gpu": device.type == "cuda", "torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
          "pinned_memory": pinned, "peak_matmul_tflops": round(peak, 2),
          "peak_dtype": "bf16" if device.type == "cuda" else "fp32"}
for name in ("bf16", "fp16", "big", "fsdp", "lora"):
    if not (work / "metrics" / f"{name}.json").is_file():
        result[f"{name}_loss_first_last"] = None  # not run (fp16 on CPU, FSDP on one GPU)
        continue
    rows = [r for r in csv.DictReader((work / "plots" / f"{name}.csv").open()) if r["tokens_per_s"]]
    assert all(np.isfinite(float(r["loss"])) for r in rows), f"{name}: non-finite loss"
    result[f"{name}_loss_first_last"] = [round(float(rows[0]["loss"]), 3), round(float(rows[-1]["loss"]), 3)]
    metrics = json.loads((work / "metrics" / f"{name}.json").read_text())
    if name in ("bf16", "fsdp", "lora"):
        result[f"{name}_state_bytes_per_rank"] = metrics["state_bytes_per_rank"]
result["profile"] = json.loads((work / "profile.json").read_text())  # bench/train_step_profile.py
if (work / "metrics" / "compiled.json").is_file():  # COMPILE=1: tokens/s and wall time with compile
    compiled = json.loads((work / "metrics" / "compiled.json").read_text())
    result["compiled"] = {k: compiled.get(k) for k in ("tokens_per_s", "wall_time_s", "steps")}
lora_metrics = json.loads((work / "metrics" / "lora.json").read_text())
result["lora_trainable_parameters"] = lora_metrics["trainable_parameters"]
assert (work / "models" / "lora" / "adapter" / "adapter_config.json").is_file(), "no adapter saved"
config = json.loads((work / "models" / "big" / "config.json").read_text())
rows = [r for r in csv.DictReader((work / "plots" / "big.csv").open()) if r["tokens_per_s"]][1:]
tokens_per_s = float(np.mean([float(r["tokens_per_s"]) for r in rows]))  # after the first window
n_params = json.loads((work / "metrics" / "big.json").read_text())["parameters"]
L, d, T = config["n_layer"], config["n_embd"], config["n_positions"]
flops_per_token = 6 * n_params + 12 * L * d * T  # weights fwd+bwd, plus attention (PaLM appendix B)
result.update({"model": f"{L}x{d}, block {T}, vocab {config['vocab_size']}", "parameters": n_params,
               "tokens_per_s": round(tokens_per_s, 1),
               "model_tflops": round(tokens_per_s * flops_per_token / 1e12, 3),
               "mfu": round(tokens_per_s * flops_per_token / (peak * 1e12), 4)})
print(json.dumps(result))
EOF
