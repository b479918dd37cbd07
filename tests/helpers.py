"""Plain builders and data that several test files share (fixtures: tests/conftest.py): the synthetic
evaluate rows, tiny texts and models, greedy decoding by hand, params overrides and tiny training
runs that crash and resume."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

# The evaluate stage's per-occurrence rows for a synthetic model: 40 terms, 1-5 occurrences each, a
# term's occurrences strongly correlated (one latent skill per term), better with `alpha`, other
# outcomes with another `seed`. The same text runs as the DVC stage of the test repos of
# tests/test_compare.py and (its functions) tests/test_headline.py.
GENERATOR = '''
import json, math, sys
import numpy as np
import yaml


def occurrence_rows(seed, alpha, n_terms=40):
    rows = []
    for t in range(n_terms):
        count = round(2 ** (t / 4)) - 1
        k = count.bit_length()
        band = str(count) if count <= 1 else f"{2 ** (k - 1)}-{2 ** k - 1}"
        term_skill = np.random.default_rng([seed, t]).random()
        for k in range(1 + (7 * t) % 5):
            noise = np.random.default_rng([seed, t, k, 1]).random()
            logit = math.log2(count + 1) - 3.5 + 3 * alpha + 4 * (term_skill - 0.5) + (noise - 0.5)
            p = 1 / (1 + math.exp(-logit))
            hit = bool(np.random.default_rng([seed, t, k, 2]).random() < p)
            rows.append({"split": "test", "term": f"term {t:02d}", "train_count": count, "band": band,
                         "mention": "first" if k == 0 else "repeat", "doc": t % 9,
                         "char_start": 100 * t + 17 * k,
                         "prompt_tokens": 64, "expected": f" term {t:02d}",
                         "output": f" term {t:02d}" if hit else " something else",
                         "exact_match": hit, "exact_match_ci": hit, "first_token_hit": hit or noise < 0.3,
                         "completion_match": hit or noise < 0.5,
                         "prefix_share": 1.0 if hit else 0.4 if noise < 0.5 else 0.0,
                         "nll": round(0.2 + 3 * (1 - p), 4), "nll_sum": round(0.4 + 6 * (1 - p), 4),
                         "nll_per_char": round((0.4 + 6 * (1 - p)) / 8, 4),
                         "token_acc": 1.0 if hit else 0.5 if noise < 0.5 else 0.0,
                         "first_token_rr": 1.0 if hit or noise < 0.3 else 1 / (2 + t % 5),
                         "choice_rank": 1 if hit or noise < 0.2 else 2 + t,
                         "n_choices": n_terms})
    return rows


def summary(seed, alpha):
    return {"ppl": 1.9 - 0.1 * alpha, "ppl_frequent": 1.25 + 0.01 * alpha, "ppl_medium": 6.7,
            "ppl_rare": 38.0 - 5 * alpha + seed % 3, "term_exact_match": 0.5,
            "false_insertion_rate": 1.0 + 0.1 * alpha + 0.01 * (seed % 3)}


if __name__ == "__main__":
    params = yaml.safe_load(open("params.yaml"))
    rows = occurrence_rows(params["seed"], params["alpha"])
    with open("metrics/eval_occurrences.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\\n" for r in rows)
    with open("metrics/eval.json", "w") as f:
        json.dump(summary(params["seed"], params["alpha"]), f)
'''
GEN: dict = {}  # GENERATOR's functions, here: GEN["occurrence_rows"](seed, alpha), GEN["summary"](...)
exec(GENERATOR, GEN)  # noqa: S102 - the test's own source text

# The outputs of the synthetic evaluate stage in a test repo's dvc.yaml (GENERATOR writes them).
EVALUATE_OUTPUTS = """    outs:
      - metrics/eval_occurrences.jsonl:
          cache: false
    metrics:
      - metrics/eval.json:
          cache: false
"""


def overridden(params: dict, overrides: Iterable[str]) -> dict:
    """A copy of `params` (a params.yaml read) with `dvc exp run -S` overrides `a.b=value` applied;
    an override of a key params.yaml does not have fails, as DVC refuses it."""
    params = copy.deepcopy(params)
    for item in overrides:
        key, value = item.split("=", 1)
        *parents, leaf = key.split(".")
        node = params
        for part in parents:
            node = node[part]
        assert leaf in node, key
        node[leaf] = yaml.safe_load(value)
    return params


def write_prepared(folder: Path, docs: dict[str, list[str]], stats: bool = False) -> Path:
    """The prepare stage's output in `folder` (made if missing): `{split}.jsonl` of `docs`' documents per
    split, and with `stats` its stats.json of the document counts."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, texts in docs.items():
        (folder / f"{split}.jsonl").write_text(
            "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in texts), encoding="utf-8")
    if stats:
        (folder / "stats.json").write_text(json.dumps({s: {"documents": len(d)} for s, d in docs.items()}))
    return folder


# --------------------------------------------------------------------------- text and decoding

TEXTS = ["the patient presented with acute myocardial infarction and chest pain",
         "a rare case of idiopathic pneumomyositis treated with heparin",
         "the nodular lesion was removed and the patient recovered"] * 20


def argmax_loop(model, ids: list[int], n: int, eos: int | None, bias=None) -> list[int]:
    """Greedy decoding the slow, obvious way: full forward per token, no cache; `bias` added to the logits."""
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids + out])).logits[0, -1]
            nxt = int(logits.argmax() if bias is None else (logits + bias).argmax())
            out.append(nxt)
            if nxt == eos:
                break
    return out


