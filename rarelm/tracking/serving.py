"""The MLflow model that `train` logs: text generation from the models/model folder.

MLflow copies this file into the logged model ("models from code"), so it imports
nothing from rarelm: the MLflow model stands alone. `mlflow models serve` and
`mlflow.pyfunc.load_model(uri).predict` call TextGenerator.predict:

    model.predict(["The patient was"], params={"max_new_tokens": 16, "do_sample": False})
    # -> ["The patient was ..."]  (the prompt, then the continuation)

A request's `params` fall back to the model's own defaults (the signature's, which are
`rarelm generate`'s: sampling at T 0.8, top-k 50, top-p 0.95, seed 0). A prompt that
does not fit in the context beside `max_new_tokens` new tokens keeps its last tokens,
with one warning line in the server's log (logger `rarelm.serving`): the model
never fails on a long prompt. MLflow's transformers flavour is not used because it
logs a warning on every request that carries params (they always do: MLflow fills
in the signature's defaults) and fails on a long prompt.
"""

from __future__ import annotations

import logging

import mlflow
import torch
from mlflow.pyfunc import PythonModel
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers.utils import logging as hf_logging

# rarelm generate's defaults (rarelm.tracking.export.SAMPLING): the signature's params and their defaults
DEFAULTS = {"max_new_tokens": 32, "do_sample": True, "temperature": 0.8, "top_k": 50, "top_p": 0.95,
            "seed": 0}
log = logging.getLogger("rarelm.serving")


class TextGenerator(PythonModel):
    """A causal LM folder (artifact "model") behind MLflow's pyfunc interface."""

    def load_context(self, context) -> None:
        hf_logging.set_verbosity_error()  # the long-prompt warning below says it once, in our words
        hf_logging.disable_progress_bar()
        folder = context.artifacts["model"]
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
        self.context = self.tokenizer.model_max_length
        eos = self.tokenizer.eos_token_id
        self.start = self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else eos
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos

    def predict(self, context, model_input: list[str], params: dict | None = None) -> list[str]:
        settings = {**DEFAULTS, **(params or {})}
        return [self._continue(str(prompt), settings) for prompt in model_input]

    def _continue(self, prompt: str, settings: dict) -> str:
        new = int(settings["max_new_tokens"])
        if new < 1 or new >= self.context:
            raise ValueError(f"max_new_tokens = {new} is not allowed (must be in [1, {self.context}))")
        ids = self.tokenizer(prompt, return_tensors="pt").input_ids
        if ids.shape[1] == 0:
            ids = torch.tensor([[self.start]])
        keep = self.context - new
        if ids.shape[1] > keep:
            log.warning("the prompt (%d tokens) plus max_new_tokens %d exceeds the model's context "
                        "of %d tokens: keeping the prompt's last %d tokens", ids.shape[1], new,
                        self.context, keep)
            ids = ids[:, -keep:]
        sampling = {k: settings[k] for k in ("temperature", "top_k", "top_p")} \
            if settings["do_sample"] else {}
        config = GenerationConfig(max_new_tokens=new, do_sample=bool(settings["do_sample"]),
                                  pad_token_id=self.pad, **sampling)
        torch.manual_seed(int(settings["seed"]))
        # generate() would fill unset fields from the folder's generation_config.json
        shipped, self.model.generation_config = self.model.generation_config, GenerationConfig()
        try:
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        finally:
            self.model.generation_config = shipped
        return prompt + self.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


mlflow.models.set_model(TextGenerator())
