"""fp32 against bf16 autocast on this CPU, per model shape, as `train.precision: auto`'s probe times them.

    python bench/precision_probe.py                       # the four shapes, 5 steps each
    python bench/precision_probe.py --shapes base --steps 9
    python bench/precision_probe.py --attention sdpa      # bf16 with torch's bf16 attention kernel

For each shape, a GPT-2 model as the train stage builds one (rarelm.train.model.gpt2_config,
random weights: speed does not depend on them; its attention rarelm.train.model.ATTENTION, which
under bf16 autocast on CPU runs the attention kernel in fp32, or `--attention sdpa`, transformers'
own) and one micro-batch of random tokens; then
rarelm.train.precision.probe_seconds: one forward + backward in fp32 and one under bf16 autocast,
alternating step by step after a warm-up step each, median seconds of `--steps` per precision,
so other load on the machine hits both alike, and what `auto` picks from those seconds
(rarelm.train.precision.resolve, as the train stage decides: on a CPU without native bf16 it never
probes, since emulated bf16 cannot win). One JSON line per shape, then one for the CPU.
"""

from __future__ import annotations

import argparse
import json

SHAPES = {  # name: GPT-2 sizes, vocabulary and micro-batch (rows x block)
    "demo": {"n_layer": 4, "n_head": 4, "n_embd": 128, "vocab": 1712, "rows": 16, "block": 128},
    "base": {"n_layer": 6, "n_head": 4, "n_embd": 128, "vocab": 8192, "rows": 16, "block": 128},
    "gpt2-small": {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab": 8192, "rows": 1, "block": 128},
    # the same body at a GPU-like micro-batch: 1,024-row matmuls, where AMX tiles have rows to fill
    "gpt2-small-b8": {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab": 8192, "rows": 8, "block": 128},
}


def probe(shape: dict, steps: int, attention: str) -> dict:
    """Median seconds per step in fp32 and under bf16 autocast for one shape, and their ratio."""
    import torch
    from transformers import GPT2LMHeadModel

    from rarelm.params import ModelParams
    from rarelm.train.model import gpt2_config
    from rarelm.train.precision import probe_seconds, resolve

    torch.manual_seed(0)
    sizes = ModelParams(n_layer=shape["n_layer"], n_head=shape["n_head"], n_embd=shape["n_embd"],
                        block_size=shape["block"])
    model = GPT2LMHeadModel(gpt2_config(sizes, shape["vocab"], 0)).train()
    if attention == "sdpa":
        model.set_attn_implementation("sdpa")
    x = torch.randint(0, shape["vocab"], (shape["rows"], shape["block"]))
    seconds = probe_seconds(model, x, torch.roll(x, -1, dims=1), steps=steps)
    tokens = shape["rows"] * shape["block"]
    auto = resolve("auto", torch.device("cpu"), probe=lambda: seconds)  # as the train stage decides
    return {"fp32_s": round(seconds["fp32"], 4), "bf16_s": round(seconds["bf16"], 4),
            "fp32_tokens_per_s": round(tokens / seconds["fp32"], 1),
            "bf16_tokens_per_s": round(tokens / seconds["bf16"], 1),
            "bf16_over_fp32_speed": round(seconds["fp32"] / seconds["bf16"], 3),
            "auto": auto.name, "why": auto.reason}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--steps", type=int, default=5, help="timed steps per precision and shape")
    parser.add_argument("--attention", choices=["ours", "sdpa"], default="ours",
                        help="ours: rarelm.train.model.ATTENTION (the train stage's); sdpa: transformers'")
    args = parser.parse_args()

    import torch

    from rarelm.train.precision import cpu_has_native_bf16, cpu_model_name, resolve

    for name in args.shapes:
        figures = probe(SHAPES[name], args.steps, args.attention)
        print(json.dumps({"shape": name, **SHAPES[name], "attention": args.attention, **figures}),
              flush=True)
    auto = resolve("auto", torch.device("cpu"))
    print(json.dumps({"cpu": cpu_model_name(), "native_bf16": cpu_has_native_bf16(),
                      "threads": torch.get_num_threads(), "torch": torch.__version__,
                      "auto": auto.name, "why": auto.reason}))


if __name__ == "__main__":
    main()
