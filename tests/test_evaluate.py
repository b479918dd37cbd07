"""The evaluate stage: exact metrics on a model with known predictions, term search, batching, the CLI.

The hand-built model is a bigram table: after token a it ranks the next tokens
a+1, a+2, ... (mod 8) and gives rank r probability 2^-(r+1) (the last two 2^-7),
so every NLL is a whole number of ln 2 and every figure below is worked out by hand.
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
import yaml
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from rarelm import evaluate as ev
from rarelm import term_search
from rarelm.errors import RarelmError
from rarelm.lm import continuation_nll, greedy_continue
from rarelm.params import EvalParams
from rarelm.rare import load_buckets
from rarelm.term_search import Occurrence, Term
from tests.conftest import run, set_params, stage

LN2 = math.log(2)
V = 8


class BigramConfig(PretrainedConfig):
    model_type = "rarelm-test-bigram"

    def __init__(self, vocab_size: int = V, scale: float = 1.0, **kwargs):
        self.vocab_size, self.scale, self.num_hidden_layers = vocab_size, scale, 1
        super().__init__(**kwargs)


class BigramLM(PreTrainedModel, GenerationMixin):
    """logits[a] = log P(next | a); ignores everything but the last token (so the KV cache too)."""

    config_class = BigramConfig

    def __init__(self, config: BigramConfig):
        super().__init__(config)
        ranks = (np.arange(V)[None, :] - np.arange(V)[:, None] - 1) % V  # rank of next t after a
        logp = -np.minimum(ranks + 1, V - 1) * LN2
        self.table = torch.nn.Parameter(torch.tensor(logp * config.scale, dtype=torch.float32))

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        return CausalLMOutputWithPast(logits=self.table[input_ids])


def bigram(scale: float = 1.0) -> BigramLM:
    return BigramLM(BigramConfig(scale=scale)).eval()


# three documents, each ending in the end-of-text token 0
TOKENS = np.array([1, 2, 3, 5, 6, 0, 4, 5, 7, 1, 0, 6, 6, 0], dtype=np.uint16)
OFFSETS = np.array([0, 6, 11, 14])
BUCKETS = np.array([0, 0, 0, 0, 1, 1, 2, 3])  # 0-3 frequent, 4-5 medium, 6 rare, 7 unseen
TERMS = [Term("five six", 10, ((5, 6),)), Term("four five", 1, ((4, 5),)),
         Term("one two three", 3, ((1, 2, 3),)), Term("six six", 0, ((6, 6), (3, 5))),
         Term("seven two", 100, ((7, 2),))]


@pytest.mark.parametrize("block_size,batch_size", [(4, 2), (13, 1), (100, 8)])
def test_token_metrics_are_exact(block_size, batch_size):
    stats = ev.score_tokens(bigram(), TOKENS, BUCKETS, block_size, batch_size)
    m = stats.metrics()
    # targets 2 3 5 6 0 4 5 7 1 0 6 6 0 cost 1 1 2 1 2 4 1 2 2 7 6 7 2 bits
    assert m["n_eval_tokens"] == 13
    assert m["ppl"] == pytest.approx(2 ** (38 / 13), rel=1e-6)
    assert m["ppl_frequent"] == pytest.approx(2 ** (15 / 6), rel=1e-6)
    assert m["ppl_medium"] == pytest.approx(2 ** (7 / 3), rel=1e-6)
    assert m["ppl_rare"] == pytest.approx(2 ** (14 / 3), rel=1e-6)
    assert m["ppl_unseen"] == pytest.approx(4.0, rel=1e-6)
    assert (m["n_tokens_frequent"], m["n_tokens_medium"], m["n_tokens_rare"], m["n_tokens_unseen"]) == \
        (6, 3, 3, 1)
    assert (m["token_acc"], m["token_recall_at_5"]) == (4 / 13, 10 / 13)
    assert (m["acc_frequent"], m["recall_at_5_frequent"]) == (2 / 6, 5 / 6)
    assert (m["acc_medium"], m["recall_at_5_medium"]) == (1 / 3, 1.0)
    assert (m["rare_token_acc"], m["rare_token_recall_at_5"]) == (1 / 3, 1 / 3)
    assert (m["acc_unseen"], m["recall_at_5_unseen"]) == (0.0, 1.0)


def test_term_metrics_are_exact():
    samples = []
    metrics, bands = ev.evaluate_terms(bigram(), TOKENS, OFFSETS, TERMS, max_terms=100, context_tokens=2,
                                       batch_size=2, eot_id=0, samples=samples)
    # five six@3 -> [4 5]; four five@6 -> [1 2]; one two three@0 -> [1 2 3] (right);
    # six six: [3 5]@2 -> [3 4] (first right), [6 6]@11 -> [1 2]; seven two never occurs
    assert metrics == {"term_exact_match": 1 / 5, "term_first_token_acc": 2 / 5,
                       "term_nll": pytest.approx(2.6 * LN2, rel=1e-6), "n_eval_terms": 5,
                       "n_eval_term_types": 4, "n_term_occurrences": 5, "n_terms": 5}
    rows = [(b["band"], b["terms"], b["occurrences"], b["exact_match"], b["first_token_acc"]) for b in bands]
    assert rows == [
        ("band 00: 0", 1, 2, 0.0, 0.5), ("band 01: 1", 1, 1, 0.0, 0.0),
        ("band 02: 2-3", 1, 1, 1.0, 1.0), ("band 04: 8-15", 1, 1, 0.0, 0.0)]
    assert [b["nll"] / LN2 for b in bands] == pytest.approx([4.0, 2.5, 1.0, 1.5], rel=1e-6)
    assert [(r["term"], r["position"], r["prompt"], r["generated"], r["exact"]) for r in samples] == [
        ("five six", 3, [2, 3], [4, 5], False), ("four five", 6, [0], [1, 2], False),
        ("one two three", 0, [0], [1, 2, 3], True), ("six six", 2, [1, 2], [3, 4], False),
        ("six six", 11, [0], [1, 2], False)]


def test_term_cap_is_round_robin_and_deterministic():
    capped, _ = ev.evaluate_terms(bigram(), TOKENS, OFFSETS, TERMS, max_terms=3, context_tokens=2,
                                  batch_size=8, eot_id=0)
    # first occurrences of terms 0, 1, 2 (term 3's first comes in the next round)
    assert (capped["n_eval_terms"], capped["term_exact_match"], capped["n_eval_term_types"]) == (3, 1 / 3, 3)


def test_diversity_is_exact_for_a_deterministic_sampler():
    # scale 100: the top token is e^69 times likelier than the next, so sampling is greedy
    m = ev.diversity(bigram(scale=100), TOKENS, OFFSETS, BUCKETS, n_prompts=2, n_new=3, context_tokens=2,
                     batch_size=1, eot_id=0, seed=0)
    # prompts end at positions 1 and 11: generated 2 3 4 | 1 2 3; human 2 3 5 | 6 6 0
    assert m == {"gen_unique_tokens": 4, "human_unique_tokens": 5, "gen_rare_share": 0.0,
                 "human_rare_share": 2 / 6, "n_gen_tokens": 6}


def test_find_sequences_across_chunks_and_overlaps():
    tokens = np.array([1, 1, 1, 2, 1, 1, 2, 3] * 5)
    seqs = [[1, 1], [1, 2, 3], [3, 1, 1, 1], [9]]
    whole = term_search.find_sequences(tokens, seqs)
    naive = [[i for i in range(len(tokens) - len(s) + 1) if tokens[i:i + len(s)].tolist() == s] for s in seqs]
    assert [w.tolist() for w in whole] == naive
    for chunk in (1, 3, 7):  # matches that straddle a chunk border are still found, once
        assert [w.tolist() for w in term_search.find_sequences(tokens, seqs, chunk_tokens=chunk)] == naive


def test_occurrences_inside_a_word_are_dropped():
    # token 3 = "art", 4 = "st", 5 = " start", 6 = "." (joins: 1 ends in a letter, 2 starts with one)
    joins = np.array([0, 0, 0, 3, 3, 1, 0], dtype=np.int8)
    tokens = np.array([3, 0, 4, 3, 6, 3, 5, 3])
    per_term = term_search.find_occurrences(tokens, [Term("art", 1, ((3,),))], joins)
    assert [o.position for o in per_term[0]] == [0, 5]  # "st|art" (3) and " start|art" (7) sit inside words
    assert [o.position for o in term_search.find_occurrences(tokens, [Term("art", 1, ((3,),))])[0]] == \
        [0, 3, 5, 7]


def test_word_joins_from_a_real_tokenizer():
    from transformers import PreTrainedTokenizerFast

    from rarelm.tokenization import train_bpe

    tok = PreTrainedTokenizerFast(tokenizer_object=train_bpe(
        iter(["start art start art restart 心肌梗死"] * 5), vocab_size=300, min_frequency=1))
    joins = term_search.word_joins(tok, len(tok))
    ids = {text: tok.encode(text, add_special_tokens=False) for text in (" start", "art", "心")}
    assert len(ids[" start"]) == 1 and joins[ids[" start"][0]] == 1  # word-initial: ends, does not start
    assert len(ids["art"]) == 1 and joins[ids["art"][0]] == 3
    assert all(joins[i] == 0 for i in ids["心"])


def test_select_round_robin_prefers_breadth():
    per_term = [[Occurrence(0, p, (1,)) for p in range(10)], [Occurrence(1, 50, (2,))], []]
    chosen = term_search.select_round_robin(per_term, 4)
    assert [(o.term, o.position) for o in chosen] == [(0, 0), (1, 50), (0, 1), (0, 2)]


def tiny_random_lm(arch: str):
    """A random causal LM with a large init, so greedy output varies from token to token."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if arch == "gpt2":  # learned absolute positions
        return GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                          bos_token_id=0, eos_token_id=0, initializer_range=0.5)).eval()
    return LlamaForCausalLM(LlamaConfig(  # rotary positions, grouped-query attention
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
        initializer_range=0.5)).eval()


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_batched_generation_equals_one_at_a_time(arch):
    model = tiny_random_lm(arch)
    prompts = [[5, 6, 7, 8, 9], [1, 2], [3, 4, 5, 6, 7, 8, 9, 10], [11]]
    conts = [[1, 2], [3], [4, 5, 6], [7, 8, 9, 10]]
    batched = greedy_continue(model, prompts, 6, pad_id=0)
    single = torch.cat([greedy_continue(model, [p], 6, pad_id=0) for p in prompts])
    assert torch.equal(batched, single)
    model.generation_config.no_repeat_ngram_size = 1  # a folder's decoding preferences are not measured
    model.generation_config.repetition_penalty = 5.0
    assert torch.equal(greedy_continue(model, prompts, 6, pad_id=0), batched)
    assert model.generation_config.repetition_penalty == 5.0
    assert len(set(batched.flatten().tolist())) > 3  # a real, varied continuation, not one repeated token
    nll = continuation_nll(model, prompts, conts, pad_id=0)
    for p, c, got in zip(prompts, conts, nll, strict=True):
        logits = model(input_ids=torch.tensor([p + c])).logits[0].float()
        want = -torch.log_softmax(logits, -1)[torch.arange(len(p) - 1, len(p) + len(c) - 1), c]
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5)


