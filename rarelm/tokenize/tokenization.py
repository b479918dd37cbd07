"""The `tokenize` stage: a tokenizer, and every split as a memory-mapped token array.

Layout of the output folder (read back with `rarelm.artifacts.tokenized.TokenizedData`):

    tokenizer/            Hugging Face tokenizer files (AutoTokenizer.from_pretrained loads them)
    train.tokens          raw little-endian token ids, uint16 if the vocabulary fits, else uint32
    train.offsets.npy     int64, documents + 1 entries: document i is tokens[off[i]:off[i+1]],
                          its last token the end-of-text id
    val.*, test.*         the same for the other splits
    meta.json             dtype, vocab_size, eot_id, tokenizer ("bpe", the folder, or a hub id as
                          org/name@<commit>), tokenizer_commit (hub ids only), token and
                          document counts per split

Encoding goes batch by batch (`tokenizer.batch_size` documents), so memory is
bounded by the batch, not the corpus.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from rarelm.errors import RarelmError
from rarelm.hub import resolve
from rarelm.params import RareParams, TokenizerParams
from rarelm.prepare.corpus import SPLITS, read_split

EOT = "<|endoftext|>"


def train_bpe(texts: Iterator[str], vocab_size: int, min_frequency: int, cjk: str = "chars"):
    """A byte-level BPE tokenizer (tokenizers.Tokenizer) trained on `texts`.

    cjk="chars" first isolates every Han character as its own pre-token, so BPE
    merges only the bytes of one character: in "发行可交换保理" no token spans 行|可,
    and a term's first and last characters always sit on token boundaries. With
    "merge", GPT-2's pre-tokenizer keeps a run of Han characters whole and BPE
    merges across word boundaries (fewer tokens per character). The choice is
    stored in tokenizer.json, so AutoTokenizer loads it as it was trained.
    """
    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if cjk == "chars":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r"\p{Han}"), behavior="isolated"), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def save_hf_tokenizer(tokenizer, out_dir: Path) -> None:
    """Save a tokenizers.Tokenizer so that AutoTokenizer.from_pretrained(out_dir) loads it."""
    from transformers import PreTrainedTokenizerFast  # here: importing transformers takes ~6 s

    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=EOT, eos_token=EOT, pad_token=EOT, unk_token=EOT,
    ).save_pretrained(out_dir)


def load_pretrained(name_or_path: str, out_dir: Path):
    """Copy a pretrained tokenizer (a local folder or a cached hub id, see rarelm.hub) into out_dir.

    Returns (backend tokenizer, end-of-text id, vocabulary size, rarelm.hub.Pretrained). The
    end of a document is the eos token; a BERT-style vocabulary without one (the Chinese
    GPT-2 models of uer/gpt2-chinese-*, trained on [CLS] text [SEP]) ends it with [SEP].
    """
    key = "tokenizer.name_or_path"
    pretrained = resolve(name_or_path, key)  # before transformers' import: a missing one fails fast
    from transformers import AutoTokenizer  # here: importing transformers takes ~6 s

    try:
        hf = AutoTokenizer.from_pretrained(pretrained.path, local_files_only=True)
    except Exception as exc:  # transformers raises OSError/ValueError/... for a bad folder
        raise RarelmError(f"{key}: {name_or_path} is not a loadable tokenizer ({exc})") from None
    if not getattr(hf, "is_fast", False):
        raise RarelmError(f"{key}: {name_or_path} has no fast (tokenizers) tokenizer")
    if len(hf) <= len(set(hf.all_special_ids)):  # transformers builds an empty one from config.json
        files = ", ".join(sorted(p.name for p in pretrained.path.iterdir())[:8]) or "nothing"
        raise RarelmError(f"{key}: {name_or_path} holds no tokenizer files, only {files} (its "
                          "vocabulary is empty); give the folder with tokenizer.json (or vocab.json "
                          "+ merges.txt)")
    eot_id = hf.eos_token_id if hf.eos_token_id is not None else hf.sep_token_id
    if eot_id is None:
        raise RarelmError(f"{key}: {name_or_path} defines no end-of-text (eos or sep) token")
    hf.save_pretrained(out_dir)
    return hf.backend_tokenizer, eot_id, len(hf), pretrained


def _batches(texts: Iterator[str], size: int) -> Iterator[list[str]]:
    while batch := list(itertools.islice(texts, size)):
        yield batch


def encode_split(tokenizer, texts: Iterator[str], eot_id: int, dtype: np.dtype,
                 tokens_path: Path, offsets_path: Path, batch_size: int,
                 progress=None) -> tuple[int, int]:
    """Encode documents batch by batch into tokens_path; returns (tokens, documents)."""
    offsets = [0]
    with open(tokens_path, "wb") as out:
        for batch in _batches(texts, batch_size):
            encodings = tokenizer.encode_batch(batch, add_special_tokens=False)
            lengths = np.fromiter((len(e.ids) + 1 for e in encodings), np.int64, len(encodings))
            ids = np.empty(int(lengths.sum()), dtype=dtype)
            ends = np.cumsum(lengths)
            starts = ends - lengths
            for enc, start, end in zip(encodings, starts, ends, strict=True):
                ids[start:end - 1] = enc.ids
            ids[ends - 1] = eot_id
            out.write(memoryview(ids))  # not ids.tofile: its short write has no errno (full disk)
            offsets.extend((ends + offsets[-1]).tolist())
            if progress is not None:
                progress(len(batch))
    np.save(offsets_path, np.asarray(offsets, dtype=np.int64))
    return offsets[-1], len(offsets) - 1


def tokenize(params: TokenizerParams, prepared_dir: Path, out_dir: Path, progress=None,
             rare=None) -> dict:
    """Build or load the tokenizer and encode every split; returns meta.json's content.

    With `tokenizer.add_terms` the domain's terms (from the `rare` params, RareParams) join the
    tokenizer first (rarelm/tokenize/added_terms.py, written to added_terms.json); rare=None
    means the `rare` defaults."""
    tok_dir = out_dir / "tokenizer"
    if params.name_or_path:
        tokenizer, eot_id, vocab_size, pretrained = load_pretrained(params.name_or_path, tok_dir)
        source = params.name_or_path if not pretrained.hub_id else str(pretrained)
        pinned = {"tokenizer_commit": pretrained.commit} if pretrained.commit else {}
    else:
        tokenizer = train_bpe(read_split(prepared_dir, "train"), params.vocab_size,
                              params.min_frequency, params.cjk)
        save_hf_tokenizer(tokenizer, tok_dir)
        eot_id, vocab_size, source = tokenizer.token_to_id(EOT), tokenizer.get_vocab_size(), "bpe"
        pinned = {}
    extension = {}
    if params.add_terms:
        from rarelm.tokenize.added_terms import add_terms, write_added

        added = add_terms(tok_dir, rare or RareParams(), params.add_terms_max, prepared_dir,
                          params.batch_size)
        write_added(out_dir, added)
        tokenizer = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))  # as every reader loads it
        vocab_size = added["base_vocab_size"] + len(added["terms"])
        extension = {"added_terms": len(added["terms"])}
    dtype = np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")
    splits = {}
    for split in SPLITS:
        n_tokens, n_docs = encode_split(
            tokenizer, read_split(prepared_dir, split), eot_id, dtype,
            out_dir / f"{split}.tokens", out_dir / f"{split}.offsets.npy", params.batch_size,
            progress)
        splits[split] = {"tokens": n_tokens, "documents": n_docs}
    if splits["train"]["tokens"] == splits["train"]["documents"]:
        raise RarelmError("tokenize: the train split encodes to no tokens")
    return {"dtype": dtype.name, "vocab_size": vocab_size, "eot_id": eot_id,
            "tokenizer": source, **pinned, **extension, "splits": splits}
