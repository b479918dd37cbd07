"""The `evaluate` stage, start to end (see stages/evaluate.py for its outputs; the measurements are
rarelm/evaluate/splits.py's): load the model and what it is measured on, measure every split of
eval.splits, write metrics/eval.json, metrics/summary.json, metrics/eval_occurrences.jsonl and the
plot CSVs together, and log them into the MLflow run that trained the model.

`run` does all of it and returns what `summary` (the stage's lines) shows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rarelm import paths
from rarelm.errors import RarelmError
from rarelm.files import atomic_file, outputs_together, read_json, write_csv, write_json
from rarelm.fmt import four_digits
from rarelm.prepare.corpus import read_split

OUTSIDE = ".outside"  # eval.general_text_outside's slices: data/general/<language>.outside.txt
BUCKET_COLUMNS = ["bucket", "tokens", "ppl", "acc", "recall_at_5"]
# nll_per_char and ppl (term perplexity) beside exact match: the term chart's three panels (dvc.yaml)
BAND_COLUMNS = ["band", "terms", "occurrences", "exact_match", "first_token_acc", "choice_acc", "nll",
                "nll_per_char", "ppl"]


@dataclass(frozen=True)
class Inputs:
    """What the stage reads: the model folder (any local causal LM), the prepare, tokenize, rare_terms
    and datastore stages' folders, and the model's training metrics for the headline's tokens/s
    (None: metrics/train.json with the pipeline's model, else none)."""

    model: Path
    prepared: Path
    tokenized: Path
    rare: Path
    datastore: Path
    train_metrics: Path | None = None


@dataclass(frozen=True)
class Outputs:
    """What the stage writes: metrics/eval.json, the headline metrics/summary.json, the
    per-occurrence rows and the folder of the plot CSVs."""

    metrics: Path
    summary: Path
    occurrences: Path
    plots: Path


@dataclass(frozen=True)
class Evaluated:
    """What the summary shows: metrics/eval.json's content (the first split's figures at the top,
    each other split's under its name), the splits in order, and whether eval.general_text `auto`
    found no slice (forgetting not measured)."""

    metrics: dict
    splits: list[str]
    general_unmeasured: bool


def run(params, inputs: Inputs, outputs: Outputs) -> Evaluated:
    """Measure the model on every split of eval.splits, write the outputs together (every one
    changes, or none does) and log them into the training run. `params` is the full Params."""
    # on use: numpy, torch and mlflow would add seconds to every `rarelm` command's start-up
    from rarelm.artifacts.buckets import load_buckets, load_counts, log_prior
    from rarelm.artifacts.terms import load_terms
    from rarelm.artifacts.tokenized import TokenizedData, load_tokenizer
    from rarelm.evaluate.mlflow_log import log_eval_files, log_eval_metrics
    from rarelm.evaluate.prefix import leading
    from rarelm.evaluate.retrieval import retrieving
    from rarelm.knn.hook import active as knn_active
    from rarelm.tracking.metrics import summary_file
    from rarelm.tracking.run import open_run
    from rarelm.tracking.uri import logs_text

    model_dir, prepared, tokenized, rare = inputs.model, inputs.prepared, inputs.tokenized, inputs.rare
    data = TokenizedData.open(tokenized)
    buckets = load_buckets(rare, data.vocab_size).astype("int64")
    prior = log_prior(load_counts(rare, data.vocab_size)) if params.eval.logit_adjust_tau else None
    terms = load_terms(rare / "terms.jsonl")
    tokenizer = load_tokenizer(data.tokenizer_dir, data.vocab_size)
    model = _load(model_dir, data, params.eval.device, params.eval.threads)
    lead = _lead(tokenizer)  # <bos> before every window and prompt where the model reads one first
    params = _with_room(params, model, len(lead))  # eval.block_size 0 with retrieval: what fits
    general_text = _general_text(params, prepared)  # eval.general_text's file, or None
    outside = _general_text(params, prepared, OUTSIDE)  # eval.general_text_outside's, or None
    ctx = _context(params, model, tokenizer, data, prior)  # what every measurement reads, built once

    general = {}
    with leading(lead):
        if general_text is not None:  # first: a bad path fails at once. The forgetting guard: the
            # model alone (no decode-time mixing) on general text the base never trained on
            general = _general(ctx, data, general_text)
            general["ppl_general_model"] = general["ppl_general"]
        if outside is not None:  # forgetting on text from outside the base's family, the model alone
            scored = _general(ctx, data, outside, "eval.general_text_outside")
            general.update(ppl_general_outside=scored["ppl_general"],
                           n_general_outside_tokens=scored["n_general_tokens"])
        # kNN-LM + cache mixed into every next-token distribution below (rarelm/knn/hook.py), retrieved
        # train passages before every prompt and window (rarelm/evaluate/retrieval.py); off: nothing
        retriever = _retriever(ctx, params, data, prepared, inputs.datastore)
        with _knn(params, model, inputs.datastore, data.eot_id), retrieving(retriever):
            if general and (knn_active(params.knn) or retriever):  # the mixture's own, apart
                general.update(_general(ctx, data, general_text))
            out, results = _evaluate(ctx, data, buckets, terms, prepared)
    out.update(general)
    # before any output is written: a store that cannot log is the error (tracking.required)
    training_run = open_run(model_dir / "mlflow_run.json", "evaluate", params)
    try:
        # the training run's params are fixed at training time: the tau behind these metrics goes too
        mixed = {f"knn_{k}": v for k, v in vars(params.knn).items() if isinstance(v, (int, float))} \
            if knn_active(params.knn) else {}  # the kNN settings behind these metrics; off: as before
        settings = {"logit_adjust_tau": params.eval.logit_adjust_tau, "term_trie": params.eval.term_trie,
                    "term_trie_min_mass": params.eval.term_trie_min_mass,
                    **({"retrieval": _retrieval_setting(params.retrieval)} if retriever else {})}
        log_eval_metrics(training_run, {**out, **settings, **mixed}, inputs=[prepared, tokenized, rare])
        headline = summary_file(out, params.eval.splits, _train_figures(model_dir, inputs.train_metrics))
        with outputs_together():  # every output changes, or none does
            bucket_csv, band_csv = _write_plots(results[params.eval.splits[0]], outputs.plots)
            _write_metrics(out, results, headline, outputs.metrics, outputs.occurrences, outputs.summary)
    except BaseException:  # no output changed: the run is not left RUNNING
        training_run.finish("FAILED")
        raise
    log_eval_files(training_run, [outputs.metrics, outputs.occurrences, bucket_csv, band_csv],
                   logs_text(params.tracking.log_text, training_run.tracking_uri))
    return Evaluated(out, list(params.eval.splits), general_text is None and bool(params.eval.general_text))


def summary(result: Evaluated, seconds: float, outputs: Outputs) -> str:
    """The stage's lines: each split's figures (`split_summary`), a line when eval.general_text `auto`
    found no slice, and the time (`seconds`) with where the figures are."""
    first = result.splits[0]
    lines = [split_summary(split, result.metrics if split == first else result.metrics[split])
             for split in result.splits]
    if result.general_unmeasured:
        lines.append("evaluate: eval.general_text auto: no data/general/<language>.txt here, forgetting not "
                     "measured")
    lines.append(f"evaluate: {seconds:.1f} s; every figure in {outputs.metrics}, the headline in "
                 f"{outputs.summary}")
    return "\n".join(lines)


def _write_plots(first, plots: Path) -> tuple[Path, Path]:
    """plots/eval_buckets.csv and plots/eval_term_bands.csv of the first split's results."""
    bucket_csv = plots / Path(paths.EVAL_BUCKETS_PLOT).name
    band_csv = plots / Path(paths.EVAL_BANDS_PLOT).name
    write_csv(bucket_csv, BUCKET_COLUMNS, first.bucket_rows)
    write_csv(band_csv, BAND_COLUMNS, first.band_rows)
    return bucket_csv, band_csv


def _write_metrics(out: dict, results: dict, headline: dict, metrics: Path, occurrences: Path,
                   summary: Path) -> None:
    """metrics/eval_occurrences.jsonl, metrics/eval.json and the headline, metrics/summary.json."""
    with atomic_file(occurrences) as f:
        for result in results.values():
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in result.occurrences))
    write_json(metrics, out)
    with atomic_file(summary) as f:  # in SUMMARY's order, what to read first: `dvc exp show`'s columns
        json.dump(headline, f, indent=2, ensure_ascii=False)
        f.write("\n")


