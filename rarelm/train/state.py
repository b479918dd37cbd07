"""What a run carries from step to step and across a resume: `RunState`, the RNGs, each rank's part.

A checkpoint's state.pt is `RunState.as_dict()` (the keys step, curves, elapsed, tokens,
run_id, val) plus the grad scaler and every rank's `rank_state` (sampler position,
RNG states, objective state, log window); checkpoints written before `RunState`
existed hold the same keys and load the same way.

    >>> RunState.from_dict({"step": 4, "curves": [], "elapsed": 1.5, "tokens": 512,
    ...                     "run_id": None, "val": {}, "world_size": 2}).step
    4
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from typing import Any

import numpy as np
import torch


@dataclasses.dataclass
class RunState:
    """Rank 0's account of the run so far, saved in every checkpoint."""

    step: int = 0  # optimizer steps done
    curves: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # plots/train.csv's rows
    elapsed: float = 0.0  # seconds of training before this session
    tokens: int = 0  # tokens trained before this session
    run_id: str | None = None  # the MLflow run, which a resumed run goes on logging into
    val: dict[str, float] = dataclasses.field(default_factory=dict)  # the last validation losses
    # the lowest val_ce so far and early stopping's account (rarelm.train.early_stop.Best as a dict)
    best: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> RunState:
        """The state in a checkpoint's state dict (its other keys are left alone; `best` may be absent)."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{name: saved[name] for name in names if name in saved or name != "best"})

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def add_session(self, done: int, session_t0: float, session_step: int,
                    tokens_per_step: int) -> None:
        """Count this session's steps session_step..done and the time since `session_t0`."""
        self.elapsed = self.elapsed + time.perf_counter() - session_t0
        self.tokens = self.tokens + (done - session_step) * tokens_per_step


def rng_state() -> dict[str, Any]:
    """This process's RNG states (torch, CUDA, numpy, python) as weights_only-loadable values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rank_state(stream, objective, log_window: dict[str, Any]) -> dict[str, Any]:
    """This rank's part of a checkpoint: sampler position, RNGs, objective, curve sums."""
    return {"stream": stream.state(), "rng": rng_state(), "objective": objective.state(),
            "log_window": log_window}


def resume_ranks(ranks: list[dict[str, Any]], saved_world: int, step: int, seed: int, dist,
                 stream, objective) -> dict[str, Any] | None:
    """Put this rank's sampler position, RNG and objective state back from a checkpoint; returns
    its log window (`Meter.state`), or None.

    At the world size it was written at, exactly (bit-identical resume). At another one
    (FSDP or DDP: DCP has already resharded the model and optimizer), approximately, with a
    warning: the epoch is kept and the position scaled so that as many windows have been
    drawn over all ranks; the ranks' RNGs are seeded afresh from (seed, step, rank); the
    objective's state (FACE counts, AGG memory) is taken from rank `rank % saved ranks`, and
    the steps since the last curve row are not counted in the next one.
    """
    if saved_world == dist.world_size:
        mine = ranks[dist.rank]
        stream.restore(mine["stream"])
        set_rng_state(mine["rng"])
        objective.load_state(mine.get("objective"))
        return mine.get("log_window")
    if dist.main:
        print(f"rarelm train: warning: resuming a checkpoint written by {saved_world} processes "
              f"with {dist.world_size}: the model and optimizer are resharded exactly, but the "
              "sample order and random state are not, so the result is not bit-identical to an "
              "uninterrupted run", file=sys.stderr, flush=True)
    stream.restore(_rescaled(ranks[0]["stream"], saved_world, dist.world_size))
    seed_everything(seed * 1000 + dist.rank + 7919 * step)
    objective.load_state(ranks[dist.rank % saved_world].get("objective"))
    return None


def _rescaled(stream: dict[str, Any], saved_world: int, world_size: int) -> dict[str, Any]:
    """A stream state at another world size: the epoch kept, the position scaled (and so the
    general-text replay stream's, where the state holds one under "replay").

    >>> _rescaled({"epoch": 1, "position": 6, "replay": {"epoch": 0, "position": 2}}, 2, 4)
    {'epoch': 1, 'position': 3, 'replay': {'epoch': 0, 'position': 1}}
    """
    out = {"epoch": stream["epoch"], "position": stream["position"] * saved_world // world_size}
    if "replay" in stream:
        out["replay"] = _rescaled(stream["replay"], saved_world, world_size)
    return out
