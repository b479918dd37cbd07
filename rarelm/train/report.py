"""What a run shows while it trains: a progress bar and log lines on rank 0, rows to MLflow,
and the stage's one-line summary at the end."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from rarelm.fmt import four_decimals
from rarelm.progress import duration, eta

ROW_FORMATS = (("loss", ".4f"), ("ce", ".4f"), ("rare_ce", ".4f"), ("lr", ".2e"),
               ("grad_norm", ".3f"), ("tokens_per_s", ",.0f"), ("val_ce", ".4f"),
               ("val_rare_ce", ".4f"))


def progress_bar(enabled: bool, total: int, completed: int) -> Progress:
    """A rich progress bar (step, loss, tokens/s, ETA) on rank 0's terminal, and log lines."""
    # stderr, so stdout holds only the summary line; soft_wrap: a log line stays one line
    console = Console(stderr=True, soft_wrap=True)
    bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("loss {task.fields[loss]:.3f}"),
                   TextColumn("{task.fields[tok_s]:,.0f} tok/s"), TimeRemainingColumn(),
                   console=console, transient=True,
                   disable=not (enabled and console.is_terminal))  # log lines only in a log
    bar.add_task("train", total=total, completed=completed, loss=float("nan"), tok_s=0.0)
    bar.start()
    return bar


def show(bar: Progress, row: dict[str, Any], max_steps: int, clock: tuple[float, int] | None = None) -> None:
    """A curve row as one log line: `step 50/300 | loss 4.1234 | ... | tokens_per_s 9,876 |
    1 min 35 s, about 8 min 0 s left`; `clock` (perf_counter and step at this session's start)
    gives the time so far and the time left at this session's rate, validations included."""
    parts = [f"step {row['step']}/{max_steps}"]
    for key, fmt in ROW_FORMATS:
        if key in row:
            parts.append(f"{key} {row[key]:{fmt}}")
    if "tokens_per_s" in row:
        bar.update(0, tok_s=row["tokens_per_s"])
    if clock is not None:
        elapsed = time.perf_counter() - clock[0]
        left = eta(elapsed, row["step"] - clock[1], max_steps - clock[1])
        parts.append(duration(elapsed) + (f", {left}" if left else ""))
    bar.console.print(" | ".join(parts))


def start_line(t) -> str:
    """The log line a run starts with: what runs the step. On a CPU `train: precision fp32 (...);
    fp32 products by onednn (...)`; on a GPU its name, the attention kernel and the loss's chunking:
    `train: precision bf16 (pinned) on NVIDIA H200 (CUDA 13.0, torch 2.11.0); attention sdpa;
    fused AdamW; loss from hidden states in chunks of 2,670 tokens`."""
    head = f"train: {t.precision.describe()}"
    if t.device.type != "cuda":
        return f"{head}; fp32 products by {t.matmul[0]} ({t.matmul[1]})"
    import torch

    from rarelm.objectives.linear_ce import chunk_rows

    gpu = (f"{torch.cuda.get_device_name(t.device)} (CUDA {torch.version.cuda}, torch "
           f"{torch.__version__.split('+')[0]})")
    from rarelm.train.model import ATTENTION

    attention = getattr(t.raw_model.config, "_attn_implementation", None) or "default"
    attention = "sdpa" if attention == ATTENTION else attention  # off a CPU it is sdpa itself
    vocab = t.raw_model.get_output_embeddings().weight.size(0)
    loss = (f"loss from hidden states in chunks of {chunk_rows(vocab, 'cuda'):,} tokens" if t.output.chunked
            else "loss from the full logits")
    compiled = "; torch.compile" if t.tp.compile else ""
    return f"{head} on {gpu}; attention {attention}; fused AdamW; {loss}{compiled}"


def step_metrics(row: dict[str, Any]) -> dict[str, float]:
    """A curve row's MLflow metrics: `train/<key>`, and `val/<key>` for the val_* keys.

    >>> step_metrics({"step": 5, "loss": 2.0, "val_ce": 3.0})
    {'train/loss': 2.0, 'val/ce': 3.0}
    """
    return ({f"train/{k}": v for k, v in row.items() if k != "step" and not k.startswith("val")}
            | {f"val/{k[4:]}": v for k, v in row.items() if k.startswith("val_")})


def report(t, bar: Progress, row: dict[str, Any], done: int, clock: tuple[float, int] | None = None) -> None:
    """Rank 0: a new curve row into the run's state, MLflow and the log; the bar to `done`."""
    if row and t.dist.main:
        t.state.curves.append(row)
        if t.upstream:  # counts and settings of the earlier stages: an artifact
            t.run.log_json(t.upstream, "upstream.json")
            t.upstream = {}
        t.run.log_metrics(step_metrics(row), step=done)
        show(bar, row, t.tp.max_steps, clock)
    bar.update(0, completed=done)


def summary(metrics: dict[str, Any], paths) -> str:
    """The stage's one-line summary."""
    def f(key: str) -> str:
        return four_decimals(metrics.get(key))

    return (f"train: {metrics['steps']} steps, {metrics['tokens']:,} tokens "
            f"({metrics['epochs']:g} epochs), loss {f('loss')}, val ce {f('val_ce')} "
            f"(rare {f('val_rare_ce')}), {metrics['tokens_per_s']:,.0f} tokens/s "
            f"({_precision(metrics)}), "
            f"{metrics['wall_time_s']:.0f} s -> {paths.model}")


def _precision(metrics: dict[str, Any]) -> str:
    """`fp32: no native bf16`: the precision trained in, and why.

    >>> _precision({"precision": "bf16", "precision_reason": "probe: bf16 faster"})
    'bf16: probe: bf16 faster'
    """
    reason = metrics.get("precision_reason")
    return metrics.get("precision", "fp32") + (f": {reason}" if reason else "")
