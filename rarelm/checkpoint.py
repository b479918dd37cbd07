"""Crash-safe training checkpoints, keyed by what the run depends on.

A run's checkpoints live in `<cache>/<key>/`, where the key hashes the stage's
params and the content of its input files, so a changed param or new data never
resumes the wrong run. The folder sits outside the stage's DVC outputs, since
DVC deletes those before it runs a stage. One checkpoint is a folder:

    .cache/train/3f2a9c0e1b7d4a65/step-00000100/
        model.safetensors    the model's weights (safetensors, tied weights handled)
        state.pt             step, optimizer, grad scaler, every rank's RNG and
                             sampler position, curves so far (torch.load weights_only)
        manifest.json        sha256 of both files; written last

It is written under a temporary name and renamed into place, and verified
against its manifest on load; a corrupt or partial one is skipped with a
warning and the one before it used. The last `keep` checkpoints are kept.

    store = CheckpointStore(".cache/train", run_key({"lr": 1e-3}, ["data/x.npy"]))
    store.save(7, model, {"step": 7})
    path = store.latest_valid()                     # .../step-00000007, or None
    state = store.load(path, model)                 # weights into model; {"step": 7}
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
FILES = ("model.safetensors", "state.pt")


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def run_key(config: Any, files: list[str | Path]) -> str:
    """16 hex digits of sha256 over a JSON-able config and the files' names and content.

    >>> run_key({"lr": 0.001}, []) == run_key({"lr": 0.001}, [])
    True
    """
    h = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    for path in files:
        h.update(str(Path(path).name).encode())
        h.update(sha256_file(path).encode())
    return h.hexdigest()[:16]


class CheckpointStore:
    """The checkpoints of one run (one key) under `root/key/`."""

    def __init__(self, root: str | Path, key: str, keep: int = 2, stage: str = "train"):
        self.dir = Path(root) / key
        self.keep = keep
        self.stage = stage

    def _steps(self) -> list[tuple[int, Path]]:
        if not self.dir.is_dir():
            return []
        found = []
        for path in self.dir.glob("step-*"):
            try:
                found.append((int(path.name.removeprefix("step-")), path))
            except ValueError:
                continue  # a temporary folder of a checkpoint being written
        return sorted(found)

    def save(self, step: int, model, state: dict[str, Any]) -> Path:
        """Write checkpoint `step` atomically; drop all but the last `keep`."""
        import torch
        from safetensors.torch import save_model

        final = self.dir / f"step-{step:08d}"
        tmp = self.dir / f".step-{step:08d}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            save_model(model, str(tmp / FILES[0]))
            torch.save(state, tmp / FILES[1])
            manifest = {"step": step, "sha256": {name: sha256_file(tmp / name) for name in FILES}}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
            for name in (*FILES, MANIFEST):  # on disk before the rename makes it visible
                with open(tmp / name, "rb") as f:
                    os.fsync(f.fileno())
        except BaseException:  # e.g. a full disk: give the space of the partial one back
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        _fsync_dir(self.dir)
        for _, old in self._steps()[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def verify(self, path: Path) -> str | None:
        """None if the checkpoint at `path` is complete and intact, else why not."""
        try:
            manifest = json.loads((path / MANIFEST).read_text())
            for name in FILES:
                if sha256_file(path / name) != manifest["sha256"][name]:
                    return f"{name} does not match its checksum"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def latest_valid(self) -> Path | None:
        """The newest intact checkpoint; corrupt ones are reported and skipped."""
        for _, path in reversed(self._steps()):
            problem = self.verify(path)
            if problem is None:
                return path
            print(f"rarelm {self.stage}: warning: skipping corrupt checkpoint {path} ({problem})",
                  file=sys.stderr, flush=True)
        return None

    def load_state(self, path: Path) -> dict[str, Any]:
        """The state dict saved in checkpoint `path` (plain data and tensors only)."""
        import torch

        return torch.load(path / FILES[1], weights_only=True, map_location="cpu")

    def load_weights(self, path: Path, model) -> None:
        """Load checkpoint `path`'s weights into `model` (strict: every tensor must match)."""
        from safetensors.torch import load_model

        load_model(model, str(path / FILES[0]))

    def load(self, path: Path, model) -> dict[str, Any]:
        """Both: weights into `model`, and the state dict returned."""
        self.load_weights(path, model)
        return self.load_state(path)

    def clear(self) -> None:
        """Remove this run's checkpoints (after the run has finished)."""
        shutil.rmtree(self.dir, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
