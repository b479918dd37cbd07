"""A micro-batch that cannot fit is refused in one line before anything is allocated.

Was: `train.batch_size: 1000000000` passed validation, then allocated for 96 s up to 16 GB of
resident memory (the sampler's start positions, the precision probe's batch) before the
MemoryError's line. The check is a lower bound of what one training step of one rank holds in
host memory, from the batch, the window and the model's size:

- the windows: `batch_size x (block_size + 1)` positions as int64 indices, then as int64 token
  ids (rarelm.train.batches.to_batch): 16 bytes a position;
- on a CPU the activations too: the embedding output and each layer's output, kept for the
  backward pass, `batch_size x block_size x hidden size x (layers + 1)` values of at least
  2 bytes (bf16; fp32 takes 4). On a GPU they sit in device memory, whose exhaustion torch
  reports at once (one line already: rarelm.errors.memory_error).

Attention, MLP and logits add more, so a batch refused here cannot run; one let through may
still run out of memory, and says so in one line. The bound is compared with the memory the
ranks on this machine share (psutil's `available`), and per rank with the address-space limit
(`ulimit -v`) if one is set.

>>> step_bytes(batch=4, block=64, hidden=32, layers=1, cpu=True)
36928
>>> step_bytes(batch=4, block=64, hidden=32, layers=1, cpu=False)
4160
"""

from __future__ import annotations

import resource

from rarelm.errors import RarelmError

WINDOW_BYTES = 16  # per position: its int64 index and its int64 token id
ACTIVATION_BYTES = 2  # per value kept for backward, at least (bf16)


def step_bytes(batch: int, block: int, hidden: int, layers: int, cpu: bool) -> int:
    """The lower bound above, in bytes, for one rank's micro-batch."""
    windows = batch * (block + 1) * WINDOW_BYTES
    activations = batch * block * hidden * (layers + 1) * ACTIVATION_BYTES if cpu else 0
    return windows + activations


def model_size(params) -> tuple[int, int]:
    """(hidden size, layers) of the model `params.model` trains: its own sizes, or a pretrained
    model's config.json (read, not loaded; its errors are check_pretrained's to report)."""
    model = params.model
    if not model.name_or_path:
        return model.n_embd, model.n_layer
    from transformers import AutoConfig  # lazy: seconds to import

    from rarelm.train.model import pretrained

    try:
        config = AutoConfig.from_pretrained(pretrained(model).path, local_files_only=True)
    except Exception:  # noqa: BLE001 - refused with its reason by check_pretrained
        return 0, 0
    config = getattr(config, "get_text_config", lambda: config)()
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", 0)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", 0)
    return int(hidden or 0), int(layers or 0)


def available_memory() -> tuple[int, int | None]:
    """(bytes the machine has available, the per-process address-space limit or None)."""
    import psutil

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return psutil.virtual_memory().available, None if soft == resource.RLIM_INFINITY else soft


def gb(n: int) -> str:
    """Bytes in GB, one decimal.

    >>> gb(528_000_000_000), gb(36_928)
    ('528.0 GB', '0.0 GB')
    """
    return f"{n / 1e9:.1f} GB"


def check_batch_fits(params, ranks: int, cpu: bool) -> None:
    """Refuse `train.batch_size` in one line when one step of the `ranks` processes training on
    this machine cannot fit in its memory (see the module docstring)."""
    tp, block = params.train, params.model.block_size
    hidden, layers = model_size(params)
    need = step_bytes(tp.batch_size, block, hidden, layers, cpu)
    free, per_process = available_memory()
    limits = [(ranks * need, free, f"this machine has {gb(free)} available for {ranks} "
               f"process(es)")]
    if per_process is not None:
        limits.append((need, per_process, f"the address-space limit (ulimit -v) is "
                       f"{gb(per_process)} a process"))
    for wanted, have, why in limits:
        if wanted > have:
            what = f"{tp.batch_size} x {block + 1} token positions"
            if cpu and hidden:
                what += f" and their activations ({hidden} dims x {layers + 1} layer outputs)"
            raise RarelmError(
                f"params: train.batch_size = {tp.batch_size} does not fit: one step needs at least "
                f"{gb(need)} a process ({what}), and {why}; lower train.batch_size (raise "
                "train.grad_accum to keep the batch) or model.block_size")
