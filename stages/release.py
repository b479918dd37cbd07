"""`rarelm release vX.Y.Z`: tag the committed model as a version of the DVC artifact `rarelm`.

    rarelm release v1.0.0 && dvc push
    dvc artifacts get <repo> rarelm -o model

Not a DVC stage (rarelm/tracking/release.py says why the tag is needed).
"""

from pathlib import Path

import typer

from rarelm.errors import user_errors
from rarelm.tracking import release as releases


def release(
    version: str = typer.Argument(..., help="the version, vMAJOR.MINOR.PATCH (e.g. v1.0.0)"),
    artifact: str = typer.Option("rarelm", help="the artifact's name in dvc.yaml"),
) -> None:
    """Tag HEAD as ARTIFACT@vX.Y.Z, the git tag `dvc artifacts get` looks for."""
    with user_errors("release"):
        tag = releases.release(version, artifact, Path("."))
    remote = releases.default_remote(Path("."))
    where = f"the default DVC remote `{remote}`" if remote else \
        "a DVC remote (none is set: `dvc remote add -d storage /path/to/folder`)"
    print(f"release: tagged {tag}; `dvc push` uploads the model to {where}, then "
          f"`dvc artifacts get <this repo> {artifact}` downloads it")
