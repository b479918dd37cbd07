"""kNN-LM + continuous cache (rarelm/knn/): hand-computed distributions, the neutral setting bit for
bit, the hook against a by-hand computation on a tiny model, and the datastore stage."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rarelm.errors import RarelmError
from rarelm.knn.datastore import Datastore, final_hidden
from rarelm.knn.hook import attached
from rarelm.knn.interpolate import cache_log_probs, knn_log_probs, mix, vote_log_probs
from rarelm.params import RetrievalParams
from tests.conftest import REPO, run
from tests.helpers import TEXTS, argmax_loop

P_LM = torch.tensor([[0.5, 0.3, 0.2]]).log()


def knn_params(**kw):
    base = dict(enabled=True, k=16, weight=0.0, temperature=1.0, similarity="l2", cache_window=0,
                cache_weight=0.0, cache_temperature=1.0, cache_similarity="dot", gate_cosine=0.0,
                gate_entropy=0.0)
    return SimpleNamespace(**{**base, **kw})


def three_entries() -> Datastore:
    """Keys on a line at sqrt(0), sqrt(ln 2), sqrt(ln 4): squared distances to 0 are 0, ln 2, ln 4."""
    keys = np.array([[0.0, 0.0], [math.sqrt(math.log(2)), 0.0], [0.0, math.sqrt(math.log(4))]], np.float32)
    return Datastore(keys, torch.tensor([1, 1, 2]))


def test_three_entry_datastore_by_hand():
    store = three_entries()
    distances, values = store.search(torch.zeros(1, 2), k=3)
    assert values.tolist() == [[1, 1, 2]]
    assert distances[0].tolist() == pytest.approx([0.0, math.log(2), math.log(4)], abs=1e-6)
    # weights 1, 1/2, 1/4 -> 4/7, 2/7, 1/7; token 1 gets 6/7, token 2 gets 1/7
    knn = knn_log_probs(distances, values, 3, temperature=1.0)
    assert knn.exp()[0].tolist() == pytest.approx([0.0, 6 / 7, 1 / 7], abs=1e-6)
    # lambda 0.5: 0.5 * (0.5, 0.3, 0.2) + 0.5 * (0, 6/7, 1/7) = (0.25, 0.578571, 0.171429)
    mixed = mix(P_LM, 0.5, knn).exp()[0]
    assert mixed.tolist() == pytest.approx([0.25, 0.15 + 3 / 7, 0.1 + 1 / 14], abs=1e-6)
    assert float(mixed.sum()) == pytest.approx(1.0, abs=1e-6)
    # k = 2: the two nearest (weights 2/3, 1/3) both say token 1
    d2, v2 = store.search(torch.zeros(1, 2), k=2)
    assert knn_log_probs(d2, v2, 3, 1.0).exp()[0].tolist() == pytest.approx([0.0, 1.0, 0.0], abs=1e-6)
    # temperature 2 halves the exponents: weights 1, 2^-1/2, 1/2
    w = np.array([1, 2 ** -0.5, 0.5]) / (1 + 2 ** -0.5 + 0.5)
    assert knn_log_probs(distances, values, 3, 2.0).exp()[0].tolist() == \
        pytest.approx([0.0, w[0] + w[1], w[2]], abs=1e-6)


def test_search_is_exact_across_chunks(monkeypatch):
    import rarelm.knn.datastore as ds

    monkeypatch.setattr(ds, "CHUNK", 7)  # many chunks and a running top-k merge
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(50, 4, generator=gen)
    queries = torch.randn(5, 4, generator=gen)
    store = Datastore(keys.numpy(), torch.arange(50))
    distances, values = store.search(queries, k=6)
    full = torch.cdist(queries, keys) ** 2
    assert values.tolist() == full.topk(6, largest=False).indices.tolist()
    assert torch.allclose(distances, full.topk(6, largest=False).values, atol=1e-5)


def test_cache_on_a_three_token_history_by_hand():
    history = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    query = torch.tensor([[math.log(2), 0.0]])
    # scores ln 2, 0, ln 2 -> weights 2/5, 1/5, 2/5 on next tokens 2, 0, 2: p_cache = (1/5, 0, 4/5)
    every = torch.ones(1, 3, dtype=torch.bool)
    cache = cache_log_probs(query, history, torch.tensor([[2, 0, 2]]), every, 3, 1.0)
    assert cache.exp()[0].tolist() == pytest.approx([0.2, 0.0, 0.8], abs=1e-6)
    assert mix(P_LM, 0.0, None, 0.5, cache).exp()[0].tolist() == pytest.approx([0.35, 0.15, 0.5], abs=1e-6)
    # the last history entry hidden (another document): weights 2/3, 1/3 on tokens 2, 0
    visible = torch.tensor([[True, True, False]])
    cache = cache_log_probs(query, history, torch.tensor([[2, 0, 2]]), visible, 3, 1.0)
    assert cache.exp()[0].tolist() == pytest.approx([1 / 3, 0.0, 2 / 3], abs=1e-6)
    # both parts: (1 - 0.25 - 0.5) p_LM + 0.25 p_kNN + 0.5 p_cache
    knn = torch.tensor([[0.0, 1.0, 0.0]]).log()
    both = mix(P_LM, 0.25, knn, 0.5, cache).exp()[0]
    assert both.tolist() == pytest.approx([0.125 + 1 / 6, 0.075 + 0.25, 0.05 + 1 / 3], abs=1e-6)


def test_no_history_gives_its_weight_to_the_model():
    none = torch.zeros(1, 2, dtype=torch.bool)
    nothing = vote_log_probs(torch.zeros(1, 2), torch.tensor([[0, 1]]), 3, none)
    assert torch.isinf(nothing).all()
    assert torch.equal(mix(P_LM, 0.0, None, 0.5, nothing), P_LM)


def test_neutral_weights_return_the_model_log_probs_unchanged():
    knn = torch.tensor([[0.0, 1.0, 0.0]]).log()
    assert mix(P_LM, 0.0, knn, 0.0, knn) is P_LM


@pytest.fixture(scope="module")
def tiny():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=20, n_positions=32, n_embd=8, n_layer=1, n_head=2,
                                       bos_token_id=0, eos_token_id=0)).eval()
    tokens = torch.randint(1, 20, (200,), generator=torch.Generator().manual_seed(1))
    tokens[[40, 90, 150]] = 0  # documents end with the end-of-text token 0
    return model, tokens.numpy().astype(np.uint16)


def random_store(seed: int) -> Datastore:
    """30 random 8-dimensional keys (the tiny model's width) and their tokens, below 20 (its vocabulary)."""
    gen = torch.Generator().manual_seed(seed)
    return Datastore(torch.randn(30, 8, generator=gen).numpy(), torch.randint(0, 20, (30,), generator=gen))


def test_off_and_neutral_settings_are_the_model_bit_for_bit(tiny):
    from rarelm.evaluate.common import EvalContext
    from rarelm.evaluate.token_scoring import score_tokens
    from rarelm.params import EvalParams

    model, tokens = tiny
    buckets = np.zeros(20, dtype=np.int64)
    ctx = EvalContext(model, None, 0, EvalParams(batch_size=4))
    plain = score_tokens(ctx, tokens, buckets, 16)
    ids = torch.as_tensor(tokens[None, :32].astype(np.int64))
    with torch.no_grad():
        logits = model(ids).logits
    store = Datastore(np.ones((3, 8), np.float32), torch.tensor([1, 2, 3]))
    for knn in (knn_params(enabled=False, weight=0.5, cache_window=4, cache_weight=0.0),
                knn_params(enabled=False, weight=0.5, cache_window=0, cache_weight=0.3),
                knn_params(weight=0.0, cache_weight=0.0, cache_window=8)):
        with attached(model, store, knn, 0) as state:
            assert state is None
            stats = score_tokens(ctx, tokens, buckets, 16)
            with torch.no_grad():
                assert torch.equal(model(ids).logits, logits)
        for field in ("tokens", "nll", "top1", "top5"):
            assert np.array_equal(getattr(stats, field), getattr(plain, field))


def by_hand(model, ids: list[int], store, knn, eot: int) -> torch.Tensor:
    """log p of the mix at every position of one sequence, from the formulas, no hook."""
    x = torch.tensor([ids])
    hidden = final_hidden(model, x)[0]
    with torch.no_grad():
        lm = torch.log_softmax(model(x).logits[0].float(), -1)
    out = []
    for t in range(len(ids)):
        d, v = store.search(hidden[t:t + 1], knn.k)
        knn_part = knn_log_probs(d, v, lm.shape[-1], knn.temperature)
        first = max(0, t - knn.cache_window)
        # same document: no end-of-text token at positions i .. t - 1
        seen = [i for i in range(first, t) if eot not in ids[i:t]]
        following = torch.tensor([[ids[i + 1] for i in seen]])
        visible = torch.ones(1, len(seen), dtype=torch.bool)
        cache = cache_log_probs(hidden[t:t + 1], hidden[seen][None], following, visible, lm.shape[-1],
                                knn.cache_temperature, knn.cache_similarity)
        out.append(mix(lm[t:t + 1], knn.weight, knn_part, knn.cache_weight, cache)[0])
    return torch.stack(out)


def test_the_hook_mixes_what_the_formulas_say(tiny):
    from rarelm.evaluate.scoring import continuation_scores

    model, tokens = tiny
    store = random_store(seed=2)
    knn = knn_params(k=4, weight=0.3, temperature=5.0, cache_window=5, cache_weight=0.2,
                     cache_temperature=2.0)
    ids = [int(t) for t in tokens[30:52]]  # holds the end-of-text token at 40
    expected = by_hand(model, ids, store, knn, 0)
    with attached(model, store, knn, 0):
        with torch.no_grad():
            got = model(torch.tensor([ids])).logits[0]
        assert torch.allclose(got, expected, atol=1e-5)
        # the scoring path (right padding, logits of the scored positions only) reads the same numbers
        (nll, _), = continuation_scores(model, [ids[:10]], [ids[10:]], pad_id=0)
    true = expected[9:-1].gather(-1, torch.tensor(ids[10:])[:, None])[:, 0]
    assert np.allclose(nll, -true.double().numpy(), atol=1e-5)


@pytest.mark.parametrize("kind", ["dot", "cosine"])
def test_the_cache_alone_needs_no_datastore(tiny, kind):
    """knn.enabled false with the cache on (the remedies plans' `cache`): the hook mixes the cache
    alone, with no store, as the formulas say with lambda_knn 0 (dot products or cosines)."""
    model, tokens = tiny
    cache = dict(cache_window=5, cache_weight=0.2, cache_temperature=2.0 if kind == "dot" else 0.1,
                 cache_similarity=kind)
    ids = [int(t) for t in tokens[30:52]]
    unused = Datastore(np.zeros((1, 8), np.float32), torch.tensor([1]))  # by_hand's kNN part, weighed 0
    expected = by_hand(model, ids, unused, knn_params(k=1, weight=0.0, **cache), 0)
    with attached(model, None, knn_params(enabled=False, weight=0.5, **cache), 0) as state:
        assert state is not None and state.uses_cache and not state.uses_knn
        with torch.no_grad():
            got = model(torch.tensor([ids])).logits[0]
    assert torch.allclose(got, expected, atol=1e-5)
    with torch.no_grad():
        assert not torch.allclose(got, torch.log_softmax(model(torch.tensor([ids])).logits[0], -1), atol=1e-3)


def test_cosine_cache_votes_do_not_depend_on_the_states_scale():
    """knn.cache_similarity cosine: states 10x longer (a wider or differently normed model) vote the
    same, so a temperature chosen on one model means the same on another; dot products do not."""
    gen = torch.Generator().manual_seed(7)
    queries, history = torch.randn(3, 8, generator=gen), torch.randn(3, 5, 8, generator=gen)
    following, visible = torch.randint(0, 11, (3, 5), generator=gen), torch.ones(3, 5, dtype=torch.bool)

    def votes(scale: float, kind: str) -> torch.Tensor:
        return cache_log_probs(queries * scale, history * scale, following, visible, 11, 0.5, kind).exp()

    assert torch.allclose(votes(1.0, "cosine"), votes(10.0, "cosine"), atol=1e-6)
    assert not torch.allclose(votes(1.0, "dot"), votes(10.0, "dot"), atol=1e-3)


def test_cosine_knn_votes_are_cos_over_t_whatever_the_states_scale():
    """knn.similarity cosine: a neighbour's vote is exp(cos(q, k) / T), by hand; states 10x longer (a
    wider or differently normed model) vote the same, so a temperature carries across models; squared
    L2 distances do not. A store built for the other similarity is one error line."""
    from rarelm.knn.hook import Interpolation

    gen = torch.Generator().manual_seed(11)
    keys, queries = torch.randn(6, 4, generator=gen), torch.randn(2, 1, 4, generator=gen)
    values, lm = torch.tensor([1, 2, 3, 4, 5, 6]), torch.zeros(2, 1, 7)  # a uniform model over 7 tokens

    def mixed(scale: float, similarity: str) -> torch.Tensor:
        stored = keys * scale
        if similarity == "cosine":
            stored = torch.nn.functional.normalize(stored, dim=-1)
        store = Datastore(stored.numpy(), values, similarity=similarity)
        knn = knn_params(k=3, weight=0.5, temperature=0.25, similarity=similarity)
        return Interpolation(store, knn, None).after_head(None, (queries * scale,), lm).exp()

    cos = torch.nn.functional.cosine_similarity(queries[:, 0, None, :], keys[None], dim=-1)  # [2, 6]
    top = cos.topk(3, dim=-1)
    expected = torch.full((2, 7), 0.5 / 7)
    expected.scatter_add_(-1, values[top.indices], 0.5 * torch.softmax(top.values / 0.25, -1))
    assert torch.allclose(mixed(1.0, "cosine")[:, 0], expected, atol=1e-5)
    assert torch.allclose(mixed(10.0, "cosine"), mixed(1.0, "cosine"), atol=1e-5)
    assert not torch.allclose(mixed(10.0, "l2"), mixed(1.0, "l2"), atol=1e-3)
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=7, n_positions=8, n_embd=4, n_layer=1, n_head=1))
    store = Datastore(keys.numpy(), values)  # built for l2
    with pytest.raises(RarelmError, match="built for knn.similarity = l2, the params say cosine"):
        with attached(model, store, knn_params(weight=0.5, similarity="cosine"), 0):
            pass


