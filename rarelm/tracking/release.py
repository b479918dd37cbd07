"""`rarelm release vX.Y.Z`: the git tag that makes `dvc artifacts get` find the model.

dvc.yaml declares the model as the artifact `rarelm` (path models/model). DVC finds an
artifact's versions by git tags in GTO's convention, `<artifact>@v<semver>` (annotated,
as `gto register` makes them); without one `dvc artifacts get` says "Unable to find
artifact". This command tags HEAD, after checking that the model's hashes (dvc.lock) are
committed, so the tag names the model that is in the DVC remote after `dvc push`:

    rarelm release v1.0.0          # git tag -a rarelm@v1.0.0 at HEAD
    dvc push                       # the model's files to the default DVC remote
    git push origin rarelm@v1.0.0  # where others clone from, if anywhere
    dvc artifacts get <repo url or path> rarelm -o model       # newest version
    dvc artifacts get <repo url or path> rarelm --rev v1.0.0   # DVC: --rev takes a version

    >>> tag_name("rarelm", "1.2.0")
    'rarelm@v1.2.0'
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

from rarelm import git
from rarelm.errors import RarelmError

SEMVER = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")
TRACKED = ("dvc.yaml", "dvc.lock")  # where the artifact and its output hashes are recorded


def tag_name(artifact: str, version: str) -> str:
    """GTO's tag for `version` (with or without its leading v) of `artifact`."""
    if not SEMVER.fullmatch(version):
        raise RarelmError(f"version {version!r} is not allowed (must be vMAJOR.MINOR.PATCH, e.g. v1.0.0)")
    return f"{artifact}@v{version.removeprefix('v')}"


def default_remote(root: Path) -> str:
    """The default DVC remote's name in .dvc/config (or config.local), or "" if none."""
    name = ""
    for file in (".dvc/config", ".dvc/config.local"):
        config = configparser.ConfigParser()
        config.read(root / file, encoding="utf-8")
        name = config.get("core", "remote", fallback=name)
    return name


def declared_artifacts(root: Path) -> list[str]:
    """The artifact names that root's dvc.yaml declares (its `artifacts:` section), read as DVC reads it."""
    from rarelm.params import read_yaml

    try:
        text = (root / "dvc.yaml").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RarelmError(f"{root.resolve().name}: no dvc.yaml, so no artifact to release") from None
    artifacts = (read_yaml(text, root / "dvc.yaml") or {}).get("artifacts") or {}
    return sorted(artifacts) if isinstance(artifacts, dict) else []


def release(version: str, artifact: str = "rarelm", root: str | Path = ".") -> str:
    """Tag HEAD as `artifact@vX.Y.Z` (annotated); returns the tag. One-line errors for the rest.

    The artifact must be one that dvc.yaml declares (a tag for another one names nothing that
    `dvc artifacts get` can download); the tag goes after git's `--`, never where an option goes.
    """
    root = Path(root)
    declared = declared_artifacts(root)
    if artifact not in declared:
        raise RarelmError(f"--artifact {artifact!r}: dvc.yaml declares no such artifact (declared: "
                          f"{', '.join(declared) or 'none'})")
    tag = tag_name(artifact, version)
    if git.run(root, "rev-parse", "--verify", "HEAD").returncode != 0:
        raise RarelmError(f"{root.resolve().name}: not a git repository with a commit to tag")
    if git.run(root, "rev-parse", "--verify", f"refs/tags/{tag}").returncode == 0:
        raise RarelmError(f"tag {tag} already exists (versions are immutable: release a new one)")
    status = git.run(root, "status", "--porcelain", "--", *TRACKED).stdout
    changed = [line[3:] for line in status.splitlines()]
    if changed:
        raise RarelmError(f"{', '.join(changed)} has uncommitted "
                          "changes: commit the model's hashes first, so the tag names this model")
    message = f"Registering artifact {artifact} version v{version.removeprefix('v')}"
    result = git.run(root, "tag", "-a", "-m", message, "--", tag)
    if result.returncode != 0:
        raise RarelmError(f"git tag {tag} failed: {' '.join(result.stderr.split())[:200]}")
    return tag
