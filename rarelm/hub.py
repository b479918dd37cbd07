"""Where a pretrained model or tokenizer named in params lives: a local folder, or a hub id
already in the local Hugging Face cache.

    resolve("pretrained/gpt2-zh", "model.name_or_path")
        # Pretrained(path=Path("pretrained/gpt2-zh"), hub_id="", commit="")
    resolve("uer/gpt2-chinese-cluecorpussmall@main", "model.name_or_path")
        # Pretrained(path=<cache>/models--uer--gpt2-chinese-cluecorpussmall/snapshots/<commit>,
        #            hub_id="uer/gpt2-chinese-cluecorpussmall", commit="<commit>")

A hub id is `name` or `org/name`, optionally `@revision` (a branch, a tag or a full
commit hash; without one, `main`). It is looked up in the local cache only, the one
huggingface_hub uses (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub, read
when called), as with HF_HUB_OFFLINE=1: nothing is downloaded at run time. An existing
folder wins over a hub id spelt the same; a string that is neither is one RarelmError.
A relative folder missing here is looked for under `DVC_ROOT`: a queued or `--temp` DVC
experiment runs in a copy of the workspace that holds only what git or DVC track, and an
untracked model folder (smollm2/model, git-ignored: docs/smollm2.md) stays in the workspace,
which DVC names in DVC_ROOT even inside the copy; it is still recorded as spelt.
The resolved commit is what a run records, and a new commit is a new training run.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from rarelm.errors import RarelmError

# huggingface_hub's repo-name characters; validate_repo_id rejects "--", ".." and the like
_HUB_ID = re.compile(r"(?P<repo>(?:[\w.-]+/)?[\w.-]+)(?:@(?P<revision>[^@\s]+))?")


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """A resolved pretrained source: the folder to load from and, for a hub id, its commit."""

    path: Path
    hub_id: str = ""  # "" for a local folder
    commit: str = ""  # the snapshot's commit hash ("" for a local folder)
    spelt: str = ""   # a folder found under DVC_ROOT: the relative name params gave (what is recorded)

    def __str__(self) -> str:
        """`org/name@<commit>` (a spelling that pins it) or the folder (as params spell it)."""
        return f"{self.hub_id}@{self.commit}" if self.hub_id else (self.spelt or str(self.path))


def cache_dir() -> Path:
    """The Hugging Face hub cache, from the environment as it is now (as huggingface_hub reads it)."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(hub)))


def parse_hub_id(name: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) if `name` is spelt like a hub id, else None.

    >>> parse_hub_id("gpt2"), parse_hub_id("org/name@v1.0"), parse_hub_id("./models/x")
    (('gpt2', None), ('org/name', 'v1.0'), None)
    """
    match = _HUB_ID.fullmatch(name)
    if match is None:
        return None
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(match["repo"])
    except HFValidationError:
        return None
    return match["repo"], match["revision"]


def resolve(name_or_path: str, key: str) -> Pretrained:
    """The folder `name_or_path` if it exists, else the hub id's snapshot in the local cache."""
    path = Path(name_or_path)
    if path.is_dir():
        return Pretrained(path)
    root = os.environ.get("DVC_ROOT")
    if root and not path.is_absolute() and (Path(root) / path).is_dir():  # an experiment's copy
        return Pretrained(Path(root) / path, spelt=name_or_path)
    parsed = parse_hub_id(name_or_path)
    if parsed is None:
        raise RarelmError(f"{key}: no such folder: {name_or_path} (a local folder, or a hub id "
                          "org/name[@revision] in the local Hugging Face cache)")
    repo_id, revision = parsed
    cache = cache_dir()
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    try:
        folder = snapshot_download(repo_id, revision=revision, cache_dir=cache,
                                   local_files_only=True)
    except IncompleteSnapshotError:
        raise RarelmError(f"{key}: {name_or_path}: the snapshot in the Hugging Face cache {cache} is "
                          f"incomplete (an interrupted download); {_how_to_get(repo_id, revision)}"
                          ) from None
    except LocalEntryNotFoundError:
        raise RarelmError(
            f"{key}: no such folder: {name_or_path}, and no hub model {repo_id} at revision "
            f"{revision or 'main'} in the local Hugging Face cache {cache} (nothing is downloaded at "
            f"run time); {_how_to_get(repo_id, revision)}") from None
    return Pretrained(Path(folder), repo_id, Path(folder).name)


def _how_to_get(repo_id: str, revision: str | None) -> str:
    flag = f" --revision {revision}" if revision else ""
    return (f"on a machine with network run `hf download {repo_id}{flag}` (huggingface-cli "
            f"download in older huggingface_hub), then copy its cache folder "
            f"models--{repo_id.replace('/', '--')} here or point HF_HUB_CACHE at that cache")
