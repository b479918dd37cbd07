"""Reading the `weights` stage's output: data/weights/weights.npy, one weight per training window."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rarelm.errors import RarelmError
from rarelm.files import load_array


def load_weights(path: str | Path, n_samples: int) -> np.ndarray:
    """data/weights/weights.npy (float64 [n_samples], finite, > 0), checked against the samples."""
    w = load_array(path, np.float64, n_samples, "weights",
                   "(one weight per training sample); it does not match the tokenized data")
    if not (np.isfinite(w).all() and (w > 0).all()):
        raise RarelmError(f"{path}: holds a weight that is not finite and > 0; re-run weights")
    return w