def test_gated_knn_weight_follows_the_nearest_cosine_and_the_models_entropy_by_hand():
    """knn.gate_cosine c0: lambda * clip((cos_1 - c0) / (1 - c0), 0, 1), cos_1 the nearest key's cosine:
    a query on a key gets the full lambda, one at cosine 0.75 half of it (c0 0.5), one orthogonal to
    every key none, so its distribution is the model's, bit for bit. knn.gate_entropy H0: lambda *
    min(1, H / H0), H the model's entropy in nats. A gate on cosines with an l2 store is refused."""
    from rarelm.errors import RarelmError
    from rarelm.knn.hook import Interpolation
    from rarelm.params import KnnParams

    keys = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], np.float32)  # unit length, as a cosine store's
    store = Datastore(keys, torch.tensor([3, 4]), similarity="cosine")
    on_key, at_075, away = [1.0, 0.0, 0.0], [0.75, math.sqrt(1 - 0.75 ** 2), 0.0], [0.0, 0.0, 1.0]
    queries = torch.tensor([[on_key], [at_075], [away]])  # [3 rows, 1 position, 3]
    lm = torch.log_softmax(torch.tensor([[[0.0, 1.0, 2.0, 0.0, 0.0]]]).expand(3, 1, 5), -1)

    def mixed(**gate) -> torch.Tensor:
        knn = knn_params(k=1, weight=0.5, temperature=1.0, similarity="cosine", **gate)
        return Interpolation(store, knn, None).after_head(None, (queries,), lm.clone())[:, 0].exp()

    p = lm[:, 0].exp()
    by_hand = [0.5 * p[0] + 0.5 * torch.eye(5)[3], 0.75 * p[1] + 0.25 * torch.eye(5)[3]]
    got = mixed(gate_cosine=0.5)
    assert torch.allclose(got[0], by_hand[0], atol=1e-6) and torch.allclose(got[1], by_hand[1], atol=1e-6)
    assert torch.equal(got[2], p[2])  # nothing of the store: the model's own distribution
    assert torch.allclose(mixed()[2], 0.5 * p[2] + 0.5 * torch.eye(5)[3], atol=1e-6)  # ungated: half
    entropy = float(-(p[0] * p[0].log()).sum())
    half = mixed(gate_entropy=2 * entropy)  # the model's entropy is half of H0: lambda 0.25
    assert torch.allclose(half[0], 0.75 * p[0] + 0.25 * torch.eye(5)[3], atol=1e-6)
    with pytest.raises(RarelmError, match="knn.gate_cosine = 0.5 with knn.similarity = l2 is not allowed"):
        KnnParams(gate_cosine=0.5)
    for gate in ({"gate_cosine": 0.5, "similarity": "cosine"}, {"gate_entropy": 2.0}):  # nothing to gate
        with pytest.raises(RarelmError, match=f"knn.{next(iter(gate))} = .* with knn.enabled = false is not"):
            KnnParams(**gate)
    assert KnnParams(enabled=True, gate_entropy=2.0).gate_entropy == 2.0


