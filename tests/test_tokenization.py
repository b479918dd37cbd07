import json

import numpy as np
import pytest

from rarelm.artifacts.tokenized import Samples, TokenizedData
from rarelm.errors import RarelmError
from rarelm.params import TokenizerParams
from rarelm.tokenize import tokenization
from tests.helpers import write_prepared

DOCS = {"train": ["the patient reported fever", "fever and cough", "no fever today"] * 20,
        "val": ["cough today"], "test": ["the fever", "新词"]}


@pytest.fixture
def prepared(tmp_path):
    """The prepare stage's output for DOCS (its splits' documents)."""
    return write_prepared(tmp_path / "prepared", DOCS)


def run(prepared, out, **kw):
    out.mkdir()
    meta = tokenization.tokenize(TokenizerParams(vocab_size=300, batch_size=7, **kw), prepared, out)
    (out / "meta.json").write_text(json.dumps(meta))
    return TokenizedData.open(out)


def test_arrays_offsets_and_roundtrip(prepared, tmp_path):
    from transformers import AutoTokenizer

    data = run(prepared, tmp_path / "tok")
    hf = AutoTokenizer.from_pretrained(data.tokenizer_dir)
    assert data.meta["dtype"] == "uint16" and hf.eos_token_id == data.eot_id
    for split, docs in DOCS.items():
        tokens, offsets = data.tokens(split), data.offsets(split)
        assert len(offsets) == len(docs) + 1 and offsets[-1] == len(tokens)
        assert data.meta["splits"][split] == {"tokens": len(tokens), "documents": len(docs)}
        for i, doc in enumerate(docs):
            ids = tokens[offsets[i]:offsets[i + 1]]
            assert ids[-1] == data.eot_id and data.eot_id not in ids[:-1]
            assert hf.decode(ids[:-1].tolist()) == doc  # byte-level BPE is lossless, Chinese included


def test_batch_size_does_not_change_output_and_is_deterministic(prepared, tmp_path):
    a = run(prepared, tmp_path / "a")
    b = run(prepared, tmp_path / "b", )
    out = tmp_path / "c"
    out.mkdir()
    tokenization.tokenize(TokenizerParams(vocab_size=300, batch_size=1), prepared, out)
    for name in ("train.tokens", "test.tokens", "tokenizer/tokenizer.json"):
        assert (a.root / name).read_bytes() == (b.root / name).read_bytes() == (out / name).read_bytes()


def test_pretrained_tokenizer_folder_is_used_as_is(prepared, tmp_path):
    first = run(prepared, tmp_path / "first")
    second = run(prepared, tmp_path / "second", name_or_path=str(first.tokenizer_dir))
    assert second.meta["tokenizer"] == str(first.tokenizer_dir)
    assert np.array_equal(first.tokens("train"), second.tokens("train"))
    with pytest.raises(RarelmError, match="no such folder"):
        run(prepared, tmp_path / "third", name_or_path=str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(RarelmError, match="is not a loadable tokenizer"):
        run(prepared, tmp_path / "fourth", name_or_path=str(tmp_path / "empty"))


def test_token_file_size_mismatch_is_an_error(prepared, tmp_path):
    data = run(prepared, tmp_path / "tok")
    with open(data.root / "train.tokens", "ab") as f:
        f.write(b"\0")
    with pytest.raises(RarelmError, match="re-run the tokenize stage"):
        data.tokens("train")


def test_samples_cover_every_target_once():
    tokens = np.arange(1, 12)
    samples = Samples(tokens, block_size=3)
    assert len(samples) == 3
    targets = np.concatenate([samples[i][1:] for i in range(len(samples))])
    assert targets.tolist() == list(range(2, 11))
    with pytest.raises(IndexError):
        samples[3]
