"""The model card (models/model/README.md), written with huggingface_hub's ModelCard from the run itself.

A Hub user reads the front matter first: `base_model` (the starting model, when the run fine-tunes
one), `datasets` (the corpus's name), `language`, `license` (the training data's licence, from
data/raw/corpora.json for the registry's real corpora; the built-in demo is rarelm's own text),
`metrics` and `model-index` (the train stage's validation figures as EvalResults). The body says
how it was trained (steps, lr, objective, precision), what it is for and what not, then the data
digests, every param and the train metrics. Nothing in it depends on time, path or run id, so the
same run gives the same card (the folder hash stays reproducible):

    >>> hub_license("GFDL-1.2+"), hub_license("GPL-2+ (GCIDE); GPL-1+ (WordNet-derived parts)")
    ('gfdl', 'gpl-2.0')
    >>> hub_license("a licence nobody maps")
    'other'
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from rarelm import paths

# params shown in the model card: what decides the weights (tracking is about where they are logged)
CARD_SECTIONS = ("seed", "alpha", "corpus", "tokenizer", "rare", "weights", "loss", "model", "train")
# train metrics in the card: not the wall-clock ones (they differ from run to run)
CARD_METRICS = ("steps", "tokens", "epochs", "parameters", "trainable_parameters", "loss", "ce",
                "rare_ce", "val_ce", "val_ppl", "val_rare_ce", "precision")
# train.json key -> (Hub metric id, pretty name): the card's eval results (validation split)
EVAL_RESULTS = {"val_ppl": ("perplexity", "validation perplexity"),
                "val_ce": ("cross_entropy", "validation cross-entropy (nats/token)"),
                "val_rare_ce": ("cross_entropy", "validation cross-entropy on the rare targets (nats/token)")}
# a registry licence (SPDX-like text) -> the Hub's licence id, first match wins
HUB_LICENSES = ((r"^GFDL", "gfdl"), (r"^GPL-2", "gpl-2.0"), (r"^GPL-3", "gpl-3.0"), (r"^MIT\b", "mit"),
                (r"^Apache-2\.0", "apache-2.0"), (r"^CC-BY-SA-4\.0", "cc-by-sa-4.0"),
                (r"^CC-BY-4\.0", "cc-by-4.0"), (r"^CC0", "cc0-1.0"), (r"^BSD-3", "bsd-3-clause"))
DEMO = re.compile(r"^demo_[a-z]+\.txt\.gz$")  # what `rarelm demo` writes (rarelm/prepare/demo.py)
DEMO_LICENSE = "rarelm-demo"
PATH_KEYS = ("path", "name_or_path", "glossary")  # params whose value is a path: only its name if absolute


@dataclasses.dataclass(frozen=True)
class Corpus:
    """What the card says about the training data: names, languages, licences (text) per corpus."""

    names: tuple[str, ...]
    languages: tuple[str, ...]
    licences: dict[str, str]  # corpus name -> its licence as the registry words it ("" = not recorded)
    demo: bool = False
    licence_files: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> its full text's file


def hub_license(text: str) -> str:
    """The Hub licence id for a registry licence text; "other" when none fits."""
    for pattern, hub_id in HUB_LICENSES:
        if re.search(pattern, text.strip()):
            return hub_id
    return "other"


def find_registry(start: str | Path = ".") -> Path | None:
    """data/raw/corpora.json in `start` or the nearest folder above it (base/ runs one level down)."""
    here = Path(start).resolve()
    for folder in (here, *here.parents):
        candidate = folder / paths.RAW / "corpora.json"
        if candidate.is_file():
            return candidate
    return None


def describe_corpus(corpus_path: str, language: str, registry: Path | None) -> Corpus:
    """The corpus behind `corpus.path` (relative to the stage's folder): the registry's corpora
    whose output file is it or lies in it, else the demo, else the user's own (licence unknown)."""
    path = Path(corpus_path).resolve()
    records = json.loads(registry.read_text(encoding="utf-8")) if registry else {}
    root = registry.parents[2] if registry else None  # <root>/data/raw/corpora.json
    found = {name: r for name, r in sorted(records.items())
             if root and ((root / r["output"]).resolve() == path or (root / r["output"]).resolve()
                          .is_relative_to(path))}
    if found:
        return Corpus(tuple(found), tuple(sorted({r["language"] for r in found.values()})),
                      {name: r.get("licence", "") for name, r in found.items()},
                      licence_files={name: r["licence_file"] for name, r in found.items()
                                     if r.get("licence_file")})
    name = path.name.split(".")[0] if path.suffix else path.name
    languages = (language,) if language != "auto" else ("multilingual",)
    if DEMO.match(path.name):
        return Corpus((name,), languages, {name: ""}, demo=True)
    return Corpus((name,), languages, {name: ""})


def base_model_id(name_or_path: str) -> str | None:
    """The card's base_model: a hub id without its revision, a local folder as given (only its
    name if absolute: the card travels with the model), None when trained from scratch."""
    if not name_or_path:
        return None
    if os.path.isabs(name_or_path):
        return Path(name_or_path).name
    return name_or_path.split("@")[0]


def base_model_license(name_or_path: str) -> str | None:
    """The licence a local base model's own card declares (None: none, or not a local folder)."""
    card = Path(name_or_path) / "README.md" if name_or_path else None
    if not card or not card.is_file():
        return None  # a cached hub id: its card is not read (no network at run time)
    from huggingface_hub import ModelCard

    try:
        return ModelCard.load(card, ignore_metadata_errors=True).data.get("license")
    except (OSError, ValueError):
        return None


def card_license(corpus: Corpus, base_license: str | None) -> tuple[str, str | None]:
    """(license, license_name): one Hub id when the data (and the base model) agree, else "other"."""
    if corpus.demo:
        ids = {"other"}
    elif all(corpus.licences.values()):
        ids = {hub_license(text) for text in corpus.licences.values()}
    else:
        ids = {"unknown"}
    if base_license:
        ids.add(base_license)
    if len(ids) == 1 and ids != {"other"}:
        return ids.pop(), None
    return "other", DEMO_LICENSE if corpus.demo and not base_license else "mixed-data-licences"


def objective(params) -> str:
    """The training objective in words: plain cross-entropy, or the loss params that differ from it."""
    from rarelm.params import LossParams

    changed = {f.name: getattr(params.loss, f.name) for f in dataclasses.fields(LossParams)
               if getattr(params.loss, f.name) != getattr(LossParams(), f.name)}
    text = ", ".join(f"`loss.{k}` = {_value(v)}" for k, v in changed.items())
    return f"cross-entropy with {text}" if changed else "plain next-token cross-entropy"


def model_card(params, metrics: dict[str, Any], digests: dict[str, str],
               registry: Path | None | bool = True) -> str:
    """README.md of the model folder (see the module docstring).

    `params` is a rarelm.params.Params, `metrics` metrics/train.json's dict, `digests`
    {data path: md5 from dvc.lock} (rarelm.tracking.datasets.dvc_hashes); `registry` the
    corpora.json to look the corpus up in (True: the nearest data/raw/corpora.json, None: none).
    """
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    if registry is True:
        registry = find_registry()
    corpus = describe_corpus(params.corpus.path, params.corpus.language, registry or None)
    base = base_model_id(params.model.name_or_path)
    base_license = base_model_license(params.model.name_or_path)
    license_id, license_name = card_license(corpus, base_license)
    name = f"rarelm-{'-'.join(corpus.names)}"
    results = [EvalResult(task_type="text-generation", dataset_type=corpus.names[0],
                          dataset_name=", ".join(corpus.names), dataset_split="validation",
                          metric_type=metric, metric_name=pretty, metric_value=round(metrics[key], 6))
               for key, (metric, pretty) in EVAL_RESULTS.items()
               if isinstance(metrics.get(key), (int, float))]
    data = ModelCardData(
        base_model=base, datasets=list(corpus.names),
        language=list(corpus.languages) if len(corpus.languages) > 1 else corpus.languages[0],
        library_name="transformers", license=license_id, license_name=license_name,
        metrics=sorted({metric for metric, _ in EVAL_RESULTS.values()}) if results else None,
        model_name=name if results else None, eval_results=results or None,
        pipeline_tag="text-generation", tags=["rarelm", "rare-terms", "causal-lm"])
    body = _body(params, metrics, digests, corpus, base, base_license, license_id)
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}"))