def candidates(language: str, text: str, n_max: int = 4) -> list[str]:
    """The candidate terms of one text, as shown."""
    from rarelm.rare_terms.segmentation import Segmenter

    seg = Segmenter(language)
    return [seg.display(key) for key in seg.candidate_analyzer(n_max)(text)]


# --------------------------------------------------------------------------- a few training steps by hand

VOCAB, BLOCK = 97, 16  # tiny_gpt2's vocabulary and context


def tiny_gpt2(seed: int = 0, **config):
    """A 2-layer GPT-2 of width 32 without dropout, its weights drawn from `seed`."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB,
                                      n_positions=BLOCK, bos_token_id=0, eos_token_id=0,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **config))


def objective_of(is_rare: torch.Tensor, index=None, *, is_frequent: torch.Tensor | None = None,
                 counts=None, **loss):
    """The training objective of LossParams(**loss) over the rare bucket `is_rare` (bool [V]),
    the frequent bucket `is_frequent` (default: none) and the train `counts`, with term `index`."""
    from rarelm.objectives.objective import Objective
    from rarelm.objectives.remedy import Context
    from rarelm.params import LossParams

    frequent = torch.zeros_like(is_rare) if is_frequent is None else is_frequent
    return Objective(LossParams(**loss), Context(is_rare, frequent, counts), index)


def adamw_steps(model, output, dtype=None, steps: int = 5, windows: int = 4, counts=None,
                **loss) -> dict[str, torch.Tensor]:
    """`steps` AdamW steps (lr 1e-3) of `model` through `output` (rarelm.train.output) on `windows`
    fixed random windows a step, as rarelm.train.step runs one: under bf16 autocast where `dtype` is
    set; the objective of LossParams(**loss) with every 4th token rare. Returns the weights."""
    objective = objective_of(torch.arange(VOCAB) % 4 == 0, counts=counts, **loss)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    model.train()
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (windows, BLOCK + 1), generator=g)
        x, y = ids[:, :-1], ids[:, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None), \
                output.hidden_states():
            scores = output.scores(model(input_ids=x, use_cache=False).logits, dtype)
        loss_value, _ = objective(scores, y, np.zeros(windows, dtype=np.int64), x)
        loss_value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def distance(a: dict, b: dict) -> float:
    """L2 distance between two state dicts, over the tensors of `a` (a saved model)."""
    return math.sqrt(sum(((a[k] - b[k]).double() ** 2).sum().item() for k in a))


# --------------------------------------------------------------------------- tiny training runs

def untracked_params(root: Path, monkeypatch):
    """The params of a trained copy, run in it with no MLflow store needed (tracking not required)."""
    from rarelm.params import load_params

    monkeypatch.chdir(root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    base = load_params(root / "params.yaml")
    return dataclasses.replace(base, tracking=dataclasses.replace(base.tracking, required=False))


def run_paths(folder: Path, name: str):
    """A training run's outputs in `folder`, all named after the run: the model, its metrics, its
    curves and its checkpoint cache."""
    from rarelm.train import loop

    return loop.Paths(model=folder / name, metrics=folder / f"{name}.json",
                      plots=folder / f"{name}.csv", cache=folder / f"cache-{name}")


def crash_at(step: int, params, paths, monkeypatch, message: str = "crash") -> None:
    """Train `params` into `paths` until the loop fails at `step` (RuntimeError(message) as it asks
    for that step's learning rate), leaving the run's checkpoints behind."""
    from rarelm.train import loop

    real_lr_at = loop.lr_at

    def crash(at, tp):
        if at == step:
            raise RuntimeError(message)
        return real_lr_at(at, tp)

    monkeypatch.setattr(loop, "lr_at", crash)
    with pytest.raises(RuntimeError, match=message):
        loop.train(params, paths, progress=False)
    monkeypatch.setattr(loop, "lr_at", real_lr_at)


def whole_then_crashed_and_resumed(params, tmp_path: Path, monkeypatch, crash_step: int) -> None:
    """Train `params` uninterrupted into tmp_path/whole*, then into tmp_path/resumed*: crashed
    at `crash_step` (an exception from the loop) and started again, resuming from its checkpoint."""
    from rarelm.train import loop

    loop.train(params, run_paths(tmp_path, "whole"), progress=False)
    crash_at(crash_step, params, run_paths(tmp_path, "resumed"), monkeypatch)
    assert (tmp_path / "cache-resumed").exists()
    loop.train(params, run_paths(tmp_path, "resumed"), progress=False)
