"""Crash-safe sharded training checkpoints, keyed by what the run depends on.

A run's checkpoints live in `<cache>/<key>/`, where the key hashes the stage's
params and the content of its input files, so a changed param or new data never
resumes the wrong run. The folder sits outside the stage's DVC outputs, since
DVC deletes those before it runs a stage. One checkpoint is a folder:

    .cache/train/3f2a9c0e1b7d4a65/step-00000100/
        dcp/                 model + optimizer (torch.distributed.checkpoint): each rank
                             writes its own shard (`__<rank>_0.distcp`) and rank 0 the
                             `.metadata` index; a replicated (DDP) tensor is written once
        state.pt             step, grad scaler, every rank's RNG, sampler position and
                             objective state, curves so far (torch.load weights_only)
        manifest.json        sha256 of every file above and the world size, signed with an
                             HMAC (see below); written last

Every rank writes into a temporary folder; rank 0 then writes state.pt and the
manifest and renames the folder into place, so a checkpoint is visible whole or not
at all (multi-node runs need the cache folder on a shared file system). On load
rank 0 verifies every file against the manifest; a corrupt or partial checkpoint
is skipped with a warning and the one before it used. The last `keep` are kept.

Loading a DCP checkpoint unpickles (`dcp/.metadata`, and non-tensor values in the
shards), so a checkpoint is code. Only checkpoints that this cache's own runs wrote
are read: the manifest carries an HMAC-SHA256 under a secret key, `<cache>/.signing-key`
(32 random bytes, created 0600 at first use, outside every checkpoint folder; one that
is not the user's own file or that others can read is refused). A planted or edited
checkpoint (a manifest whose sums an attacker recomputed, or an unsigned one) fails
the check and is skipped with the same warning as a corrupt one, before anything in
it is read (docs/reliability.md, "Checkpoints", says what this covers and what not):

    >>> sign(b"k" * 32, {"step": 7}) == sign(b"k" * 32, {"step": 7}) != sign(b"x" * 32, {"step": 7})
    True

The same format serves both `train.strategy` values: DCP loads each rank's part of
a tensor whatever the sharding it was saved with, so a run can resume at another
world size (see `rarelm.train.state.resume_ranks`). With LoRA only the trainable (adapter) weights and
their optimizer state are saved; the frozen base model comes from its own files.

    store = CheckpointStore(".cache/train", run_key({"lr": 1e-3}, ["data/x.npy"]))
    store.save(7, model, optimizer, {"step": 7}, dist)    # on every rank
    path = store.latest_valid()                            # .../step-00000007, or None
    state = store.load_state(path)                         # {"step": 7, ...}
    store.load_weights(path, model, optimizer)             # on every rank
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import shutil
import stat
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from rarelm.errors import RarelmError, disk_error
from rarelm.files import kind_of, sha256_file

MANIFEST = "manifest.json"
STATE = "state.pt"
DCP = "dcp"
KEY_FILE = ".signing-key"
KEY_BYTES = 32


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


def sign(secret: bytes, manifest: dict[str, Any]) -> str:
    """HMAC-SHA256 (hex) of a manifest's canonical JSON (its own "hmac" entry left out)."""
    body = {k: v for k, v in manifest.items() if k != "hmac"}
    message = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def signing_key(root: str | Path) -> bytes:
    """The cache's secret key `root/.signing-key`, created (0600) at first use.

    Refused (a RarelmError) if it is a link, not the user's own, or readable by others:
    whoever can read or plant the key can sign a checkpoint that runs code here.
    """
    path = Path(root) / KEY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() and not path.is_symlink():
        _create_key(path)
    try:  # O_NONBLOCK: a named pipe planted there opens at once (and is refused below), no hang
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise RarelmError(f"checkpoint key {path}: cannot be read ({exc.strerror}); "
                          "remove it to start afresh") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # checked before any read (fdopen of a folder fails too)
        os.close(fd)
        raise RarelmError(
            f"checkpoint key {path}: is a {kind_of(info.st_mode)}, not a file; remove it (the "
            "checkpoints beside it are then not resumed)")
    with os.fdopen(fd, "rb") as f:
        secret = f.read(KEY_BYTES + 1)
    if info.st_uid != os.getuid() or info.st_mode & 0o077 or len(secret) != KEY_BYTES:
        raise RarelmError(
            f"checkpoint key {path}: must be a {KEY_BYTES}-byte file of your own with mode 0600 "
            f"(it is uid {info.st_uid}, mode {info.st_mode & 0o777:o}, {len(secret)} bytes); "
            f"remove it (the checkpoints beside it are then not resumed)")
    return secret


