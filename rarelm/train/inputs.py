"""What the train stage reads (the DAG's paths), checked, and the key its checkpoints are filed by."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from rarelm import paths
from rarelm.artifacts.buckets import load_buckets, load_counts
from rarelm.artifacts.term_index import TermIndex
from rarelm.artifacts.tokenized import Samples, TokenizedData, lead_ids, load_tokenizer
from rarelm.artifacts.weights import load_weights
from rarelm.errors import RarelmError
from rarelm.files import load_array
from rarelm.objectives.objective import needs_counts
from rarelm.params import Params
from rarelm.tracking.run import check_tensorboard
from rarelm.train import checkpoint
from rarelm.train.model import fingerprint_files
from rarelm.train.replay import replay_tokens


@dataclasses.dataclass(frozen=True)
class Paths:
    """Where the stage reads and writes (the defaults are the DAG's layout)."""

    tokenized: Path = Path(paths.TOKENIZED)
    rare: Path = Path(paths.RARE)
    weights: Path = Path(paths.WEIGHTS)
    model: Path = Path(paths.MODEL)
    metrics: Path = Path(paths.TRAIN_METRICS)
    plots: Path = Path(paths.TRAIN_PLOT)
    metrics_dir: Path = Path(paths.METRICS)  # upstream stages' metrics, logged to MLflow
    cache: Path = Path(paths.TRAIN_CACHE)  # checkpoints, outside DVC's outputs


class Inputs(NamedTuple):
    """The stage's inputs, checked against each other (`load_inputs`)."""

    data: TokenizedData
    train_samples: Samples
    val_samples: Samples
    weights: np.ndarray  # one sampling weight per train window
    scores: np.ndarray | None  # log scores, where weights.schedule varies alpha
    buckets: np.ndarray
    term_index: TermIndex | None  # where loss.targets weighs term tokens
    counts: np.ndarray | None  # train token counts, where a loss.* objective reads them
    replay: np.ndarray | None = None  # train.replay_text's tokens, where train.replay_share > 0
    lead: tuple[int, ...] = ()  # read before every window: the tokenizer's lead (Gemma 3's <bos>), or none


def input_files(where: Paths, params: Params) -> list[Path]:
    """Every file the run reads: its checkpoint key hashes their content."""
    tokenizer = sorted(p for p in (where.tokenized / "tokenizer").glob("*") if p.is_file())
    scores = [where.weights / "scores.npy"] if params.weights.schedule != "constant" else []
    terms = [where.rare / "term_index.npy"] if params.loss.targets != "rare_bucket" else []
    counts = [where.rare / "counts.npy"] if needs_counts(params.loss) else []
    replay = [Path(params.train.replay_text)] if params.train.replay_share else []
    return [where.tokenized / "meta.json", where.tokenized / "train.tokens",
            where.tokenized / "val.tokens", *tokenizer, where.rare / "buckets.npy",
            where.weights / "weights.npy", *scores, *terms, *counts, *replay]


def load_inputs(params: Params, where: Paths) -> Inputs:
    """The stage's inputs, all checked.

    The log scores (data/weights/scores.npy) are read only where `weights.schedule`
    varies alpha, which recomputes the weights from them each epoch; the term index
    (data/rare/term_index.npy) only where `loss.targets` weighs term tokens; the counts
    (data/rare/counts.npy) only where a `loss.*` objective reads them; else None.
    """
    check_tensorboard(params.tracking)  # before any worker starts
    data = TokenizedData.open(where.tokenized)
    block = params.model.block_size
    train_samples = Samples(data.tokens("train"), block)
    val_samples = Samples(data.tokens("val"), block)
    if len(train_samples) == 0:
        raise RarelmError(f"{where.tokenized}: the train split has fewer than "
                          f"model.block_size + 1 = {block + 1} tokens")
    buckets = load_buckets(where.rare, data.vocab_size)
    weights = load_weights(where.weights / "weights.npy", len(train_samples))
    scores = None
    if params.weights.schedule != "constant":
        scores = load_array(where.weights / "scores.npy", np.float64, len(train_samples), "weights",
                            "(one log score per training sample); it does not match the tokenized data")
    term_index = TermIndex.open(where.rare, data) if params.loss.targets != "rare_bucket" else None
    counts = load_counts(where.rare, data.vocab_size) if needs_counts(params.loss) else None
    # checked against the vocabulary only where it encodes text (replay); its lead needs no check
    tokenizer = load_tokenizer(data.tokenizer_dir, data.vocab_size if params.train.replay_share else None)
    replay = None
    if params.train.replay_share:  # general-text replay (rarelm.train.replay), tokenized as the run's text
        replay = replay_tokens(params.train.replay_text, tokenizer, data.eot_id, block)
    lead = tuple(lead_ids(tokenizer))  # Gemma 3's <bos>; GPT-2's: none
    return Inputs(data, train_samples, val_samples, weights, scores, buckets, term_index, counts, replay,
                  lead)


def checkpoint_key(params: Params, where: Paths, pinned: dict[str, str]) -> str:
    """The run's checkpoint key: the params the stage reads, the hub commits it starts from
    (`pinned`), and the content of its input files. Not keyed by the number of processes: a
    run can go on at another world size (DCP reshards)."""
    launch = ("nproc", "max_restarts")
    if not params.train.replay_share:  # replay off: the same key as before replay existed
        launch += ("replay_share", "replay_text")
    stage_params: dict[str, Any] = {
        "seed": params.seed, "model": dataclasses.asdict(params.model),
        "train": {k: v for k, v in dataclasses.asdict(params.train).items() if k not in launch},
        "loss": dataclasses.asdict(params.loss), "alpha": params.alpha,
        "weights": {"schedule": params.weights.schedule, "clip_ratio": params.weights.clip_ratio,
                    "shift_windows": params.weights.shift_windows}}
    return checkpoint.run_key(stage_params | pinned,
                              input_files(where, params) + fingerprint_files(params.model))
