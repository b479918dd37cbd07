"""Terms as tokens on a prepared corpus: what the extension adds and what it costs before training.

    python bench/terms_as_tokens.py --model smollm2/model            # the demo's data/prepared
    python bench/terms_as_tokens.py --model base/model --docs 0      # tokenizer figures only

Tokenizes --prepared twice with the model folder's tokenizer, `tokenizer.add_terms` off then on
(the `rare` params of --params; rarelm/tokenize/added_terms.py), into a temporary folder, and
prints the terms added and dropped, tokens per character of train and test (the end-of-text
token of each document left out) and the time of each; on a Chinese corpus also how many of the
added tokens' matches in train cut a word of jieba's (added tokens match any substring). Then,
unless --docs 0, loads the model as
`train` does (the new rows the mean of their sub-token rows, rarelm/train/added_embeddings.py)
and scores the first --docs test documents that fit its positions, whole, teacher forced after
an end-of-text token, in nats per character of the same text under both tokenizers (the end-of-
text counted as one character): the starting point of a fine-tune
with the extended vocabulary, before any step. Worked example of the last figure: 1,440 nats
over 2,000 characters is 0.72 nats per character.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a local model folder with its tokenizer")
    ap.add_argument("--prepared", default="data/prepared", help="the prepare stage's folder")
    ap.add_argument("--params", default="params.yaml", help="params file whose `rare` section "
                    "gives the term list (tokenizer.add_terms_max too)")
    ap.add_argument("--docs", type=int, default=20, help="test documents scored (0 = none)")
    return ap.parse_args()


def fitting(data, positions: int, n_docs: int) -> list[int]:
    """The first n_docs test documents whose tokens and the end-of-text before them fit the model."""
    offsets = data.offsets("test")
    return [i for i in range(len(offsets) - 1) if offsets[i + 1] - offsets[i] + 1 <= positions][:n_docs]


def nll_per_char(model, data, prepared: Path, docs: list[int]) -> tuple[float, int]:
    """Nats per character over the test documents `docs`, each whole after an end-of-text."""
    import numpy as np
    import torch

    tokens, offsets = data.tokens("test"), data.offsets("test")
    texts = [json.loads(line)["text"] for line in open(prepared / "test.jsonl", encoding="utf-8")]
    nll, chars = 0.0, 0
    with torch.no_grad():
        for i in docs:
            text = texts[i]
            ids = torch.tensor(np.r_[data.eot_id, tokens[offsets[i]:offsets[i + 1]]].astype(np.int64))
            logits = model(ids[None]).logits[0, :-1].float()
            nll -= torch.log_softmax(logits, -1).gather(1, ids[1:, None]).sum().item()
            chars += len(text) + 1  # the text and its end-of-text, under either tokenizer
    return nll / chars, chars


def han_matches_inside_words(out: Path, prepared: Path, added: dict) -> tuple[int, int]:
    """(matches of added tokens in the train split, those not on jieba's word boundaries at both
    ends): how often a Chinese term's token cuts a longer word (added tokens match substrings)."""
    from tokenizers import Tokenizer

    from rarelm.prepare.corpus import read_split
    from rarelm.rare_terms.term_search import word_boundaries

    tokenizer = Tokenizer.from_file(str(out / "tokenizer" / "tokenizer.json"))
    new = {r["id"] for r in added["terms"]}
    matches = inside = 0
    for text in read_split(prepared, "train"):
        enc = tokenizer.encode(text, add_special_tokens=False)
        spans = [span for token, span in zip(enc.ids, enc.offsets, strict=True) if token in new]
        if spans:
            edges = word_boundaries(text)
            matches += len(spans)
            inside += sum(not (edges[a] and edges[b]) for a, b in spans)
    return matches, inside


def main() -> None:
    args = parse_args()
    from rarelm.artifacts.tokenized import TokenizedData
    from rarelm.files import read_json
    from rarelm.params import ModelParams, load_params
    from rarelm.tokenize import tokenization
    from rarelm.train.model import load_pretrained

    params, prepared = load_params(args.params), Path(args.prepared)
    stats = read_json(prepared / "stats.json")
    scores, docs = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for on in (False, True):
            out = Path(tmp) / str(on)
            out.mkdir()
            tok = dataclasses.replace(params.tokenizer, name_or_path=args.model, add_terms=on)
            start = time.perf_counter()
            meta = tokenization.tokenize(tok, prepared, out, rare=params.rare)
            seconds = time.perf_counter() - start
            (out / "meta.json").write_text(json.dumps(meta))
            per_char = {s: (meta["splits"][s]["tokens"] - meta["splits"][s]["documents"])
                        / stats[s]["characters"] for s in ("train", "test")}
            print(f"add_terms {str(on).lower()}: vocabulary {meta['vocab_size']}, tokens per "
                  f"character train {per_char['train']:.4f} test {per_char['test']:.4f}, "
                  f"tokenize {seconds:.1f} s", flush=True)
            if on:
                added = read_json(out / "added_terms.json")
                n = len(added["terms"])
                subs = sum(len(r["sub_ids"]) for r in added["terms"]) / max(n, 1)
                dropped = added["dropped"]
                print(f"  {n} terms added ({subs:.1f} sub-tokens each on average); not added: "
                      f"{len(dropped['inside_words'])} inside a word (e.g. "
                      f"{', '.join(dropped['inside_words'][:5]) or '-'}), "
                      f"{len(dropped['one_token'])} one token already, {dropped['over_max']} "
                      "past tokenizer.add_terms_max", flush=True)
                if added["language"] == "zh":
                    matches, inside = han_matches_inside_words(out, prepared, added)
                    print(f"  {inside} of their {matches} matches in train cut a jieba word "
                          f"({inside / max(matches, 1):.1%})", flush=True)
            if args.docs:
                data = TokenizedData.open(out)
                model = load_pretrained(ModelParams(name_or_path=args.model, block_size=8), data)
                config = model.config
                positions = getattr(config, "max_position_embeddings", None) or config.n_positions
                docs = docs if on else fitting(data, positions, args.docs)  # the same text twice
                if not docs:
                    print(f"  no test document fits the model's {positions} positions: not scored")
                    args.docs = 0
                    continue
                scores[on], chars = nll_per_char(model.eval(), data, prepared, docs)
                print(f"  {scores[on]:.4f} nats per character over {len(docs)} test documents "
                      f"({chars} characters), before training", flush=True)
    if len(scores) == 2:
        print(f"terms as tokens at initialisation: {scores[True] / scores[False] - 1:+.1%} nats "
              "per character")


if __name__ == "__main__":
    main()
