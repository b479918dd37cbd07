"""LoRA fine-tuning of a pretrained causal LM (`model.lora`), through Hugging Face `peft`.

    model = apply(model, params.model.lora)     # frozen base + trainable low-rank adapters
    save_merged(model, folder).save_pretrained(folder)   # folder/adapter: the adapter; folder: merged

LoRA (Hu et al. 2021) freezes the pretrained weights W and trains, for each adapted
linear layer, a low-rank update: y = W x + (alpha / r) B A x, with A (r x d_in)
random and B (d_out x r) zero at the start, so training starts from the pretrained
model exactly. Only A and B train, so gradients and AdamW state exist for them
alone (for r = 8 on GPT-2's attention input projection, 0.24% of GPT-2 small's
parameters), and the checkpoints hold only them. The saved model is merged
(W + (alpha / r) B A): `AutoModelForCausalLM.from_pretrained(models/model)` loads it like
any other, and evaluate and generate need no peft; the adapter alone is saved beside
it in `adapter/`, for `peft.PeftModel.from_pretrained(base, "models/model/adapter")`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from rarelm.errors import RarelmError
from rarelm.hub import resolve
from rarelm.params import LoraParams, ModelParams

ADAPTER = "adapter"  # the adapter's folder inside the saved model's


def apply(model, lp: LoraParams):
    """`model` with LoRA adapters on `lp.target_modules` (peft's default for the architecture
    if empty), only the adapters trainable; the model itself where `lp.rank` is 0."""
    if not lp.rank:
        return model
    from peft import LoraConfig, get_peft_model  # lazy: peft + transformers ~6 s, unused at rank 0

    config = LoraConfig(r=lp.rank, lora_alpha=lp.alpha, lora_dropout=lp.dropout,
                        target_modules=targets(model, lp), task_type="CAUSAL_LM")
    with warnings.catch_warnings():  # GPT-2's Conv1D: peft sets fan_in_fan_out itself and says so
        warnings.filterwarnings("ignore", message=".*fan_in_fan_out.*")
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")  # peft on transformers 5
        return get_peft_model(model, config)


def check(params: ModelParams) -> None:
    """`targets` on the pretrained model's architecture built on the meta device (no weights
    loaded, so instant at any size): the stage says a bad `target_modules` before it starts
    its workers. A model folder that does not load is left to the workers to report."""
    if not params.lora.rank or not params.name_or_path:
        return
    from transformers import AutoConfig, AutoModelForCausalLM  # lazy: ~6 s, see `apply`

    try:
        config = AutoConfig.from_pretrained(resolve(params.name_or_path, "model.name_or_path").path,
                                            local_files_only=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # rarelm.train.model.load_pretrained says what is wrong with it, in the workers
        return
    targets(model, params.lora)


def targets(model, lp: LoraParams) -> list[str]:
    """The module names to adapt: lp.target_modules, else peft's default for the architecture;
    a name that the model lacks, or no default, is a RarelmError."""
    # lazy, as in `apply`
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    kind = model.config.model_type
    names = list(lp.target_modules) or DEFAULTS.get(kind)
    if not names:
        raise RarelmError(f"params: model.lora.target_modules = [] is not allowed for a {kind!r} "
                          "model (peft has no default for it: name the linear layers to adapt, "
                          "e.g. the attention projections)")
    modules = [name for name, _ in model.named_modules()]
    missing = [t for t in names if not any(m == t or m.endswith("." + t) for m in modules)]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                         if type(m).__name__ in ("Linear", "Conv1D")})
        raise RarelmError(f"params: model.lora.target_modules = {names!r} is not allowed: this "
                          f"{kind!r} model has no module named {missing[0]!r} "
                          f"(its linear layers: {', '.join(linear)})")
    return names


def is_lora(model) -> bool:
    return hasattr(model, "merge_and_unload")


def save_merged(model, folder: Path):
    """The adapter into folder/adapter; returns the merged model (base + adapter) to save."""
    model.save_pretrained(folder / ADAPTER)
    return model.merge_and_unload()  # in place: the run is over


def trainable_parameters(model) -> int:
    return sum(q.numel() for q in model.parameters() if q.requires_grad)