def _body(params, metrics, digests, corpus: Corpus, base: str | None, base_license: str | None,
          license_id: str) -> str:
    corpus_list = ", ".join(f"`{n}`" for n in corpus.names)
    start = (f"fine-tuned from `{base}`" if base else "trained from scratch (a GPT-2-style model "
             f"of {params.model.n_layer} layers x {params.model.n_embd} dimensions)")
    lora = (f", LoRA rank {params.model.lora.rank} (only the adapters trained, merged on save)"
            if params.model.lora.rank else "")
    tokens_per_step = (params.train.batch_size * params.train.grad_accum * params.train.nproc
                       * params.model.block_size)
    size = f" ({_value(metrics['parameters'])} parameters)" if "parameters" in metrics else ""
    lines = [f"# {'-'.join(corpus.names)}: a rarelm model", "",
             f"A causal language model{size} {start} "
             f"by rarelm's `train` stage on the corpus {corpus_list} "
             f"(`{_relative(params.corpus.path)}`, language {', '.join(corpus.languages)}).", "",
             "## Training", "",
             f"- {_value(metrics.get('steps', params.train.max_steps))} optimizer steps of "
             f"{tokens_per_step} tokens ({params.train.nproc} process(es) x micro-batch "
             f"{params.train.batch_size} x {params.train.grad_accum} accumulation x "
             f"{params.model.block_size} tokens), {_value(metrics.get('tokens'))} tokens in all "
             f"({_value(metrics.get('epochs'))} epochs){lora};",
             f"- AdamW, lr {params.train.lr:g} after {params.train.warmup_steps} warm-up steps, cosine "
             f"decay to {params.train.min_lr:g}, weight decay {params.train.weight_decay:g}, "
             f"gradient clipping {params.train.grad_clip:g}, strategy `{params.train.strategy}`;",
             f"- objective: {objective(params)}; sampler alpha {params.alpha:g} "
             f"(`weights.score` = {params.weights.score}, schedule {params.weights.schedule});",
             f"- precision: {metrics.get('precision', params.train.precision)}; weights stored as "
             f"{params.model.save_dtype}; seed {params.seed}.", "",
             "## Intended use and limits", "",
             "For research on how well a fine-tuned model writes the rare terms of its domain, and on "
             "the remedies rarelm compares (sampling and loss reweighting). It is not a general-purpose "
             "or production model: it knows its training corpus "
             + ("(rarelm's synthetic demo: each term is bound to its own cue phrases, a sanity check, "
                "not real text)" if corpus.demo else "and what its base model learnt before"
                if base else "and little else")
             + ". It has no safety tuning and can state wrong facts fluently; a term it writes is "
             "not a checked fact.", "",
             "## Use", "",
             "```python",
             "from transformers import pipeline",
             "generate = pipeline(\"text-generation\", model=\"path/to/this/folder\")",
             "# samples with generation_config.json (T 0.8, top-k 50, top-p 0.95); a prompt longer than",
             "# the context keeps its last tokens with handle_long_generation=\"hole\"",
             "prompt = \"...\"  # text of the training domain",
             "generate(prompt, max_new_tokens=32, handle_long_generation=\"hole\")",
             "```", "",
             "## Licence of the data", "",
             f"Card licence: `{license_id}`.", ""]
    for name, text in corpus.licences.items():
        lines.append(f"- `{name}`: " + (
            "rarelm's own synthetic text (`rarelm demo`, rarelm/prepare/demo.py): no third-party text"
            if corpus.demo
            else f"{text} (data/raw/corpora.json" + (f"; full text: `{corpus.licence_files[name]}`)"
                                                      if name in corpus.licence_files else ")") if text
            else "not recorded: state the licence of your corpus before sharing this model"))
    if base:
        lines.append(f"- base model `{base}`: " + (f"`{base_license}` (its model card)" if base_license
                                                   else "licence not recorded in its model card"))
    lines += ["", "## Data", "", "| input | md5 (dvc.lock) |", "| --- | --- |"]
    lines += [f"| `{path}` | `{md5}` |" for path, md5 in sorted(digests.items())] or ["| (not recorded) | |"]
    flat = {k: v for k, v in params.flat().items() if k.split(".")[0] in CARD_SECTIONS}
    lines += ["", "## Params", "", "| param | value |", "| --- | --- |"]
    lines += [f"| `{key}` | `{_relative(value) if key.endswith(PATH_KEYS) else _value(value)}` |"
              for key, value in flat.items()]
    lines += ["", "## Metrics (train stage)", "", "| metric | value |", "| --- | --- |"]
    lines += [f"| `{key}` | {_value(metrics[key])} |" for key in CARD_METRICS if key in metrics]
    lines += ["", "The test-split metrics (perplexity by bucket, rare-term exact match, term NLL) are in "
              "`metrics/eval.json` of the run and in its MLflow run.", ""]
    return "\n".join(lines)


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _relative(path: Any) -> str:
    """A path as given, or only its name if absolute (the card travels with the model)."""
    text = str(path)
    return Path(text).name if os.path.isabs(text) else text