def _create_key(path: Path) -> None:
    """Write a new random key under a temporary name, then link it into place: another
    process creating it at the same time leaves one whole key, never a partial one."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):  # the other process's key stands
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class CheckpointStore:
    """The checkpoints of one run (one key) under `root/key/`, signed with `root/.signing-key`."""

    def __init__(self, root: str | Path, key: str, keep: int = 2, stage: str = "train"):
        self.root = Path(root)
        self.dir = self.root / key
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

    def save(self, step: int, model, optimizer, state: dict[str, Any], dist) -> Path:
        """Write checkpoint `step` atomically; drop all but the last `keep`. Every rank calls it.

        `dist` is the job (rarelm.train.dist.Dist: `main`, `world_size`, `barrier`); `state` is
        what rank 0 saves beside the weights (plain data and tensors).
        """

        final = self.dir / f"step-{step:08d}"
        tmp = self.dir / f".step-{step:08d}.tmp"
        if dist.main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        try:
            with _one_process_is_fine(), _os_errors_as_such():
                dcp.save(_state_dicts(model, optimizer), checkpoint_id=tmp / DCP)
            if dist.main:
                torch.save(state, tmp / STATE)
                files = sorted(p for p in tmp.rglob("*") if p.is_file())
                for path in files:  # on disk before the rename makes them visible
                    with open(path, "rb") as f:
                        os.fsync(f.fileno())
                manifest = {"step": step, "world_size": dist.world_size,
                            "sha256": {p.relative_to(tmp).as_posix(): sha256_file(p) for p in files}}
                manifest["hmac"] = sign(signing_key(self.root), manifest)
                (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
                with open(tmp / MANIFEST, "rb") as f:
                    os.fsync(f.fileno())
        except BaseException:  # e.g. a full disk: give the space of the partial one back
            if dist.main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        if dist.main:
            shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
            _fsync_dir(self.dir)
            for _, old in self._steps()[:-self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        dist.barrier()  # nobody runs ahead of a checkpoint that may be needed
        return final

    def verify(self, path: Path) -> str | None:
        """None if the checkpoint at `path` is complete, intact and signed by this cache's
        key, else why not. Reads nothing but the manifest and the files' bytes."""
        try:
            manifest = json.loads((path / MANIFEST).read_text())
            if not isinstance(manifest, dict) or "hmac" not in manifest:
                return "its manifest is not signed (not written by a run of this cache)"
            if not hmac.compare_digest(str(manifest["hmac"]), sign(signing_key(self.root), manifest)):
                return "its manifest's signature does not match (not written by a run of this cache)"
            sums = manifest["sha256"]
            for name in (STATE, f"{DCP}/.metadata"):
                if name not in sums:
                    return f"its manifest lists no {name}"
            for name, digest in sums.items():
                if sha256_file(path / name) != digest:
                    return f"{name} does not match its checksum"
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
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
        """The state dict saved in checkpoint `path`, with the world size it was written at."""

        state = torch.load(path / STATE, weights_only=True, map_location="cpu")
        state["world_size"] = json.loads((path / MANIFEST).read_text())["world_size"]
        return state

    def load_weights(self, path: Path, model, optimizer) -> None:
        """Checkpoint `path`'s model and optimizer state into this rank's `model` and `optimizer`
        (each rank its own part, however the checkpoint was sharded). Every rank calls it."""

        state = _state_dicts(model, optimizer)
        # every key asked for must be in the checkpoint
        with _one_process_is_fine():
            dcp.load(state, checkpoint_id=path / DCP)
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"], options=_options())

    def clear(self) -> None:
        """Remove this run's checkpoints (after the run has finished)."""
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def _one_process_is_fine():
    """Without a process group (`train.nproc: 1`) DCP reads and writes alone, as meant here;
    it would say so in a warning at every checkpoint."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


@contextlib.contextmanager
def _os_errors_as_such():
    """DCP reports the ranks' failures as one CheckpointException; where a rank's was a full
    disk or a file size limit, raise that, so the stage says what happened in one line."""

    try:
        yield
    except CheckpointException as exc:
        for failure, _ in exc.failures.values():
            while failure is not None and disk_error(failure) is None:
                failure = failure.__cause__ or failure.__context__
            if failure is not None:
                raise failure from None
        raise


def _options():

    # LoRA: frozen base weights are neither saved nor expected on load (they are the
    # pretrained model's); strict=False lets set_state_dict leave them alone.
    return StateDictOptions(ignore_frozen_params=True, strict=False)


def _state_dicts(model, optimizer) -> dict[str, Any]:
    """The model's and the optimizer's state, keyed by parameter names (DTensors under FSDP)."""

    model_state, optimizer_state = get_state_dict(model, optimizer, options=_options())
    # ignore_frozen_params keeps a frozen weight under its second name (a tied output layer)
    frozen = {name for name, q in model.named_parameters(remove_duplicate=False) if not q.requires_grad}
    model_state = {k: v for k, v in model_state.items() if k not in frozen}
    return {"model": model_state, "optimizer": optimizer_state}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
