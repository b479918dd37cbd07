"""Install pyproject.toml's torch into the running venv: the CPU build where no NVIDIA GPU is.

    python -m rarelm.install_torch              # what `make repro` / `make test` run first
    TORCH_INDEX= python -m rarelm.install_torch # PyPI's default build whatever the machine
    python -m rarelm.install_torch --dry-run    # the pip command it would run, and why

PyPI's torch 2.13.0 for Linux x86_64 is the CUDA build: 2.7 GB of nvidia-* libraries in a 5.8 GB
venv on a machine that has no GPU to run them. PyTorch publishes its CPU build on its own index
(https://download.pytorch.org/whl/cpu) as version `2.13.0+cpu`, which `torch==2.13.0` accepts and
pip ranks above PyPI's `2.13.0` (a local version label sorts after the bare version), so that
index is added where Linux shows no NVIDIA GPU. Where the index cannot be reached (a mirror-only
network), it is left out with one line saying so: pip would otherwise retry it for every
package for minutes. TORCH_INDEX names another index (a CUDA one: .../whl/cu126), or with an
empty value none. Run from the repository root by `python -m`, before rarelm is installed:
standard library only.
"""

from __future__ import annotations

import glob
import os
import platform
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def torch_pin(pyproject: Path) -> str:
    """The `torch==...` requirement of pyproject.toml's dependencies.

    >>> torch_pin(Path(__file__).resolve().parents[1] / "pyproject.toml").startswith("torch==")
    True
    """
    dependencies = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    pins = [d for d in dependencies if re.match(r"torch\s*==", d)]
    if len(pins) != 1:
        raise SystemExit(f"{pyproject}: expected one torch==<version> among the dependencies, found {pins}")
    return pins[0].replace(" ", "")


def has_nvidia_gpu() -> bool:
    """Whether this machine shows an NVIDIA GPU: the driver's device list, or nvidia-smi."""
    return bool(glob.glob("/proc/driver/nvidia/gpus/*")) or shutil.which("nvidia-smi") is not None


def reachable(url: str, timeout: float = 10.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def choose_index(environ: dict[str, str], system: str, gpu: bool,
                 can_reach) -> tuple[str | None, str]:
    """(the extra index for torch or None, why), by TORCH_INDEX, the OS, a GPU and the network.

    >>> choose_index({}, "Linux", False, lambda url: True)
    ('https://download.pytorch.org/whl/cpu', "the CPU build: no NVIDIA GPU here (TORCH_INDEX= for PyPI's)")
    >>> choose_index({}, "Linux", True, lambda url: True)
    (None, "PyPI's build (CUDA on Linux): an NVIDIA GPU is here")
    >>> choose_index({"TORCH_INDEX": ""}, "Linux", False, lambda url: True)
    (None, "PyPI's build: TORCH_INDEX is empty")
    """
    if "TORCH_INDEX" in environ:
        index = environ["TORCH_INDEX"].strip()
        return (index, f"from TORCH_INDEX={index}") if index else (None, "PyPI's build: TORCH_INDEX is empty")
    if system != "Linux":
        return None, f"PyPI's build (on {system} it has no CUDA libraries)"
    if gpu:
        return None, "PyPI's build (CUDA on Linux): an NVIDIA GPU is here"
    if not can_reach(f"{CPU_INDEX}/torch/"):
        return None, (f"PyPI's or a local wheel: no NVIDIA GPU here, but {CPU_INDEX} cannot be reached "
                      "(set TORCH_INDEX to a mirror of it)")
    return CPU_INDEX, "the CPU build: no NVIDIA GPU here (TORCH_INDEX= for PyPI's)"


def main(argv: list[str]) -> int:
    pin = torch_pin(Path("pyproject.toml"))
    index, why = choose_index(dict(os.environ), platform.system(), has_nvidia_gpu(), reachable)
    command = [sys.executable, "-m", "pip", "install", "-q", pin]
    if index:
        command += ["--extra-index-url", index]
    print(f"make: installing {pin}, {why} ...", flush=True)
    if "--dry-run" in argv:
        print(" ".join(command))
        return 0
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
