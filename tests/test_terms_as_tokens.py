"""Terms as tokens (`tokenizer.add_terms`): rarelm/tokenize/added_terms.py (the tokenizer and the
data) and rarelm/train/added_embeddings.py (the model's new rows), on a hand-built byte-level BPE
and a tiny GPT-2 saved as a local "pretrained" folder; nothing is downloaded."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from rarelm.artifacts.tokenized import TokenizedData
from rarelm.params import ModelParams, RareParams, TokenizerParams
from rarelm.tokenize import added_terms, tokenization
from rarelm.train.added_embeddings import init_added_embeddings, read_added
from rarelm.train.model import load_pretrained

EOT = tokenization.EOT
# merges in rank order: " acute" -> [" ac", "ute"], " mi" -> [" mi"], " fever" -> [" fe", "ver"],
# " art" -> [" a", "r", "t"] (Ġ is byte-level BPE's space)
MERGES = [("Ġ", "a"), ("Ġa", "c"), ("u", "t"), ("ut", "e"), ("Ġ", "m"), ("Ġm", "i"),
          ("Ġ", "f"), ("Ġf", "e"), ("v", "e"), ("ve", "r"), ("s", "t")]
DOCS = {"train": ["the acute mi was severe", "no fever, an acute mi and fever", "the art of start",
                  "acute mi, art and fever"],
        "val": ["fever and the acute mi"], "test": ["an art start"]}
GLOSSARY = "acute mi\nfever\nart\n"


def hand_tokenizer() -> Tokenizer:
    """Byte-level BPE with the 256 byte characters (ids 1..256 in code-point order), EOT 0 and MERGES."""
    vocab = {EOT: 0}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=MERGES))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens([EOT])
    return tokenizer


@pytest.fixture
def pretrained(tmp_path):
    """A tiny GPT-2 (n_embd 2, untied output rows) and its tokenizer, as one local folder."""
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "pretrained"
    tokenizer = hand_tokenizer()
    tokenization.save_hf_tokenizer(tokenizer, folder)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=tokenizer.get_vocab_size(), n_positions=128, n_embd=2, n_layer=1, n_head=1,
        bos_token_id=0, eos_token_id=0, tie_word_embeddings=False))
    ids = {t: tokenizer.token_to_id(t) for t in ("Ġac", "ute", "Ġmi", "Ġfe", "ver")}
    with torch.no_grad():  # hand-chosen rows for the sub-tokens of the two terms
        for token, row_in, row_out in [("Ġac", [1, 0], [3, 3]), ("ute", [0, 2], [0, 3]),
                                       ("Ġmi", [2, 1], [0, 0]), ("Ġfe", [4, -2], [1, 1]),
                                       ("ver", [0, 2], [-1, 5])]:
            model.transformer.wte.weight[ids[token]] = torch.tensor(row_in, dtype=torch.float)
            model.lm_head.weight[ids[token]] = torch.tensor(row_out, dtype=torch.float)
    model.save_pretrained(folder)
    return folder


def write_prepared(folder, docs=DOCS):
    folder.mkdir()
    for split, texts in docs.items():
        (folder / f"{split}.jsonl").write_text(
            "".join(json.dumps({"text": d}) + "\n" for d in texts), encoding="utf-8")
    (folder / "stats.json").write_text(json.dumps(
        {"language": "en", **{s: {"documents": len(t)} for s, t in docs.items()}}))
    return folder


def tokenize(tmp_path, name, tokenizer_dir, rare, docs=DOCS, **params):
    prepared = tmp_path / f"{name}-prepared"
    if not prepared.exists():
        write_prepared(prepared, docs)
    out = tmp_path / name
    out.mkdir()
    meta = tokenization.tokenize(TokenizerParams(name_or_path=str(tokenizer_dir), batch_size=2,
                                                 **params), prepared, out, rare=rare)
    (out / "meta.json").write_text(json.dumps(meta))
    return TokenizedData.open(out)


@pytest.fixture
def glossary_rare(tmp_path):
    path = tmp_path / "glossary.txt"
    path.write_text(GLOSSARY, encoding="utf-8")
    return RareParams(glossary=str(path), tfidf=False)


def test_two_terms_get_the_mean_of_their_sub_token_rows_input_and_output(
        pretrained, glossary_rare, tmp_path):
    data = tokenize(tmp_path, "tok", pretrained, glossary_rare, add_terms=True)
    record = json.loads((data.root / "added_terms.json").read_text())
    base = 256 + 1 + len(MERGES)
    assert record["base_vocab_size"] == base and data.vocab_size == base + 3
    names = {r["token"]: (r["id"], r["sub_ids"]) for r in record["terms"]}
    tok = hand_tokenizer()
    # in rare_terms' order: glossary terms by score (fever 4 times in 3 of 4 documents first)
    assert names == {" fever": (base, [tok.token_to_id(t) for t in ("Ġfe", "ver")]),
                     " art": (base + 1, [tok.token_to_id(t) for t in ("Ġa", "r", "t")]),
                     " acute mi": (base + 2, [tok.token_to_id(t) for t in ("Ġac", "ute", "Ġmi")])}
    model = load_pretrained(ModelParams(name_or_path=str(pretrained)), data)
    wte, head = model.transformer.wte.weight, model.lm_head.weight
    assert wte.shape == head.shape == (base + 3, 2) and model.config.vocab_size == base + 3
    fever, acute_mi = base, base + 2
    # by hand: ([1,0] + [0,2] + [2,1]) / 3 = [1, 1]; ([4,-2] + [0,2]) / 2 = [2, 0]
    assert wte[acute_mi].tolist() == [1.0, 1.0] and wte[fever].tolist() == [2.0, 0.0]
    # output rows: ([3,3] + [0,3] + [0,0]) / 3 = [1, 2]; ([1,1] + [-1,5]) / 2 = [0, 3]
    assert head[acute_mi].tolist() == [1.0, 2.0] and head[fever].tolist() == [0.0, 3.0]
    # the old rows are untouched
    from transformers import AutoModelForCausalLM

    old = AutoModelForCausalLM.from_pretrained(pretrained)
    assert torch.equal(old.transformer.wte.weight, wte[:base])
    assert torch.equal(old.lm_head.weight, head[:base])


def test_tied_rows_stay_tied(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=10, n_positions=8, n_embd=2, n_layer=1,
                                       n_head=1))
    with torch.no_grad():
        model.transformer.wte.weight[:3] = torch.tensor([[1.0, 0.0], [0.0, 2.0], [2.0, 1.0]])
    init_added_embeddings(model, [(10, [0, 1, 2]), (11, [1, 2])], 12)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.transformer.wte.weight[10].tolist() == [1.0, 1.0]
    assert model.transformer.wte.weight[11].tolist() == [1.0, 1.5]


def test_a_term_is_one_token_and_art_is_not_matched_inside_start(
        pretrained, glossary_rare, tmp_path):
    data = tokenize(tmp_path, "tok", pretrained, glossary_rare, add_terms=True)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(data.tokenizer_dir)
    ids = {hf.convert_tokens_to_ids(t): t for t in (" acute mi", " fever", " art")}
    assert hf.convert_ids_to_tokens(hf.encode("the acute mi was")) == \
        ["t", "h", "e", " acute mi", "Ġ", "w", "a", "s"]
    assert [ids.get(i) for i in hf.encode("no fever, the art") if i in ids] == [" fever", " art"]
    start = hf.encode("start the start")  # "art" inside "start" is never the term's token
    assert not set(start) & set(ids) and hf.decode(start) == "start the start"
    # the token arrays hold the new ids where the text has the terms, and decode to the text
    for split, docs in DOCS.items():
        tokens, offsets = data.tokens(split), data.offsets(split)
        for i, doc in enumerate(docs):
            row = tokens[offsets[i]:offsets[i + 1] - 1].tolist()
            assert hf.decode(row) == doc
            assert sum(t in ids for t in row) == sum(doc.count(" " + t) for t in
                                                      ("acute mi", "fever", "art"))


def test_a_term_written_inside_a_longer_word_is_not_added(pretrained, glossary_rare, tmp_path):
    docs = {**DOCS, "test": ["the artist"]}  # " art" would cut " artist"
    data = tokenize(tmp_path, "tok", pretrained, glossary_rare, docs=docs, add_terms=True)
    record = json.loads((data.root / "added_terms.json").read_text())
    assert [r["token"] for r in record["terms"]] == [" fever", " acute mi"]
    assert record["dropped"]["inside_words"] == ["art"]
    assert added_terms.cuts_a_word("the artist", 3, 7, " art")


def test_add_terms_max_keeps_the_first_terms(pretrained, glossary_rare, tmp_path):
    data = tokenize(tmp_path, "tok", pretrained, glossary_rare, add_terms=True, add_terms_max=1)
    record = json.loads((data.root / "added_terms.json").read_text())
    assert [r["token"] for r in record["terms"]] == [" fever"]
    assert record["dropped"]["over_max"] == 2 and data.meta["added_terms"] == 1


def test_saved_model_and_tokenizer_load_in_plain_transformers_with_the_same_logits(
        pretrained, glossary_rare, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = tokenize(tmp_path, "tok", pretrained, glossary_rare, add_terms=True)
    model = load_pretrained(ModelParams(name_or_path=str(pretrained)), data).eval()
    saved = tmp_path / "saved"
    model.save_pretrained(saved)
    for path in data.tokenizer_dir.iterdir():
        shutil.copy2(path, saved / path.name)
    again = AutoModelForCausalLM.from_pretrained(saved).eval()
    hf = AutoTokenizer.from_pretrained(saved)
    ids = torch.tensor([hf.encode("the acute mi and fever")])
    assert read_added(data.root)[0][0] in ids[0].tolist() and len(hf) == data.vocab_size
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)


def test_off_is_the_plain_tokenization_bit_for_bit(pretrained, glossary_rare, tmp_path):
    plain = tokenize(tmp_path, "plain", pretrained, None)
    off = tokenize(tmp_path, "off", pretrained, glossary_rare, add_terms=False)
    for name in ("train.tokens", "val.tokens", "test.tokens", "train.offsets.npy",
                 "tokenizer/tokenizer.json"):
        assert (plain.root / name).read_bytes() == (off.root / name).read_bytes()
    assert plain.meta == off.meta and not (off.root / "added_terms.json").exists()
    on = tokenize(tmp_path, "on", pretrained, glossary_rare, add_terms=True)
    assert not np.array_equal(on.tokens("train"), off.tokens("train"))
    assert read_added(off.root) == []


def test_chinese_terms_have_no_leading_space_and_match_between_han_characters(pretrained, tmp_path):
    """zh: the token is the term itself, matched as a substring (jieba cannot run inside the
    tokenizer); a Latin letter next to a Latin term still refuses it ("myPKI")."""
    docs = {"train": ["患者心肌梗死入院", "心肌梗死, 使用PKI证书", "心肌梗死和PKI"], "val": ["心肌梗死"],
            "test": ["PKI证书"]}
    glossary = tmp_path / "zh.txt"
    glossary.write_text("心肌梗死\nPKI\n", encoding="utf-8")
    for name in ("zh", "zh2"):
        prepared = write_prepared(tmp_path / f"{name}-prepared",
                                  docs if name == "zh" else {**docs, "test": ["myPKI"]})
        stats = json.loads((prepared / "stats.json").read_text())
        (prepared / "stats.json").write_text(json.dumps({**stats, "language": "zh"}))
    rare = RareParams(glossary=str(glossary), tfidf=False)
    data = tokenize(tmp_path, "zh", pretrained, rare, docs=docs, add_terms=True)
    record = json.loads((data.root / "added_terms.json").read_text())
    assert {r["token"] for r in record["terms"]} == {"心肌梗死", "PKI"}
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(data.tokenizer_dir)
    new = {r["id"] for r in record["terms"]}
    assert sum(i in new for i in hf.encode("患者心肌梗死入院")) == 1
    assert added_terms.cuts_a_word("myPKI", 2, 5, "PKI")
    again = tokenize(tmp_path, "zh2", pretrained, rare, docs=docs, add_terms=True)
    dropped = json.loads((again.root / "added_terms.json").read_text())["dropped"]
    assert dropped["inside_words"] == ["PKI"]


def test_from_scratch_the_trained_bpe_is_extended_and_the_model_sized_to_it(tmp_path, glossary_rare):
    from rarelm.train.model import build_model

    prepared = write_prepared(tmp_path / "prepared")
    out = tmp_path / "tok"
    out.mkdir()
    meta = tokenization.tokenize(TokenizerParams(vocab_size=300, add_terms=True), prepared, out,
                                 rare=glossary_rare)
    (out / "meta.json").write_text(json.dumps(meta))
    data = TokenizedData.open(out)
    assert meta["added_terms"] >= 1 and data.vocab_size == meta["vocab_size"]
    model = build_model(ModelParams(n_layer=1, n_head=2, n_embd=8, block_size=16), data)
    assert model.get_input_embeddings().num_embeddings == data.vocab_size


def test_no_term_list_is_one_error(pretrained, tmp_path):
    from rarelm.errors import RarelmError

    with pytest.raises(RarelmError, match="rare.tfidf: false leaves no term"):
        tokenize(tmp_path, "tok", pretrained, RareParams(tfidf=False), add_terms=True)


def test_stage_without_a_term_list_exits_2_in_one_line_and_writes_nothing(tmp_path):
    from tests.conftest import REPO, assert_user_error, set_params, stage

    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    set_params(tmp_path, **{"tokenizer.add_terms": True, "tokenizer.vocab_size": 300,
                            "rare.tfidf": False})
    prepared = write_prepared(tmp_path / "prepared")
    result = stage("tokenize", REPO, "--params", str(tmp_path / "params.yaml"), "--prepared",
                   str(prepared), "--out", str(tmp_path / "tokenized"), "--metrics",
                   str(tmp_path / "tokenize.json"))
    assert_user_error(result, "rare.tfidf: false leaves no term", tmp_path, "tokenized",
                      "tokenize.json", stage="tokenize")


@pytest.mark.slow
def test_stages_train_and_evaluate_a_pretrained_model_with_the_terms_as_tokens(repo):
    """Through the stage CLIs on the tiny demo corpus: a tiny GPT-2 "pretrained" on the demo's own
    BPE, then tokenize with add_terms (TF-IDF terms), rare_terms, weights, 3 training steps and
    evaluate; the saved model and tokenizer hold the added tokens and load in plain transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from rarelm.files import read_json
    from tests.conftest import set_params, stage

    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{repo}/m.db", "OMP_NUM_THREADS": "1"}
    for name in ("prepare", "tokenize"):
        assert stage(name, repo, env=env).returncode == 0
    folder = repo.parent / "pretrained"  # the demo's tokenizer and a random tiny GPT-2
    shutil.copytree(repo / "data/tokenized/tokenizer", folder)
    meta = read_json(repo / "data/tokenized/meta.json")
    GPT2LMHeadModel(GPT2Config(vocab_size=meta["vocab_size"], n_positions=64, n_embd=16,
                               n_layer=1, n_head=2, bos_token_id=meta["eot_id"],
                               eos_token_id=meta["eot_id"])).save_pretrained(folder)
    set_params(repo, **{"tokenizer.name_or_path": str(folder), "model.name_or_path": str(folder),
                        "tokenizer.add_terms": True, "model.block_size": 64, "train.nproc": 1,
                        "train.max_steps": 3, "train.batch_size": 2, "train.warmup_steps": 1,
                        "train.eval_every": 3, "train.eval_batches": 1, "train.precision": "fp32",
                        "eval.max_terms": 20, "eval.diversity_prompts": 0,
                        "eval.insertion_prompts": 0, "eval.context_tokens": 16,
                        "eval.block_size": 64})
    for name in ("tokenize", "rare_terms", "weights", "train", "evaluate"):
        result = stage(name, repo, env=env)
        assert result.returncode == 0, f"{name}: {result.stderr[-2000:]}"
        if name == "tokenize":
            assert "terms added as tokens" in result.stdout
    added = read_json(repo / "data/tokenized/added_terms.json")
    n_added, base = len(added["terms"]), meta["vocab_size"]
    assert n_added > 0 and added["base_vocab_size"] == base
    # the term list is rare_terms': the added terms come in terms.jsonl's order
    listed = [json.loads(line)["term"] for line in
              (repo / "data/rare/terms.jsonl").read_text(encoding="utf-8").splitlines()]
    kept = [r["term"] for r in added["terms"]]
    assert [t for t in listed if t in set(kept)] == kept
    assert len(listed) == n_added + len(added["dropped"]["inside_words"]) + \
        len(added["dropped"]["one_token"]) + added["dropped"]["over_max"]
    model = AutoModelForCausalLM.from_pretrained(repo / "models/model")
    tokenizer = AutoTokenizer.from_pretrained(repo / "models/model")
    assert model.get_input_embeddings().num_embeddings == len(tokenizer) == base + n_added
    first = added["terms"][0]
    assert tokenizer.encode("a" + first["token"], add_special_tokens=False)[-1] == first["id"]
    train_ids = np.asarray(np.memmap(repo / "data/tokenized/train.tokens", dtype=np.uint16))
    assert (train_ids >= base).any()
    metrics = read_json(repo / "metrics/eval.json")
    assert metrics["n_eval_tokens"] > 0 and metrics["n_eval_terms"] > 0