def split_summary(split: str, m: dict) -> str:
    """One split's figures of metrics/eval.json, one line per measurement (n/a: undefined here).

    >>> m = {"ppl": 1.7, "ppl_frequent": 1.24, "ppl_medium": 3.1, "ppl_rare": 21.0, "rare_token_acc": 0.45,
    ...      "term_exact_match": 0.81, "term_exact_match_first": 0.8, "term_exact_match_le15": 0.65,
    ...      "term_choice_acc": 0.9, "term_nll_per_char": 0.0359, "term_token_acc": 0.9,
    ...      "em50_train_count": None, "n_eval_tokens": 3251, "n_eval_terms": 192}
    >>> print(split_summary("test", m))
    evaluate: test split, 3,251 tokens, 192 term occurrences
      perplexity           1.7 (frequent 1.24, medium 3.1, rare 21)
      rare-token accuracy  0.45
      term exact match     0.81 (first mentions 0.8, terms seen <= 15 times in train 0.65)
      closed-set choice    0.9
      term NLL per char    0.0359 (term perplexity n/a, term-token accuracy 0.9)
      completion           n/a
      false insertion      n/a
      em50                 n/a (no 50% crossing of exact match within the train counts seen)
    """
    f = four_digits
    em50, completion, insertion = (m.get(k) for k in ("em50_train_count", "term_completion_match",
                                                      "false_insertion_rate"))
    lines = [("perplexity", f"{f(m['ppl'])} (frequent {f(m['ppl_frequent'])}, medium {f(m['ppl_medium'])}, "
                            f"rare {f(m['ppl_rare'])})"),
             ("rare-token accuracy", f(m["rare_token_acc"])),
             ("term exact match", f"{f(m['term_exact_match'])} (first mentions "
                                  f"{f(m['term_exact_match_first'])}, terms seen <= 15 times in train "
                                  f"{f(m['term_exact_match_le15'])})"),
             ("closed-set choice", f(m["term_choice_acc"])),
             ("term NLL per char", f"{f(m['term_nll_per_char'])} (term perplexity {f(m.get('term_ppl'))}, "
                                   f"term-token accuracy {f(m['term_token_acc'])})"),
             ("completion", "n/a" if completion is None else f"{f(completion)} given the term's first token"),
             ("false insertion", "n/a" if insertion is None else f"{f(insertion)}x the text's rate"),
             ("em50", f"{f(em50)} train occurrences for 50% exact match" if em50 is not None else
                      "n/a (no 50% crossing of exact match within the train counts seen)")]
    if "ppl_general" in m:
        lines.append(("general-text ppl", f(m["ppl_general"])))
        if m.get("ppl_general_model") not in (None, m["ppl_general"]):  # decode-time mixing on
            lines.append(("the model alone", f(m["ppl_general_model"])))
    if "ppl_general_outside" in m:
        lines.append(("outside-family ppl", f(m["ppl_general_outside"])))
    head = f"evaluate: {split} split, {m['n_eval_tokens']:,} tokens, {m['n_eval_terms']:,} term occurrences"
    return "\n".join([head, *(f"  {label:<20} {text}" for label, text in lines)])