def test_generation_with_the_kv_cache_matches_full_forwards(tiny):
    from rarelm.evaluate.decoding import greedy_continue

    model, tokens = tiny
    store = random_store(seed=3)
    knn = knn_params(k=4, weight=0.4, temperature=5.0, cache_window=6, cache_weight=0.4,
                     cache_temperature=0.5)
    prompts = [[int(t) for t in tokens[100:108]], [int(t) for t in tokens[120:125]]]
    with attached(model, store, knn, 0):
        fast = greedy_continue(model, prompts, 6, pad_id=0).tolist()
    for prompt, row in zip(prompts, fast, strict=True):
        seq = list(prompt)
        for _ in range(6):  # the slow way: the whole sequence each step, mixed by hand
            seq.append(int(by_hand(model, seq, store, knn, 0)[-1].argmax()))
        assert row == seq[len(prompt):]


def tiny_folders(tmp_path, tiny, lead: bool = False):
    """The model's folder and a tokenize stage's (tokens 0..19 as words "t0".."t19"; with `lead` the
    tokenizer starts every text with t0, as Gemma 3's starts it with <bos>)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    model, tokens = tiny
    model.save_pretrained(tmp_path / "model")
    tok = tmp_path / "tokenized"
    (tok / "tokenizer").mkdir(parents=True)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(20)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if lead:
        words.post_processor = processors.TemplateProcessing(single="t0 $A", special_tokens=[("t0", 0)])
    words.save(str(tok / "tokenizer/tokenizer.json"))
    tokens.tofile(tok / "train.tokens")
    (tok / "meta.json").write_text(json.dumps({"vocab_size": 20, "eot_id": 0, "dtype": "uint16",
                                               "splits": {"train": {"tokens": len(tokens)}}}))
    return tmp_path / "model", tok


@pytest.mark.parametrize("index", ["off", "exact", "ivf", "cosine", "lead"])
def test_datastore_stage(tmp_path, tiny, index):
    """Keys and values of the train split; with a tokenizer that starts texts with a lead token (Gemma 3's
    <bos>), every window is read after it, as evaluate reads it, and the lead gives no entry."""
    model, tokens = tiny
    model_dir, tok = tiny_folders(tmp_path, tiny, lead=index == "lead")
    enabled = index != "off"
    similarity = "cosine" if index == "cosine" else "l2"
    (tmp_path / "params.yaml").write_text(
        f"knn:\n  enabled: {str(enabled).lower()}\n  max_entries: 150\n  key_dtype: float32\n"
        f"  index: {'ivf' if index == 'ivf' else 'exact'}\n  nlist: 4\n  similarity: {similarity}\n"
        "eval:\n  block_size: 16\n  batch_size: 3\n  device: cpu\n")
    out = tmp_path / "datastore"
    result = run([sys.executable, "-m", "stages.datastore", "--params", str(tmp_path / "params.yaml"),
                  "--model", str(model_dir), "--tokenized", str(tok), "--out", str(out)],
                 tmp_path.parent, env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    meta = json.loads((out / "meta.json").read_text())
    if not enabled:
        assert meta == {"enabled": False} and sorted(p.name for p in out.iterdir()) == ["meta.json"]
        return
    expected = {"enabled": True, "entries": 150, "hidden": 8, "key_dtype": "float32", "block_size": 16,
                "index": "ivf" if index == "ivf" else "exact", "similarity": similarity,
                "lead": [0] if index == "lead" else []}
    assert meta == ({**expected, "nlist": 4} if index == "ivf" else expected)
    store = Datastore.open(out, nprobe=4)
    assert store.values.tolist() == tokens[1:151].tolist() and store.similarity == similarity
    # entry 20 is position 4 of the second 16-token window (tokens 16..32); cosine: unit length
    lead = [0] if index == "lead" else []
    window = torch.as_tensor(np.asarray([lead + tokens[16:32].tolist()], dtype=np.int64))
    state = final_hidden(model, window)[0, 4 + len(lead)]
    assert float(state.norm()) > 1.5  # GPT-2's final layer norm: norms near sqrt(8), not 1
    key = state / state.norm() if similarity == "cosine" else state
    assert np.allclose(store.keys[20], key.numpy(), atol=1e-6)
    if index == "ivf":  # every cluster searched: the exact neighbours
        queries = torch.as_tensor(np.asarray(store.keys[:10]))
        exact = dataclasses.replace(store, ivf=None)
        assert store.search(queries, 3)[1].tolist() == exact.search(queries, 3)[1].tolist()


def test_dense_retrieval_gives_what_followed_the_nearest_states(tmp_path, tiny):
    """retrieval.dense: the query is the model's state after its last query_tokens tokens; each of the
    nearest datastore keys gives the passage that followed it, the nearest last, passages a passage
    apart. Here the query reads window 2's first 5 tokens as that window did, so its state is entry
    20's key (distance 0) and the nearest passage is tokens 21..28; the other is the next key by a
    by-hand search whose passage starts at least 8 tokens from 21."""
    from rarelm.evaluate.common import EvalContext
    from rarelm.evaluate.retrieval import Retriever
    from rarelm.knn.datastore import NearestStates, build

    model, tokens = tiny
    meta = build(model, tokens, block_size=16, batch_size=4, out=tmp_path, key_dtype="float32")
    (tmp_path / "meta.json").write_text(json.dumps(meta))  # as the stage writes it
    store = Datastore.open(tmp_path)
    params = SimpleNamespace(passages=2, passage_tokens=8, query_tokens=5, max_passages=0, random=False,
                             dense=True)
    states = NearestStates(model, store, tokens)
    retriever = Retriever.build(EvalContext(model, None, 0), tokens, "en", params, states)
    query = tokens[16:21].tolist()
    state = final_hidden(model, torch.as_tensor([query], dtype=torch.long))[0, -1].numpy()
    distances = ((np.asarray(store.keys) - state) ** 2).sum(-1)
    order = np.argsort(distances, kind="stable")
    assert order[0] == 20 and distances[20] < 1e-9
    last = len(tokens) - 8
    second = next(min(e + 1, last) for e in order[1:] if abs(min(e + 1, last) - 21) >= 8)
    assert retriever.states.starts([[5, 5, *query]], params, 0) == [[21, second]]  # only the last 5 read
    prefix = retriever.prefix([5, 5, *query])
    assert retriever.width == 17 and prefix == [*tokens[second:second + 8], *tokens[21:29], 0]
    # queries of different lengths padded together, 70 of them over two forwards: each state is the
    # one its query gives alone (an empty one reads the end-of-text token)
    many = [tokens[i:i + 1 + i % 5].tolist() for i in range(70)] + [[]]
    alone = torch.cat([final_hidden(model, torch.as_tensor([q or [0]]))[:, -1] for q in many])
    assert torch.allclose(states.queries(many, 5, 0), alone, atol=1e-5)
    with pytest.raises(RarelmError, match="retrieval.dense needs the datastore stage's store of the model"):
        Retriever.build(EvalContext(model, None, 0), tokens, "en", params)
    with pytest.raises(RarelmError, match="retrieval.random = true is not allowed with retrieval.dense"):
        RetrievalParams(random=True, dense=True)


def test_closed_set_scoring_sees_the_prompt_history_either_way(tiny):
    """The tree layout and the row-per-prefix layout of candidate scoring give the same sums with the
    cache on: each candidate token sees the prompt's history, not its own earlier tokens."""
    from rarelm.evaluate.scoring import candidates_nll, tree_candidates_nll

    model, tokens = tiny
    store = Datastore(np.random.default_rng(4).standard_normal((30, 8)).astype(np.float32),
                      torch.as_tensor(np.random.default_rng(5).integers(0, 20, 30)))
    knn = knn_params(k=4, weight=0.3, temperature=5.0, cache_window=6, cache_weight=0.4,
                     cache_temperature=0.5)
    prompt = [int(t) for t in tokens[60:70]]
    candidates = [[3, 4, 5], [3, 4], [7], [7, 8, 9, 10]]
    with attached(model, store, knn, 0):
        rows = candidates_nll(model, prompt, candidates)
        tree = tree_candidates_nll(model, prompt, candidates)
    assert np.allclose(rows, tree, atol=1e-4)
    # the first token's NLL is the mixed distribution after the whole prompt, cache included
    first = by_hand(model, prompt, store, knn, 0)[-1]
    assert rows[2] == pytest.approx(-float(first[7]), abs=1e-5)


