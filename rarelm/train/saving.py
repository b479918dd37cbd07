"""What a finished run leaves: models/model, metrics/train.json, plots/train.csv, and the same
in its MLflow run; the run's checkpoints are then removed."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging as hf_logging

from rarelm.files import atomic_dir, outputs_together, write_csv, write_json
from rarelm.tracking import export
from rarelm.tracking.datasets import dvc_hashes
from rarelm.tracking.metrics import summary_metrics
from rarelm.train import early_stop, lora, sharding
from rarelm.train.model import build_model
from rarelm.train.replay import replay_rows

CURVE_COLUMNS = ("step", "loss", "ce", "rare_ce", "lr", "grad_norm", "tokens_per_s",
                 "val_ce", "val_rare_ce")


def finish(t) -> dict[str, Any] | None:
    """Write the outputs and log them (rank 0), after the last step; the metrics on rank 0."""
    tp = t.tp
    last = early_stop.last_step(t)  # train.max_steps, or where early stopping ended the run
    t.state.add_session(last, t.session_t0, t.session_step, t.tokens_per_step)
    final_model = _final_model(t)
    metrics = None
    if t.dist.main:
        run = t.run
        run.require()  # logging failed on the way: no outputs; a re-run resumes the last checkpoint
        metrics = {**final_metrics(t.state, tp, final_model, len(t.inputs.train_samples)
                                   * t.params.model.block_size),
                   "steps": last, **early_stop.metrics(t),
                   "state_bytes_per_rank": t.state_bytes, **t.precision.metrics(),
                   "matmul": t.matmul[0], "matmul_reason": t.matmul[1], **t.pinned}
        card = export.model_card(t.params, metrics, dvc_hashes(
            [t.paths.tokenized, t.paths.rare, t.paths.weights]))
        with outputs_together():  # the model, curves and metrics change together or not at all
            save_model(final_model, t.inputs.data, t.paths, run, card, t.params.model.save_dtype)
            write_curves(t.paths.plots, t.state.curves)
            write_json(t.paths.metrics, metrics)
        run.log_metrics(summary_metrics(metrics), step=last)  # the rest: final/train.json
        run.log_json(metrics, "final/train.json")
        run.set_tags({"precision": t.precision.name, "precision_reason": t.precision.reason,
                      "matmul": t.matmul[0], **t.pinned})
        run.log_model(t.paths.model, t.params.tracking)  # a pyfunc (rarelm/serving.py); registered if asked
        t.store.clear()  # finished: a later run with these params starts afresh
    t.dist.barrier()
    return metrics


def _final_model(t):
    """The model to save: under FSDP gathered whole on rank 0 into an unsharded model."""
    if t.tp.strategy != "fsdp":
        return t.raw_model
    full = sharding.full_state_dict(t.raw_model)  # collective: every rank
    if not t.dist.main:
        return t.raw_model
    model = build_model(t.params.model, t.inputs.data)
    model.load_state_dict(full)
    return model


def final_metrics(state, tp, model, epoch_tokens: int) -> dict[str, Any]:
    """metrics/train.json; `state.tokens` trained in all (the world size may have changed on a
    resume), `epoch_tokens` in one pass over the train windows."""
    last = next((r for r in reversed(state.curves) if "loss" in r), {})
    tokens, elapsed, val = state.tokens, state.elapsed, state.val
    # general-text replay rows (rarelm.train.replay) are tokens trained, but no pass over the train split
    domain_tokens = tokens * (tp.batch_size - replay_rows(tp.replay_share, tp.batch_size)) // tp.batch_size
    metrics = {
        "steps": tp.max_steps, "tokens": tokens, "wall_time_s": round(elapsed, 3),
        "tokens_per_s": round(tokens / elapsed, 1) if elapsed > 0 else 0.0,
        "loss": last.get("loss"), "ce": last.get("ce"), "rare_ce": last.get("rare_ce"),
        "val_ce": val.get("val_ce"), "val_rare_ce": val.get("val_rare_ce"),
        "val_ppl": math.exp(val["val_ce"]) if "val_ce" in val else None,
        "epochs": round(domain_tokens / epoch_tokens, 3),  # of the train split
        "parameters": sum(q.numel() for q in model.parameters()),
        "trainable_parameters": lora.trainable_parameters(model),
    }
    # NaN (no rare target seen, no val split) is not JSON: None says "not measured".
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in metrics.items()}


def stored_weights(model, dtype: str) -> dict[str, torch.Tensor] | None:
    """The state dict in the dtype to store (None: as it is), tied weights still one tensor, so
    save_pretrained writes them once.

    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> m = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=16, n_positions=8))
    >>> half = stored_weights(m, "float16")
    >>> half["lm_head.weight"] is half["transformer.wte.weight"], half["lm_head.weight"].dtype
    (True, torch.float16)
    """
    if dtype == "float32":
        return None
    target, converted = getattr(torch, dtype), {}
    out = {}
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point():
            tensor = converted.setdefault(tensor.data_ptr(), tensor.to(target))
        out[name] = tensor
    return out


def write_curves(path: Path, rows: list[dict[str, Any]]) -> None:
    """plots/train.csv: one row per logged step, floats with 6 significant digits, "" where a row
    has no value (no validation at that step)."""
    write_csv(path, CURVE_COLUMNS, rows)


def save_model(model, data, paths, run, card: str = "", dtype: str = "float32") -> None:
    """models/model: save_pretrained (safetensors in `dtype`, config) + the tokenizer + the run file,
    made a complete Hugging Face folder (rarelm/tracking/export.py: context length, generation
    defaults, model card)."""
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar in the stage's log
    with atomic_dir(paths.model) as tmp:
        if lora.is_lora(model):
            model = lora.save_merged(model, tmp)  # + the adapter in tmp/adapter
        model.save_pretrained(tmp, state_dict=stored_weights(model, dtype))
        for path in sorted(data.tokenizer_dir.iterdir()):
            if path.is_file():
                shutil.copy2(path, tmp / path.name)
        export.complete(tmp, card)
        run.save(tmp / "mlflow_run.json")