def test_bad_rare_inputs_are_one_line_errors(tmp_path):
    np.save(tmp_path / "buckets.npy", np.zeros(5, dtype=np.int8))
    with pytest.raises(RarelmError, match=r"expected int8 \[8\] .* does not match the vocabulary"):
        load_buckets(tmp_path, 8)
    with pytest.raises(RarelmError, match="run the rare_terms stage first"):
        load_buckets(tmp_path / "nope", 8)
    (tmp_path / "terms.jsonl").write_text('{"term": "x", "count": 1}\n')
    with pytest.raises(RarelmError, match=r"terms.jsonl:1: not a term record"):
        term_search.load_terms(tmp_path / "terms.jsonl")
    with pytest.raises(RarelmError, match="eval.splits"):
        EvalParams(splits=["test", "test"])


# ---------------------------------------------------------------- the stage through its CLI


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_raw):
    """A folder with params.yaml, tokenized tiny corpus, synthetic rare files and a tiny GPT-2."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from rarelm import corpus, tokenization
    from rarelm.data import TokenizedData
    from rarelm.files import write_json
    from rarelm.params import load_params
    from tests.conftest import REPO

    root = tmp_path_factory.mktemp("ws")
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    set_params(root, **{"corpus.path": str(tiny_raw / "demo_en.txt.gz"), "tokenizer.vocab_size": 300,
                        "eval.max_terms": 40, "eval.batch_size": 8, "eval.diversity_prompts": 4,
                        "eval.diversity_tokens": 8, "eval.context_tokens": 16})
    params = load_params(root / "params.yaml")
    (root / "data/prepared").mkdir(parents=True)
    (root / "data/tokenized").mkdir()
    corpus.prepare(params.corpus, params.seed, root / "data/prepared")
    meta = tokenization.tokenize(params.tokenizer, root / "data/prepared", root / "data/tokenized")
    write_json(root / "data/tokenized/meta.json", meta)
    data = TokenizedData.open(root / "data/tokenized")
    counts = np.bincount(data.tokens("train"), minlength=data.vocab_size)
    buckets = np.select([counts == 0, counts < 5, counts < 50], [3, 2, 1], 0).astype(np.int8)
    (root / "data/rare").mkdir()
    np.save(root / "data/rare/buckets.npy", buckets)
    np.save(root / "data/rare/counts.npy", counts.astype(np.int64))
    with open(root / "data/rare/terms.jsonl", "w") as f:  # every bigram of the test split's first doc
        for a, b in zip(data.tokens("test")[:30:2], data.tokens("test")[1:30:2], strict=True):
            f.write(json.dumps({"term": f"{a}-{b}", "source": "tfidf", "count": int(counts[a]), "df": 1,
                                "idf": 1.0, "score": 1.0, "token_ids": [[int(a), int(b)]]}) + "\n")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=data.vocab_size, n_positions=32, n_embd=32, n_layer=1,
                                       n_head=2, bos_token_id=data.eot_id, eos_token_id=data.eot_id))
    model.save_pretrained(root / "models/model")
    for path in data.tokenizer_dir.iterdir():
        shutil.copy(path, root / "models/model")
    return root


def _hf_ppl(model_dir, tokens, block):
    """Perplexity by torch's cross_entropy, window by window: an independent check of score_tokens."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(tokens) - 1, block):
            ids = torch.tensor(tokens[s:s + block + 1].astype(np.int64))[None]
            logits = model(input_ids=ids[:, :-1]).logits[0]
            total += torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
            n += ids.shape[1] - 1
    return math.exp(total / n), n


