# rarelm on a CUDA host: `docker compose run --rm train` (see docker-compose.yml and README "Container").
#
# Base: the official PyTorch CUDA runtime image whose torch is the version pyproject.toml pins
# (torch==2.13.0 is satisfied by the image's 2.13.0+cu130 build, so pip keeps it and never downloads
# another torch). CUDA 13.0 is the build PyPI ships as the default torch 2.13.0 wheel and covers
# Hopper and Blackwell; it needs an NVIDIA driver >= 580. For an older driver build with
#   --build-arg BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime
# The digest pins the exact image; drop "@sha256:..." to follow the tag instead.
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime@sha256:db80a41f8428644cebcb3d75b0b62df334ab6c0e75785951eb25f48bfbd42407
FROM ${BASE_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# git: DVC needs the repository's git metadata (the repo is mounted at run time, .git included).
# Why DL3008 (unpinned apt package) is ignored: the base image digest fixes the Ubuntu release and
# so git's version line; an exact Debian version pin breaks the build whenever the archive rotates.
# dvc.yaml runs `python -m stages.<name>`: make sure `python` exists where a base has only python3.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/* \
    && { command -v python >/dev/null || ln -s "$(command -v python3)" /usr/local/bin/python; }

# A non-root user whose uid can match the host's (so files written into the mounted repo belong to
# you): docker compose build --build-arg USER_UID="$(id -u)". Some base releases already have a
# user with uid 1000 (Ubuntu 24.04's "ubuntu"); it is replaced.
ARG USER_UID=1000
RUN old="$(getent passwd "${USER_UID}" | cut -d: -f1)"; \
    if [ -n "${old}" ]; then userdel --remove "${old}" 2>/dev/null || userdel "${old}"; fi; \
    useradd --create-home --uid "${USER_UID}" --user-group --shell /bin/bash rarelm \
    && mkdir -p /workspace /mlflow \
    && chown rarelm:rarelm /workspace /mlflow \
    && git config --system --add safe.directory /workspace

# Dependencies first (their layer is rebuilt only when pyproject.toml changes): exactly the pinned
# [project] dependencies of pyproject.toml, read from the file itself so the two cannot drift
# (tests/test_container.py runs this same extraction). The build fails if torch lost its CUDA build.
# PIP_BREAK_SYSTEM_PACKAGES: newer bases mark their python as externally managed; the image is
# this project's only environment, so installing beside torch is intended.
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
COPY pyproject.toml /tmp/rarelm/pyproject.toml
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/rarelm/pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/rarelm/requirements.txt \
    && PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --requirement /tmp/rarelm/requirements.txt \
    && python3 -c "import torch, sys; sys.exit(0 if torch.version.cuda else 'torch has no CUDA build: the base torch was replaced')"

# The project itself, editable: when docker-compose mounts the repo on /workspace, the installed
# `rarelm` console script and every `python -m stages.*` run the mounted code.
WORKDIR /workspace
COPY --chown=rarelm:rarelm . /workspace
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-deps --editable /workspace \
    && rm -rf /tmp/rarelm

USER ${USER_UID}
# `docker run IMAGE` = `dvc repro`; `docker run IMAGE exp run -S alpha=0.7` = `dvc exp run ...`.
ENTRYPOINT ["dvc"]
CMD ["repro"]
