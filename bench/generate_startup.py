"""Where `rarelm generate`'s start-up goes: wall time to the first token, by phase and by import.

    python bench/generate_startup.py                       # models/model (after `make repro`)
    python bench/generate_startup.py --model /tmp/m --make # a demo-sized random model made first

Prints (1) the wall time of `rarelm generate PROMPT --greedy --max-tokens 1` (median of
--repeats runs, a new process each, as a user runs it), (2) the same steps timed inside one
process (import torch, import transformers, the model class, tokenizer, weights, first token),
(3) `python -X importtime` of the command summed by top-level package (self time), and which
import pulls in the largest ones. The machine's load average is printed with them: the figures
scale with it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

PROMPT = "The patient was"
PHASES = r"""
import sys, time
t0 = time.perf_counter()
def lap(what): print(f"{time.perf_counter() - t0:6.2f} s  {what}", flush=True)
import torch; lap("import torch")
import transformers; lap("import transformers (lazy: the package only)")
from transformers import AutoModelForCausalLM, AutoTokenizer; lap("AutoModelForCausalLM, AutoTokenizer")
from transformers.models.gpt2 import modeling_gpt2; lap("the GPT-2 model class (modeling_utils)")
tok = AutoTokenizer.from_pretrained(sys.argv[1]); lap("tokenizer loaded")
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval(); lap("weights loaded")
ids = tok(sys.argv[2], return_tensors="pt").input_ids
model.generate(ids, max_new_tokens=1, do_sample=False); lap("first token")
"""


def make_demo_sized(folder: Path) -> None:
    """A random model of the demo's size (params.yaml's model section) with a BPE tokenizer of the
    demo corpus: start-up does not depend on what the weights learned."""
    import gzip

    import torch
    from transformers import GPT2LMHeadModel

    from rarelm.params import load_params
    from rarelm.tokenize.tokenization import EOT, save_hf_tokenizer, train_bpe
    from rarelm.train.model import gpt2_config

    params = load_params("params.yaml")
    with gzip.open("data/raw/demo_en.txt.gz", "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(20_000)]
    tokenizer = train_bpe(iter(lines), vocab_size=params.tokenizer.vocab_size, min_frequency=2)
    save_hf_tokenizer(tokenizer, folder)
    torch.manual_seed(0)
    GPT2LMHeadModel(gpt2_config(params.model, tokenizer.get_vocab_size(),
                                tokenizer.token_to_id(EOT))).save_pretrained(folder)


def wall(model: str, repeats: int) -> list[float]:
    rarelm = shutil.which("rarelm") or "rarelm"
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([rarelm, "generate", PROMPT, "--model", model, "--greedy", "--max-tokens", "1"],
                       check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return times


def import_breakdown(model: str) -> tuple[Counter, list[str]]:
    rarelm = shutil.which("rarelm") or "rarelm"
    err = subprocess.run([sys.executable, "-X", "importtime", rarelm, "generate", PROMPT, "--model", model,
                          "--greedy", "--max-tokens", "1"], check=True, capture_output=True, text=True).stderr
    rows = [m for m in (re.match(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)", line)
                        for line in err.splitlines()) if m]
    by_package = Counter()
    for m in rows:
        by_package[m[4].split(".")[0]] += int(m[1]) / 1e6
    return by_package, [f"{m[4]} {int(m[2]) / 1e6:.2f} s" for m in rows if len(m[3]) == 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/model")
    parser.add_argument("--make", action="store_true", help="make a demo-sized random model at --model first")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = Path(args.model)
    if args.make:
        model.mkdir(parents=True, exist_ok=True)
        make_demo_sized(model)
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    times = wall(str(model), args.repeats)
    print(f"rarelm generate --max-tokens 1: median {statistics.median(times):.2f} s "
          f"({', '.join(f'{t:.2f}' for t in times)})")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(PHASES)
    try:
        print(subprocess.run([sys.executable, f.name, str(model), PROMPT], check=True, capture_output=True,
                             text=True).stdout, end="")
    finally:
        os.unlink(f.name)
    by_package, top = import_breakdown(str(model))
    print(f"imports, self time by package (of {sum(by_package.values()):.2f} s): " +
          ", ".join(f"{name} {t:.2f} s" for name, t in by_package.most_common(8)))
    print("top-level imports, cumulative: " + ", ".join(sorted(top, key=lambda r: -float(r.split()[1]))[:6]))
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
