"""The forgetting guard on both kinds of general text: `ppl_general_model` (the model alone, no
decode-time mixing) of base/model and of its fine-tunes, on the base pipeline's own held-out text
(data/general/<language>.txt, from its pretraining family) and on text from outside that family
(data/general/<language>.outside.txt, fortune files; data/general/README.md).

Scored as the evaluate stage scores `eval.general_text` (rarelm/evaluate/stage.py `_general`:
rarelm.evaluate.general_text.general_metrics, the model's own context as the window, the repo's
params.yaml eval section: batch size, block size, max_tokens), with base/model's tokenizer, which
the fine-tunes keep. Run from the repo root:

    .venv/bin/python bench/general_text_outside.py \
        --en .cache/run-plan/train-fb4f3d6125fb/model [--en ...] [--zh <a Chinese fine-tune>]

Prints one JSON line: per language and text, base/model's perplexity, each fine-tune's and its
change against the base (fine-tune / base - 1), tokens scored, seconds; the CPU's model name.
A language without a fine-tune still gets base/model's figures.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import harness

TEXTS = {"en": ("data/general/en.txt", "data/general/en.outside.txt"),
         "zh": ("data/general/zh.txt", "data/general/zh.outside.txt")}


def cpu_model() -> str:
    """The first `model name` of /proc/cpuinfo ("" where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")


def score(model_dir: Path, tokenizer, eot_id: int, vocab: int, texts: tuple[str, ...]) -> dict:
    """{text: {"ppl", "tokens", "seconds"}} for one model, as evaluate scores eval.general_text."""
    from rarelm.artifacts.tokenized import lead_ids
    from rarelm.evaluate.common import EvalContext
    from rarelm.evaluate.decoding import context_length
    from rarelm.evaluate.general_text import general_metrics
    from rarelm.evaluate.model_folder import load_causal_lm
    from rarelm.evaluate.prefix import leading, window
    from rarelm.params import load_params

    params = load_params("params.yaml")
    model = load_causal_lm(model_dir, params.eval.device)
    ctx = EvalContext(model, tokenizer, eot_id, params.eval, params.seed)
    block = window(params.eval.block_size, context_length(model))
    out = {}
    with leading(lead_ids(tokenizer)):
        for text in texts:
            seconds, m = harness.timed(lambda text=text: general_metrics(ctx, text, vocab, block))
            out[text] = {"ppl": round(m["ppl_general"], 2), "tokens": m["n_general_tokens"],
                         "seconds": round(seconds, 1)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, default=Path("base/model"))
    parser.add_argument("--en", type=Path, action="append", default=[],
                        help="a fine-tune of --base on an English corpus (repeatable)")
    parser.add_argument("--zh", type=Path, action="append", default=[],
                        help="a fine-tune of --base on a Chinese corpus (repeatable)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (eval.threads' default: 1)")
    args = parser.parse_args()

    import torch

    from rarelm.tokenize.tokenization import load_pretrained

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:  # the tokenize stage's reading of base/model's tokenizer
        tokenizer, eot_id, vocab, _ = load_pretrained(str(args.base), Path(tmp))
    result = {"cpu": cpu_model(), "threads": args.threads, "base": str(args.base)}
    for language, texts in TEXTS.items():
        started = time.perf_counter()
        base = score(args.base, tokenizer, eot_id, vocab, texts)
        entry = {"base": base, "finetunes": []}
        for finetune in getattr(args, language):
            if (finetune / "tokenizer.json").read_bytes() != (args.base / "tokenizer.json").read_bytes():
                raise SystemExit(f"{finetune}: not base/model's tokenizer")
            tuned = score(finetune, tokenizer, eot_id, vocab, texts)
            entry["finetunes"].append({"model": str(finetune), **tuned, "change": {
                t: round(tuned[t]["ppl"] / base[t]["ppl"] - 1, 4) for t in texts}})
        entry["seconds"] = round(time.perf_counter() - started, 1)
        result[language] = entry
    harness.print_json(result)


if __name__ == "__main__":
    main()