@pytest.mark.parametrize("lams", [(0.3, 0.2), (0.5, 0.5), (0.0, 0.4)])
def test_mixing_by_votes_is_the_dense_mix(lams):
    """mix_votes (what the hook runs: only voted tokens recomputed) against mix on dense parts,
    rows without cache votes included, and weights summing to 1 (the model's share 0)."""
    from rarelm.knn.interpolate import mix_votes, vote_weights

    gen = torch.Generator().manual_seed(6)
    lm = torch.log_softmax(3 * torch.randn(5, 11, generator=gen), -1)
    knn_ids = torch.randint(0, 11, (5, 4), generator=gen)
    cache_ids = torch.randint(0, 11, (5, 3), generator=gen)
    knn_scores, cache_scores = torch.randn(5, 4, generator=gen), torch.randn(5, 3, generator=gen)
    visible = torch.tensor([[True, True, False]] * 3 + [[False, False, False]] * 2)
    dense = mix(lm, lams[0], vote_log_probs(knn_scores, knn_ids, 11), lams[1],
                vote_log_probs(cache_scores, cache_ids, 11, visible))
    sparse = mix_votes(lm, [(lams[0], knn_ids, vote_weights(knn_scores)),
                            (lams[1], cache_ids, vote_weights(cache_scores, visible))])
    assert torch.allclose(sparse.exp(), dense.exp(), atol=1e-6)
    assert torch.allclose(sparse.exp().sum(-1), torch.ones(5), atol=1e-5)