def test_stage_writes_metrics_plots_and_logs_into_the_training_run(workspace, tmp_path):
    import mlflow

    from rarelm.data import TokenizedData

    ws = tmp_path / "ws"
    shutil.copytree(workspace, ws)
    uri = f"sqlite:///{ws / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("rarelm")).info.run_id
    (ws / "models/model/mlflow_run.json").write_text(json.dumps(
        {"run_id": run_id, "tracking_uri": uri, "experiment": "rarelm"}))

    set_params(ws, **{"eval.splits": ["test", "val"]})
    result = stage("evaluate", ws, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.count("\n") == 1 and result.stdout.startswith("evaluate: test ppl ")
    m = json.loads((ws / "metrics/eval.json").read_text())
    test_tokens = np.asarray(TokenizedData.open(ws / "data/tokenized").tokens("test"))
    ppl, n = _hf_ppl(ws / "models/model", test_tokens, block=32)
    assert m["n_eval_tokens"] == n == len(test_tokens) - 1
    assert m["ppl"] == pytest.approx(ppl, rel=1e-5)
    # the overall perplexity is the token-weighted geometric mean of the buckets'
    parts = [(m[f"n_tokens_{b}"], m[f"ppl_{b}"]) for b in ev.BUCKETS if m[f"n_tokens_{b}"]]
    assert sum(k for k, _ in parts) == n
    assert math.exp(sum(k * math.log(p) for k, p in parts) / n) == pytest.approx(m["ppl"], rel=1e-9)
    assert 0 < m["n_eval_terms"] <= 40 and 0 <= m["term_exact_match"] <= m["term_first_token_acc"] <= 1
    assert m["n_gen_tokens"] == 4 * 8
    val_tokens = TokenizedData.open(ws / "data/tokenized").tokens("val")
    assert m["val"]["n_eval_tokens"] == len(val_tokens) - 1 and m["val"]["ppl"] > 1

    buckets_csv = (ws / "plots/eval_buckets.csv").read_text().splitlines()
    assert buckets_csv[0] == "bucket,tokens,ppl,acc,recall_at_5"
    assert buckets_csv[1].startswith(f"all,{n},{m['ppl']:.6g},")
    bands = (ws / "plots/eval_term_bands.csv").read_text().splitlines()
    assert sum(int(line.split(",")[2]) for line in bands[1:]) == m["n_eval_terms"]

    logged = client.get_run(run_id)
    assert logged.data.metrics["eval/ppl"] == pytest.approx(m["ppl"])
    assert logged.data.metrics["eval/n_eval_terms"] == m["n_eval_terms"]
    assert logged.data.metrics["eval/val/ppl"] == pytest.approx(m["val"]["ppl"])
    assert "evaluate" in logged.data.tags["stages"]
    artifacts = {a.path for a in client.list_artifacts(run_id, "eval")}
    assert artifacts == {"eval/eval.json", "eval/eval_buckets.csv", "eval/eval_term_bands.csv",
                         "eval/term_samples.jsonl"}
    samples_file = client.download_artifacts(run_id, "eval/term_samples.jsonl", str(tmp_path))
    samples = [json.loads(line) for line in open(samples_file, encoding="utf-8")]
    assert len(samples) == m["n_eval_terms"]
    assert sum(s["exact"] for s in samples) == round(m["term_exact_match"] * m["n_eval_terms"])


def test_unreachable_store_is_one_warning_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    run_file = tmp_path / "mlflow_run.json"
    run_file.write_text(json.dumps({"run_id": "0" * 32, "tracking_uri": "http://127.0.0.1:9",
                                    "experiment": "rarelm"}))
    assert ev.log_to_mlflow(run_file, {"ppl": 3.0}, []) is False
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rarelm evaluate: warning: MLflow tracking store")
    assert ev.log_to_mlflow(tmp_path / "missing.json", {"ppl": 3.0}, []) is False
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "trained without tracking" in lines[0]


@pytest.mark.parametrize("breakage,message", [
    ("no_model", "models/model: no such model folder"),
    ("no_terms", "data/rare/terms.jsonl: no such file; run the rare_terms stage first"),
    ("no_buckets", "data/rare/buckets.npy: not found; run the rare_terms stage first"),
])
def test_bad_inputs_are_one_line_errors_without_output(workspace, tmp_path, breakage, message):
    ws = tmp_path / "ws"
    shutil.copytree(workspace, ws)
    if breakage == "no_model":
        shutil.rmtree(ws / "models/model")
    else:
        (ws / "data/rare" / ("terms.jsonl" if breakage == "no_terms" else "buckets.npy")).unlink()
    result = stage("evaluate", ws)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (ws / "metrics").exists() and not (ws / "plots").exists()


def test_folder_that_is_not_a_causal_lm(tmp_path):
    """In-process (the stage path is the same as above): transformers is already imported here."""
    from rarelm.lm import load_causal_lm

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(RarelmError, match="not a loadable causal language model") as info:
        load_causal_lm(tmp_path)
    assert "\n" not in str(info.value)


def test_dvc_plots_show_renders_the_eval_plots(repo):
    """dvc.yaml declares both CSVs with their templates; `dvc plots show` draws them."""
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]
    plots = {next(iter(p)): p[next(iter(p))] for p in stages["evaluate"]["plots"]}
    assert plots["plots/eval_buckets.csv"]["template"] == "bar_horizontal"
    (repo / "plots").mkdir(exist_ok=True)
    (repo / "plots/eval_buckets.csv").write_text("bucket,tokens,ppl,acc,recall_at_5\nall,10,5.5,0.3,0.6\n"
                                                 "rare,2,40.25,0.1,0.2\n")
    (repo / "plots/eval_term_bands.csv").write_text(
        "band,terms,occurrences,exact_match,first_token_acc,nll\nband 01: 1,3,4,0.25,0.5,3.5\n")
    result = run(["dvc", "plots", "show", "-o", "out", "plots/eval_buckets.csv", "plots/eval_term_bands.csv"],
                 repo, check=True)
    html = (repo / "out/index.html").read_text()
    assert "40.25" in html and "band 01: 1" in html and "bar" in html, result.stdout