def _train_figures(model_dir: Path, train_metrics: Path | None) -> dict:
    """The model's metrics/train.json (for the headline file's tokens/s); {} if there is none."""
    if train_metrics is None and model_dir.resolve() != Path(paths.MODEL).resolve():
        return {}  # another model than the pipeline's: the workspace's train.json is not its
    path = train_metrics or Path(paths.TRAIN_METRICS)
    return read_json(path) if path.is_file() else {}


def _context(params, model, tokenizer, data, prior):
    """What every measurement of the evaluation reads (rarelm/evaluate/common.py), the bias of the post-hoc
    logit adjustment included (`prior`: the train log prior, None at eval.logit_adjust_tau 0)."""
    from rarelm.evaluate.common import EvalContext
    from rarelm.evaluate.decoding import logit_adjustment

    return EvalContext(model, tokenizer, data.eot_id, params.eval, params.seed,
                       logit_adjustment(model, prior, params.eval.logit_adjust_tau))


def _evaluate(ctx, data, buckets, terms, prepared: Path):
    """Every split of eval.splits, with a progress bar on a terminal: (metrics/eval.json, per split)."""
    # on use: rich, numpy and torch would slow every `rarelm` command's start-up
    import dataclasses

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from rarelm.evaluate.common import SplitText
    from rarelm.evaluate.splits import combine, evaluate_split
    from rarelm.progress import ticker

    columns = [TextColumn("evaluate: {task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn()]
    results = {}
    console = Console(stderr=True)  # stdout holds only the summary line
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
        def progress(description: str, total: int):
            task = bar.add_task(f"{split} {description}", total=total)
            if console.is_terminal:
                return lambda n: bar.advance(task, n)
            tick = ticker(f"evaluate: {split} {description}", total)  # a log: a line every 30 s

            def advance(n: int) -> None:
                bar.advance(task, n)
                tick(n)

            return advance

        ctx = dataclasses.replace(ctx, progress=progress)
        for split in ctx.params.splits:
            documents = _documents(prepared, split)
            text = SplitText(split, data.tokens(split), data.offsets(split), documents)
            results[split] = evaluate_split(ctx, text, buckets, terms)
            console.print(f"evaluate: {split} split: " + ", ".join(  # where the time went
                f"{name} {seconds:.1f} s" for name, seconds in results[split].seconds.items()),
                soft_wrap=True)
    return combine(results), results


def _language(prepared: Path) -> str:
    """The corpus' language as prepare recorded it (corpus.language, or what `auto` found)."""
    return read_json(prepared / "stats.json").get("language", "en")


def _general_text(params, prepared: Path, kind: str = "") -> Path | None:
    """eval.general_text's file (kind ""), or eval.general_text_outside's (kind OUTSIDE); `auto`: the
    project's slice for the corpus' language; None where off or absent."""
    from rarelm.evaluate.general_text import AUTO, resolve

    setting = params.eval.general_text_outside if kind else params.eval.general_text
    language = _language(prepared) if setting == AUTO else ""
    return resolve(setting, language, kind)


def _general(ctx, data, path: Path, key: str = "eval.general_text") -> dict:
    """ppl_general and n_general_tokens on the general text at `path` (rarelm/evaluate/general_text.py)."""
    from rarelm.evaluate.decoding import context_length
    from rarelm.evaluate.general_text import general_metrics
    from rarelm.evaluate.prefix import window

    block = window(ctx.params.block_size, context_length(ctx.model))
    return general_metrics(ctx, path, data.vocab_size, block, key)


def _lead(tokenizer) -> list[int]:
    """The tokens the model reads first in any text (rarelm/artifacts/tokenized.py `lead_ids`); one
    stderr line when there are any."""
    import sys

    from rarelm.artifacts.tokenized import lead_ids

    lead = lead_ids(tokenizer)
    if lead:
        shown = "".join(tokenizer.id_to_token(t) or str(t) for t in lead)
        print(f"evaluate: every window, prompt and sample starts with {shown}, as the tokenizer starts texts",
              file=sys.stderr, flush=True)
    return lead


def _knn(params, model, datastore: Path, eot_id: int):
    """The block in which kNN-LM and the cache are mixed in, as params.knn says (one stderr line if on)."""
    import contextlib
    import sys

    from rarelm.knn.datastore import Datastore
    from rarelm.knn.hook import active, attached, describe, uses_store

    if not active(params.knn):
        return contextlib.nullcontext()
    knn = params.knn
    store = Datastore.open(datastore, str(model.device), knn.nprobe) if uses_store(knn) else None
    print(f"evaluate: mixing in {describe(params.knn, store)}", file=sys.stderr, flush=True)
    return attached(model, store, params.knn, eot_id)


def _with_room(params, model, lead_tokens: int):
    """`params` with eval.block_size 0 resolved where retrieval is on: the model's context less the
    lead and the passages before every window, the same window for every scoring of the evaluation
    (the model alone on general text too); else `params` as they are (0 is resolved per scoring)."""
    import dataclasses

    from rarelm.evaluate.decoding import context_length
    from rarelm.evaluate.retrieval import passages_width

    r, limit = params.retrieval, context_length(model)
    if params.eval.block_size or not r.enabled or not limit:
        return params
    width = lead_tokens + passages_width(r)
    if width >= limit:
        raise RarelmError(f"the {width} tokens before every window (lead and retrieved passages) leave no "
                          f"room in the model's context of {limit}: lower retrieval.passage_tokens or "
                          "retrieval.passages")
    return dataclasses.replace(params, eval=dataclasses.replace(params.eval, block_size=limit - width))


def _retriever(ctx, params, data, prepared: Path, datastore: Path):
    """The retriever over the train split (retrieval.enabled: BM25, the random control, or by the
    model's states in the datastore), or None; one line."""
    if not params.retrieval.enabled:
        return None
    import sys
    import time

    from rarelm.evaluate.decoding import context_length
    from rarelm.evaluate.prefix import lead, window
    from rarelm.evaluate.retrieval import Retriever, check_fits, passages_width

    r, limit = params.retrieval, context_length(ctx.model)
    check_fits(window(params.eval.block_size, limit), len(lead()) + passages_width(r), limit)
    started = time.perf_counter()
    language = _language(prepared)
    states = None
    if r.dense:  # the datastore stage's store of this model: where it was in a state like the query's
        from rarelm.knn.datastore import Datastore, NearestStates

        store = Datastore.open(datastore, str(ctx.model.device), params.knn.nprobe)
        states = NearestStates(ctx.model, store, data.tokens("train"), lead())
    retriever = Retriever.build(ctx, data.tokens("train"), language, params.retrieval, states)
    how = "drawn at random, the query ignored (the control)" if r.random else \
        f"by the model's states: the passage after each nearest of {len(states.store):,} datastore keys" \
        if r.dense else f"BM25, {language} words; index built in {time.perf_counter() - started:.1f} s"
    print(f"evaluate: retrieving {_retrieval_setting(params.retrieval)} from {len(retriever.passages):,} "
          f"train passages ({how})", file=sys.stderr, flush=True)
    return retriever


def _retrieval_setting(r) -> str:
    """What retrieval puts before a prompt, in words: '1 passage of 64 tokens, query 32 tokens'."""
    if r.random:
        return f"{r.passages} random passage{'s' if r.passages > 1 else ''} of {r.passage_tokens} tokens"
    return (f"{r.passages} passage{'s' if r.passages > 1 else ''} of {r.passage_tokens} tokens, "
            f"query {r.query_tokens} tokens{', by states' if r.dense else ''}")


def _load(model_dir: Path, data, device: str, threads: int):
    """The model on its device, checked against the tokenized data's vocabulary."""
    import torch  # on use: torch and transformers take seconds to import

    from rarelm.evaluate.model_folder import load_causal_lm

    if threads:
        torch.set_num_threads(threads)

    # no use_deterministic_algorithms here: inference on CPU is deterministic already, and the
    # switch imports torch's compiler stack (~3 s)
    model = load_causal_lm(model_dir, device)
    vocab = getattr(model.config, "vocab_size", None)
    if isinstance(vocab, int) and vocab < data.vocab_size:
        raise RarelmError(f"{model_dir}: the model's vocabulary ({vocab}) is smaller than the "
                          f"tokenizer's ({data.vocab_size}); was it trained on this data?")
    return model


def _documents(prepared: Path, split: str) -> list[str]:
    if not (prepared / f"{split}.jsonl").is_file():
        raise RarelmError(f"{prepared / f'{split}.jsonl'}: no such file; run the prepare stage first")
    return list(read_split(prepared, split))