@pytest.mark.slow
def test_evaluate_stage_mixes_the_datastore_in(eval_workspace, tmp_path):
    """datastore then evaluate on the tiny evaluate workspace (tests/conftest.py): one stderr line names
    the mix, and the val metrics move (a random model's val perplexity falls with the train split's
    memory); with knn off the same files give the plain metrics and no stderr."""
    import shutil

    import mlflow

    from tests.conftest import set_params, stage

    ws = tmp_path / "ws"
    shutil.copytree(eval_workspace, ws)
    client = mlflow.MlflowClient(f"sqlite:///{ws / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("rarelm")).info.run_id
    (ws / "models/model/mlflow_run.json").write_text(json.dumps(
        {"run_id": run_id, "tracking_uri": "sqlite:///mlflow.db", "experiment": "rarelm"}))
    env = {"OMP_NUM_THREADS": "1"}
    set_params(ws, **{"eval.splits": ["val"], "eval.closed_set": False})
    assert stage("datastore", ws, env=env).stdout.startswith("datastore: knn.enabled and retrieval.dense are")
    off = stage("evaluate", ws, env=env)
    # off: nothing mixed in, stderr only the seconds each measurement took
    assert off.returncode == 0 and off.stderr.startswith("evaluate: val split: finding terms "), off.stderr
    assert "mixing in" not in off.stderr and off.stderr.count("\n") == 1, off.stderr
    plain = json.loads((ws / "metrics/eval.json").read_text())

    set_params(ws, **{"knn.cache_window": 16, "knn.cache_weight": 0.2})  # the cache alone: no store
    assert stage("datastore", ws, env=env).stdout.startswith("datastore: knn.enabled and retrieval.dense are")
    cached = stage("evaluate", ws, env=env)
    mixing = cached.stderr.splitlines()[0]  # then the seconds each measurement took
    assert mixing == "evaluate: mixing in continuous cache (window 16, lambda 0.2, T 1)"
    alone = json.loads((ws / "metrics/eval.json").read_text())
    assert alone["n_eval_tokens"] == plain["n_eval_tokens"] and alone["ppl"] != plain["ppl"]

    set_params(ws, **{"knn.enabled": True, "knn.weight": 0.3, "knn.k": 8, "knn.temperature": 10.0,
                      "knn.cache_window": 16, "knn.cache_weight": 0.2})
    built = stage("datastore", ws, env=env)
    assert built.returncode == 0, built.stderr
    entries = json.loads((ws / "data/datastore/meta.json").read_text())["entries"]
    on = stage("evaluate", ws, env=env)
    assert on.returncode == 0, on.stderr
    assert on.stderr.splitlines()[0] == (
        f"evaluate: mixing in kNN-LM over {entries:,} datastore entries (k 8, lambda 0.3, T 10) + "
        "continuous cache (window 16, lambda 0.2, T 1)")
    mixed = json.loads((ws / "metrics/eval.json").read_text())
    assert mixed["n_eval_tokens"] == plain["n_eval_tokens"]
    assert mixed["ppl"] < plain["ppl"]
    assert mixed["term_nll_per_char"] != plain["term_nll_per_char"]



def test_a_datastore_of_another_model_is_one_error(tiny):
    from rarelm.errors import RarelmError

    model, _ = tiny
    store = Datastore(np.zeros((3, 5), np.float32), torch.tensor([1, 2, 3]))
    with pytest.raises(RarelmError, match="keys have 5 dimensions, the model's hidden states 8"):
        with attached(model, store, knn_params(weight=0.5), 0):
            pass


def test_an_ivf_index_searching_every_cluster_is_exact(tmp_path):
    """knn.index ivf: with nprobe = nlist every cluster is searched, so the neighbours are the exact
    ones; with nprobe 1 the search is cheaper and may miss some (never more than k found)."""
    from rarelm.knn.datastore import IVF_FILE, build_ivf

    keys = np.random.default_rng(7).standard_normal((400, 8)).astype(np.float32)
    queries = torch.as_tensor(np.random.default_rng(8).standard_normal((20, 8)).astype(np.float32))
    assert build_ivf(keys, tmp_path / IVF_FILE, nlist=10) == 10
    import faiss

    exact = Datastore(keys, torch.arange(400))
    ivf = Datastore(keys, torch.arange(400), ivf=faiss.read_index(str(tmp_path / IVF_FILE)), nprobe=10)
    (d_exact, v_exact), (d_ivf, v_ivf) = exact.search(queries, 5), ivf.search(queries, 5)
    assert v_ivf.tolist() == v_exact.tolist()
    assert torch.allclose(d_ivf, d_exact, atol=1e-4)
    ivf.nprobe = 1
    d_one, _ = ivf.search(queries, 5)
    assert bool((d_one[torch.isfinite(d_one)] >= d_exact[torch.isfinite(d_one)] - 1e-4).all())


def test_rarelm_generate_mixes_when_the_params_say_so(generate_model_dir, tmp_path):
    """`rarelm generate --params` with knn on: one stderr line naming the mix, and greedy text that is
    the argmax of the mixed distribution, computed by hand with full forwards."""
    from rarelm.evaluate.model_folder import load_causal_lm, load_model_tokenizer
    from rarelm.knn.datastore import build

    model, tok = load_causal_lm(generate_model_dir), load_model_tokenizer(generate_model_dir)
    ids = np.array([t for text in TEXTS[:3] for t in tok(text).input_ids + [tok.eos_token_id]], np.uint16)
    (tmp_path / "store").mkdir()
    meta = build(model, ids, 32, 4, tmp_path / "store")
    (tmp_path / "store/meta.json").write_text(json.dumps(meta))
    (tmp_path / "params.yaml").write_text("knn:\n  enabled: true\n  k: 4\n  weight: 0.5\n  temperature: 2.0\n"
                                          "  cache_window: 8\n  cache_weight: 0.3\n")
    result = run(["rarelm", "generate", "the patient presented", "--model", str(generate_model_dir),
                  "--greedy", "--max-tokens", "6", "--params", str(tmp_path / "params.yaml"), "--datastore",
                  str(tmp_path / "store")], tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stderr == (f"rarelm generate: mixing in kNN-LM over {len(ids) - 1} datastore entries (k 4, "
                             "lambda 0.5, T 2) + continuous cache (window 8, lambda 0.3, T 1)\n")
    knn = knn_params(k=4, weight=0.5, temperature=2.0, cache_window=8, cache_weight=0.3)
    store = Datastore.open(tmp_path / "store")
    seq = tok("the patient presented").input_ids
    want = []
    for _ in range(6):
        nxt = int(by_hand(model, seq + want, store, knn, tok.eos_token_id)[-1].argmax())
        want.append(nxt)
        if nxt == tok.eos_token_id:
            break
    assert result.stdout == "the patient presented" + tok.decode(want, skip_special_tokens=True) + "\n"
    assert want != argmax_loop(model, seq, 6, tok.eos_token_id)  # the mix changed what it wrote
