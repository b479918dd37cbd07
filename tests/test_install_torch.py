"""rarelm/install_torch.py: which torch build `make` installs, by TORCH_INDEX, the OS, a GPU, the network."""

import subprocess
import sys

import pytest

from rarelm.install_torch import CPU_INDEX, choose_index, torch_pin
from tests.conftest import REPO


@pytest.mark.parametrize(("environ", "system", "gpu", "reach", "index"), [
    ({}, "Linux", False, True, CPU_INDEX),  # a plain CPU machine: PyTorch's CPU index
    ({}, "Linux", False, False, None),  # that index out of reach (a mirror-only network): pip's own
    ({}, "Linux", True, True, None),  # an NVIDIA GPU: PyPI's CUDA build
    ({}, "Darwin", False, True, None),  # macOS: PyPI's build has no CUDA libraries
    ({"TORCH_INDEX": "https://download.pytorch.org/whl/cu126"}, "Linux", False, True,
     "https://download.pytorch.org/whl/cu126"),
    ({"TORCH_INDEX": ""}, "Linux", False, True, None),  # empty: PyPI's, whatever the machine
])
def test_the_index_follows_torch_index_the_os_a_gpu_and_the_network(environ, system, gpu, reach, index):
    asked = []

    def can_reach(url: str) -> bool:
        asked.append(url)
        return reach

    chosen, why = choose_index(environ, system, gpu, can_reach)
    assert chosen == index and why
    # the network is asked only where the CPU index would be chosen
    assert asked == ([f"{CPU_INDEX}/torch/"] if not environ and system == "Linux" and not gpu else [])


def test_the_pin_is_pyproject_tomls_and_its_comment_names_the_cpu_build():
    assert torch_pin(REPO / "pyproject.toml") == "torch==2.13.0"
    text = (REPO / "pyproject.toml").read_text()
    assert "rarelm/install_torch.py" in text and "2.13.0+cpu" in text


def test_dry_run_prints_the_choice_and_the_pip_command():
    result = subprocess.run([sys.executable, "-m", "rarelm.install_torch", "--dry-run"], cwd=REPO,
                            capture_output=True, text=True, check=True,
                            env={"PATH": "/usr/bin:/bin", "TORCH_INDEX": "https://example.invalid/whl/cu126"})
    assert result.stdout.splitlines() == [
        "make: installing torch==2.13.0, from TORCH_INDEX=https://example.invalid/whl/cu126 ...",
        f"{sys.executable} -m pip install -q torch==2.13.0 --extra-index-url https://example.invalid/whl/cu126"]


def test_make_installs_torch_before_the_package_and_says_each_step_first():
    dry = subprocess.run(["make", "-n", "-B", ".venv/.installed-dev"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    order = [next(i for i, line in enumerate(dry) if needle in line) for needle in (
        "creating .venv", "-m venv", "rarelm.install_torch", "installing rarelm and its dependencies",
        "pip install -q -e .", "installing the test tools", "pip install -q -e '.[dev]'")]
    assert order == sorted(order), dry
