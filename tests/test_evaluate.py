"""The evaluate stage: exact metrics on a model with known predictions, term search, batching, the CLI.

The hand-built model is a bigram table: after token a it ranks the next tokens
a+1, a+2, ... (mod 8) and gives rank r probability 2^-(r+1) (the last two 2^-7),
so every NLL is a whole number of ln 2 and every figure below is worked out by hand.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from rarelm.artifacts.buckets import load_buckets
from rarelm.artifacts.terms import Term, load_terms
from rarelm.errors import RarelmError
from rarelm.evaluate.common import EvalContext, SplitText
from rarelm.evaluate.decoding import greedy_continue, logit_adjustment
from rarelm.evaluate.false_insertion import count_terms, false_insertion, term_start_mask
from rarelm.evaluate.mlflow_log import log_eval_files, log_eval_metrics
from rarelm.evaluate.scoring import candidates_nll, continuation_nll
from rarelm.evaluate.term_generation import evaluate_terms
from rarelm.evaluate.term_metrics import em50_train_count, term_metrics
from rarelm.evaluate.token_scoring import BUCKETS as BUCKET_NAMES
from rarelm.evaluate.token_scoring import score_tokens
from rarelm.params import EvalParams, load_params
from rarelm.rare_terms import term_search
from rarelm.rare_terms.term_search import Occurrence
from tests.conftest import REPO, assert_user_error, run, set_params, stage, tokenized_in

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


def context(model, tokenizer=None, eot_id: int = 0, **eval_params) -> EvalContext:
    """An evaluation context of `model` with these eval params (the others their defaults)."""
    return EvalContext(model, tokenizer, eot_id, EvalParams(**eval_params))


# Three documents written in characters 一..七, one token each (token i = CHARS[i]; 〇 = 0 is
# the end-of-text token), so every token is a whole character and the text is Chinese-like.
CHARS = "〇一二三四五六七"
DOCS = ["一二三五六", "四五七一", "六六"]
TOKENS = np.array([1, 2, 3, 5, 6, 0, 4, 5, 7, 1, 0, 6, 6, 0], dtype=np.uint16)
OFFSETS = np.array([0, 6, 11, 14])
BUCKETS = np.array([0, 0, 0, 0, 1, 1, 2, 3])  # 0-3 frequent, 4-5 medium, 6 rare, 7 unseen
TERMS = [Term("五六", 10), Term("四五", 1), Term("一二三", 3), Term("六六", 0), Term("七二", 100),
         Term("三五", 5)]
SPLIT = SplitText("test", TOKENS, OFFSETS, DOCS)


def char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(CHARS)}, unk_token=CHARS[0]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return tok


def bits(a: int, b: int) -> int:
    """-log2 P(b | a) under the bigram model."""
    return min((b - a - 1) % V + 1, V - 1)


def test_a_token_budget_scores_windows_spread_over_the_split():
    """eval.max_tokens 6 with windows of 4: two of the four windows (targets 1-4 and 13), the first and
    the last, 5 targets costing 1 1 2 1 + 2 bits."""
    m = score_tokens(context(bigram(), batch_size=2, max_tokens=6), TOKENS, BUCKETS, 4).metrics()
    assert m["n_eval_tokens"] == 5 and m["ppl"] == pytest.approx(2 ** (7 / 5), rel=1e-6)
    budget = context(bigram(), batch_size=2, max_tokens=100)
    assert score_tokens(budget, TOKENS, BUCKETS, 4).metrics()["n_eval_tokens"] == 13


@pytest.mark.parametrize("block_size,batch_size", [(4, 2), (13, 1), (100, 8)])
def test_token_metrics_are_exact(block_size, batch_size):
    per_term = term_search.find_occurrences(char_tokenizer(), DOCS, TOKENS, OFFSETS, TERMS)
    mask = term_search.term_token_mask(per_term, len(TOKENS))
    assert np.flatnonzero(mask).tolist() == [0, 1, 2, 3, 4, 6, 7, 11, 12]
    stats = score_tokens(context(bigram(), batch_size=batch_size), TOKENS, BUCKETS, block_size, mask)
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
    # term tokens: targets at positions 1 2 3 4 6 7 11 12 cost 1 1 2 1 4 1 6 7 bits
    assert m["n_tokens_term"] == 8 and m["ppl_term"] == pytest.approx(2 ** (23 / 8), rel=1e-6)
    assert (m["acc_term"], m["recall_at_5_term"]) == (4 / 8, 6 / 8)


def test_term_rows_are_exact():
    rows = evaluate_terms(context(bigram(), char_tokenizer(), max_terms=100, context_tokens=2, batch_size=2),
                          SPLIT, TERMS)
    # the bigram model writes a+1, a+2, ... after token a
    got = [(r["term"], r["doc"], r["char_start"], r["prompt_tokens"], r["output"], r["exact_match"],
            r["first_token_hit"]) for r in rows]
    assert got == [("五六", 0, 3, 2, "四五六", False, False),  # prompt 二三
                   ("四五", 1, 0, 1, "一二三", False, False),  # prompt: end-of-text only
                   ("一二三", 0, 0, 1, "一二三四", True, True),
                   ("六六", 2, 0, 1, "一二三", False, False),
                   ("三五", 0, 2, 2, "三四五", False, True)]  # prompt 一二; 七二 never occurs
    assert [r["nll"] / LN2 for r in rows] == pytest.approx([1.5, 2.5, 1.0, 6.5, 1.5], rel=1e-6)
    assert [r["band"] for r in rows] == ["8-15", "1", "2-3", "0", "4-7"]
    assert {r["mention"] for r in rows} == {"first"} and {r["n_choices"] for r in rows} == {6}
    # closed-set rank: 1 + the terms whose summed NLL after the prompt is lower than the true term's
    prompts = {"五六": [2, 3], "四五": [0], "一二三": [0], "六六": [0], "三五": [1, 2]}
    for r in rows:
        def cost(term: str, prompt=prompts[r["term"]]) -> int:
            ids = [prompt[-1]] + [CHARS.index(c) for c in term]
            return sum(bits(a, b) for a, b in zip(ids, ids[1:], strict=False))
        assert r["choice_rank"] == 1 + sum(cost(t.text) < cost(r["term"]) for t in TERMS), r["term"]
    assert [r["choice_rank"] for r in rows][:3] == [2, 2, 1]

    m = term_metrics(rows, n_terms=len(TERMS), n_occurrences=5)
    assert (m["term_exact_match"], m["term_first_token_acc"], m["n_eval_terms"]) == (1 / 5, 2 / 5, 5)
    assert m["term_nll"] == pytest.approx(13 / 5 * LN2)
    assert m["term_choice_acc"] == sum(r["choice_rank"] == 1 for r in rows) / 5
    assert (m["term_exact_match_first"], m["n_eval_terms_first"], m["n_eval_terms_repeat"]) == (1 / 5, 5, 0)
    assert m["term_exact_match_repeat"] is None
    assert (m["term_exact_match_le15"], m["n_eval_terms_le15"]) == (1 / 5, 5)
    assert (m["term_exact_match_band_2-3"], m["term_exact_match_band_8-15"]) == (1.0, 0.0)
    assert (m["n_eval_term_types"], m["n_term_occurrences"], m["n_terms"]) == (5, 5, 6)
    assert m["term_repeat_share"] == 0.0  # every row a first mention


def test_completion_match_given_the_first_token_and_strata():
    """The term's first token given after the prompt, the bigram model writes on (a+1, a+2, ...); the
    strata 0-1 / 2-15 / 16+ by train count, each with its term perplexity exp(mean NLL per token)."""
    # the occurrences given, so that how the search finds them does not matter here:
    # (term, doc, char_start, split positions [start, end) of the covering tokens)
    found = [(0, 0, 3, 3, 5), (1, 1, 0, 6, 8), (2, 0, 0, 0, 3), (3, 2, 0, 11, 13), (5, 0, 2, 2, 4)]
    per_term = [[] for _ in TERMS]
    for term, doc, char, start, end in found:
        per_term[term].append(Occurrence(term, doc, char, start, end, "", "first", TERMS[term].text))
    rows = evaluate_terms(context(bigram(), char_tokenizer(), max_terms=100, context_tokens=2, batch_size=2,
                                  closed_set=False), SPLIT, TERMS, per_term)
    # 五六: 五 given, then 六七: match; 四五: 四 given, then 五六: match; 一二三: its own first token
    # was right, so what it wrote (一二三四) is the completion; 六六: 六 given, then 七: no; 三五: 三四五: no
    assert [(r["term"], r["completion_match"]) for r in rows] == [
        ("五六", True), ("四五", True), ("一二三", True), ("六六", False), ("三五", False)]
    m = term_metrics(rows, n_terms=len(TERMS), n_occurrences=5)
    assert m["term_completion_match"] == 3 / 5 and m["term_exact_match"] == 1 / 5
    assert m["term_ppl"] == pytest.approx(2 ** (13 / 5), rel=1e-6)  # bits per token 1.5 2.5 1 6.5 1.5
    # 0-1: 四五 (seen once; 2.5 bits a token) and 六六 (unseen; 6.5); 2-15: 五六 (10), 一二三 (3), 三五 (5)
    assert [m[f"n_eval_terms_seen_{s}"] for s in ("0-1", "2-15", "16_up")] == [2, 3, 0]
    assert m["term_ppl_seen_0-1"] == pytest.approx(2 ** 4.5, rel=1e-6)
    assert m["term_ppl_seen_2-15"] == pytest.approx(2 ** (4 / 3), rel=1e-6)
    assert (m["term_completion_match_seen_0-1"], m["term_completion_match_seen_2-15"]) == (1 / 2, 2 / 3)
    assert m["term_ppl_seen_16_up"] is None and m["term_exact_match_seen_16_up"] is None


def test_term_trie_decoding_continues_a_term_the_model_begins_and_leaves_the_scores_alone():
    """eval.term_trie: once the model's own tokens end inside a term (the longest suffix of them on
    a trie path is a term's proper prefix), the next token continues it; a suffix that is a whole
    term leaves the model free, and the prompt's text opens no term. Teacher-forced NLLs are those of
    the model alone."""
    from rarelm.evaluate.decoding import constrained, sample_continue
    from rarelm.evaluate.term_trie import term_trie

    found = [(0, 0, 3, 3, 5), (1, 1, 0, 6, 8), (2, 0, 0, 0, 3), (3, 2, 0, 11, 13), (5, 0, 2, 2, 4)]
    per_term = [[] for _ in TERMS]
    for term, doc, char, start, end in found:
        per_term[term].append(Occurrence(term, doc, char, start, end, "", "first", TERMS[term].text))

    def rows():
        ctx = context(bigram(), char_tokenizer(), max_terms=100, context_tokens=2, batch_size=2,
                      closed_set=False)
        return evaluate_terms(ctx, SPLIT, TERMS, per_term)

    plain = rows()
    paths = term_trie(char_tokenizer(), TERMS, lead="")
    with constrained(paths):
        trie = rows()
        torch.manual_seed(0)
        sampled = sample_continue(bigram(), [[1, 6]] * 32, n_new=2, pad_id=0).tolist()
    # sampling: the prompt's 六 opens nothing (六六 would force 六 first); a sampled first token that
    # begins a term is followed by a token that continues it
    assert len({first for first, _ in sampled}) > 2
    opened = [(first, second) for first, second in sampled if paths.allowed([first]) is not None]
    assert len(opened) >= 8 and all(second in paths.allowed([first]) for first, second in opened)
    # 五六 after 二三: the prompt's 三 (of 三五) opens nothing; the model's 四 opens 四五, then free: 六;
    # 三五 after 一二: the model's 三 opens 三五 (the prompt's 一二 with it would make 一二三, whole):
    # 三五六, where the model alone wrote 三四五; given 三, 三五 too
    assert [(r["term"], r["output"], r["exact_match"], r["completion_match"]) for r in trie] == [
        ("五六", "四五六", False, True), ("四五", "一二三", False, True), ("一二三", "一二三四", True, True),
        ("六六", "一二三", False, True), ("三五", "三五六", True, True)]
    assert [(r["output"], r["completion_match"]) for r in plain] == [
        ("四五六", True), ("一二三", True), ("一二三四", True), ("一二三", False), ("三四五", False)]
    assert [r["nll_sum"] for r in trie] == [r["nll_sum"] for r in plain]
    # the gate (eval.term_trie_min_mass): a step is constrained only where the model puts that much on
    # the term's continuations; the bigram puts under 5% on 六 after 六 and 20-50% on 五 after 三
    outputs = {}
    for gate in (0.05, 0.5):
        with constrained(term_trie(char_tokenizer(), TERMS, lead="", min_mass=gate)):
            outputs[gate] = [(r["output"], r["completion_match"]) for r in rows()]
    assert outputs[0.05] == [("四五六", True), ("一二三", True), ("一二三四", True), ("一二三", False),
                             ("三五六", True)]
    assert outputs[0.5] == [(r["output"], r["completion_match"]) for r in plain]


def test_retrieval_puts_the_best_passage_before_prompts_and_windows_and_scores_only_the_window():
    """retrieval.*: BM25 over the train split's passages; the best passage (then end-of-text) goes
    before every scored window and term prompt. The bigram model reads only the last token, so the
    passage changes no score: the same perplexity and term NLLs as without it prove that only the
    window's own targets are scored, each at its own position."""
    from types import SimpleNamespace

    from rarelm.evaluate.retrieval import Retriever, retrieving

    # passages of 2 tokens, one word each: 一二 | 三四 | 五六 | 七七 (the last token left out); the
    # text of the 2 tokens before a position is the query: 五六 finds the third passage
    train = np.array([1, 2, 3, 4, 5, 6, 7, 7, 1], dtype=np.uint16)
    params = SimpleNamespace(passages=1, passage_tokens=2, query_tokens=2, max_passages=0)
    retriever = Retriever.build(context(None, char_tokenizer()), train, "en", params)
    assert retriever.passages.tolist() == [[1, 2], [3, 4], [5, 6], [7, 7]] and retriever.width == 3
    assert retriever.prefix([1, 5, 6]) == [5, 6, 0] and retriever.prefix([3, 4]) == [3, 4, 0]
    two = Retriever.build(context(None, char_tokenizer()), train, "en",
                          SimpleNamespace(**{**vars(params), "passages": 2}))
    assert two.prefix([7, 7])[-3:] == [7, 7, 0] and two.width == 5  # the best last, nearest the prompt
    with pytest.raises(RarelmError, match="the train split holds 1 passages of 2 tokens, fewer than "
                                          "retrieval.passages = 2"):
        Retriever.build(context(None, char_tokenizer()), train[:3], "en",
                        SimpleNamespace(**{**vars(params), "passages": 2}))
    # the control (retrieval.random): distinct passages drawn by the seed, whatever the query
    control = {**vars(params), "passages": 2, "random": True}
    seeded = EvalContext(None, char_tokenizer(), 0, seed=7)
    draws = [Retriever.build(seeded, train, "en", SimpleNamespace(**control))
             .prefixes([[5, 6], [1, 2], [5, 6]]) for _ in range(2)]
    assert draws[0] == draws[1] and len({tuple(p) for p in draws[0]}) > 1  # seeded, not by the query
    for prefix in draws[0]:
        pair = sorted(prefix[:2]), sorted(prefix[2:4])
        assert len(prefix) == two.width and prefix[-1] == 0 and pair[0] != pair[1]
        assert all(list(p) in [sorted(q) for q in retriever.passages.tolist()] for p in pair)
    ctx = context(bigram(), char_tokenizer(), max_terms=100, context_tokens=2, batch_size=2, closed_set=False)
    plain = score_tokens(ctx, TOKENS, BUCKETS, block_size=4).metrics()
    rows = evaluate_terms(ctx, SPLIT, TERMS)
    with retrieving(retriever):
        found = score_tokens(ctx, TOKENS, BUCKETS, block_size=4).metrics()
        retrieved = evaluate_terms(ctx, SPLIT, TERMS)
    assert found["n_eval_tokens"] == plain["n_eval_tokens"] and found["ppl"] == pytest.approx(plain["ppl"])
    assert [r["nll_sum"] for r in retrieved] == pytest.approx([r["nll_sum"] for r in rows])
    assert all(r["prompt_tokens"] == p["prompt_tokens"] + 3 for r, p in zip(retrieved, rows, strict=True))


def test_a_lead_token_goes_before_every_window_prompt_and_sample_and_is_never_scored():
    """A tokenizer that starts every text with <bos> (Gemma 3's post-processor) has it found by
    `lead_ids`, and under `leading` it stands before every scored window, term prompt and sampled
    continuation: the windows' NLLs equal those computed by hand with <bos> in front, the same targets
    are scored, every prompt is one token longer and every sample starts from it."""
    from tokenizers import processors

    from rarelm.artifacts.tokenized import lead_ids
    from rarelm.evaluate.diversity import sampled_continuations
    from rarelm.evaluate.prefix import leading, window

    bos = 9
    tokenizer = char_tokenizer()
    assert lead_ids(tokenizer) == []  # GPT-2 style: nothing before a text
    tokenizer.post_processor = processors.TemplateProcessing(single="[B] $A", special_tokens=[("[B]", bos)])
    assert lead_ids(tokenizer) == [bos] and tokenizer.encode("一二").ids == [bos, 1, 2]
    tokenizer.post_processor = processors.TemplateProcessing(single="$A [B]", special_tokens=[("[B]", bos)])
    assert lead_ids(tokenizer) == []  # a token after the text is no lead
    assert window(0, 512, 1) == 511

    model = tiny_random_lm("gemma3")
    ctx = context(model, char_tokenizer(), max_terms=100, context_tokens=2, batch_size=2, closed_set=False)
    plain = score_tokens(ctx, TOKENS, BUCKETS, block_size=4).metrics()
    prompts = evaluate_terms(ctx, SPLIT, TERMS)
    seen = []
    model.register_forward_pre_hook(lambda _m, _a, kw: seen.append(
        (kw["input_ids"], kw.get("attention_mask"))), with_kwargs=True)
    with leading([bos]):
        led = score_tokens(ctx, TOKENS, BUCKETS, block_size=4).metrics()
        rows = evaluate_terms(ctx, SPLIT, TERMS)
        seen.clear()
        sampled_continuations(context(model, context_tokens=2, batch_size=3), SPLIT, n_prompts=3, n_new=2)
    ids, mask = seen[0]  # the first forward of the samples: each prompt (left-padded) led by <bos>
    assert ids[torch.arange(3), mask.argmax(1)].tolist() == [bos] * 3
    nll = []
    with torch.no_grad():
        for start in range(0, len(TOKENS) - 1, 4):
            window_ = [int(t) for t in TOKENS[start:start + 5]]
            inputs = torch.tensor([[bos, *window_[:-1]]])
            logp = torch.log_softmax(model(input_ids=inputs).logits[0].double(), -1)
            nll += [-logp[i + 1, t].item() for i, t in enumerate(window_[1:])]
    assert led["n_eval_tokens"] == plain["n_eval_tokens"] == len(nll) == len(TOKENS) - 1
    assert led["ppl"] == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-5) != pytest.approx(plain["ppl"])
    assert [r["prompt_tokens"] for r in rows] == [r["prompt_tokens"] + 1 for r in prompts]


def test_general_text_perplexity_by_hand(tmp_path):
    """ppl_general: documents 一二 and 三 as the stream 1 2 <eot> 3 <eot>; the targets cost
    bits(1, 2) = 1, bits(2, 0) = 6, bits(0, 3) = 3, bits(3, 0) = 5: 15 bits over 4 tokens."""
    from rarelm.evaluate.general_text import general_metrics, token_stream

    path = tmp_path / "general.txt"
    path.write_text("一二\n\n三\n", encoding="utf-8")  # an empty line is no document
    assert token_stream(char_tokenizer(), ["一二", "三"], 0).tolist() == [1, 2, 0, 3, 0]
    assert [bits(1, 2), bits(2, 0), bits(0, 3), bits(3, 0)] == [1, 6, 3, 5]
    for block, batch in ((2, 1), (100, 8)):
        m = general_metrics(context(bigram(), char_tokenizer(), batch_size=batch), path, V, block)
        assert m["n_general_tokens"] == 4 and m["ppl_general"] == pytest.approx(2 ** (15 / 4), rel=1e-6)
    budget = general_metrics(context(bigram(), char_tokenizer(), batch_size=1, max_tokens=2), path, V, 2)
    assert budget["n_general_tokens"] == 2 and budget["ppl_general"] == pytest.approx(2 ** (7 / 2), rel=1e-6)
    with pytest.raises(RarelmError, match="eval.general_text = .*no such file"):
        general_metrics(context(bigram(), char_tokenizer(), batch_size=1), tmp_path / "missing.txt", V, 4)


def test_continuous_term_metrics_are_exact():
    """Three occurrences; the covering tokens' bits and ranks after each prompt, by hand (rank = bits)."""
    rows = evaluate_terms(context(bigram(), char_tokenizer(), max_terms=3, context_tokens=2, batch_size=2,
                                  closed_set=False), SPLIT, TERMS)
    # 五六 after 三: 2 + 1 bits; 四五 after end-of-text: 4 + 1; 一二三 after end-of-text: 1 + 1 + 1
    got = [(r["term"], r["n_tokens"], r["n_chars"], r["first_token_rank"], r["token_acc"]) for r in rows]
    assert got == [("五六", 2, 2, 2, 0.5), ("四五", 2, 2, 4, 0.5), ("一二三", 3, 3, 1, 1.0)]
    assert [r["nll_sum"] / LN2 for r in rows] == pytest.approx([3, 5, 3], rel=1e-6)
    assert [r["nll_per_char"] / LN2 for r in rows] == pytest.approx([1.5, 2.5, 1.0], rel=1e-6)
    assert [r["first_token_rr"] for r in rows] == [0.5, 0.25, 1.0]
    m = term_metrics(rows, n_terms=len(TERMS), n_occurrences=5)
    assert m["term_nll_per_term"] == pytest.approx(11 / 3 * LN2)
    assert m["term_nll_per_char"] == pytest.approx(5 / 3 * LN2)
    assert m["term_token_acc"] == pytest.approx(2 / 3)
    assert m["term_first_token_mrr"] == pytest.approx(1.75 / 3)
    assert m["term_first_token_rank_median"] == 2.0 and m["term_token_acc_first"] == pytest.approx(2 / 3)
    assert m["term_exact_match"] == 1 / 3  # exact match stays: only 一二三 is written


def test_term_start_mass_where_no_term_starts():
    """False insertion (b): the bigram model's mass on term-start tokens, by hand from its bit table."""
    per_term = term_search.find_occurrences(char_tokenizer(), DOCS, TOKENS, OFFSETS, TERMS)
    starts = term_start_mask(per_term, len(TOKENS))
    assert np.flatnonzero(starts).tolist() == [0, 2, 3, 6, 11]  # 一二三, 三五, 五六, 四五, 六六
    start_ids = [1, 3, 5, 4, 6]  # the tokens found there
    m = score_tokens(context(bigram(), batch_size=2), TOKENS, BUCKETS, 4, start_mask=starts).metrics()

    def mass(p: int) -> float:  # P(next token starts a term | token p-1)
        return sum(2.0 ** -bits(int(TOKENS[p - 1]), s) for s in start_ids)

    plain = [p for p in range(1, len(TOKENS)) if not starts[p]]  # 9 targets where no term starts
    assert m["false_insertion_start_mass"] == pytest.approx(np.mean([mass(p) for p in plain]), rel=1e-6)
    assert m["false_insertion_start_freq"] == 4 / 9  # targets 6, 5, 1, 6 at positions 4, 7, 9, 12
    assert m["term_start_mass"] == pytest.approx(np.mean([mass(p) for p in (2, 3, 6, 11)]), rel=1e-6)
    assert m["n_term_start_ids"] == 5
    # e.g. at position 12, after token 6, tokens 1, 3, 4, 5, 6 cost 3, 5, 6, 7, 7 bits
    assert mass(12) == 2 ** -3 + 2 ** -5 + 2 ** -6 + 2 * 2 ** -7 == 0.1875
    assert "false_insertion_start_mass" not in score_tokens(context(bigram(), batch_size=2), TOKENS, BUCKETS,
                                                            4).metrics()



def test_scoring_in_row_chunks_equals_the_whole_batch(monkeypatch):
    """The logits of a batch are reduced ROWS rows at a time: with chunks of 3 rows (windows of 4
    targets, so chunks cut across windows and the last one is short) every figure equals the
    one-chunk computation exactly, the term-start mass included."""
    from rarelm.evaluate import token_scoring

    per_term = term_search.find_occurrences(char_tokenizer(), DOCS, TOKENS, OFFSETS, TERMS)
    terms = term_search.term_token_mask(per_term, len(TOKENS))
    starts = term_start_mask(per_term, len(TOKENS))
    figures = {}
    for rows in (1 << 30, 3):
        monkeypatch.setattr(token_scoring, "ROWS", rows)
        stats = score_tokens(context(bigram(0.7), batch_size=2), TOKENS, BUCKETS, 4, terms, starts)
        figures[rows] = (stats.metrics(), stats.nll.tolist(), stats.start_mass.tolist())
    assert figures[3] == figures[1 << 30]
    assert figures[3][0]["n_eval_tokens"] == len(TOKENS) - 1 and figures[3][0]["n_tokens_term"] > 0

def test_false_insertion_counts_terms_in_a_constructed_output():
    """A model that writes 一二三一二三... after 五 and 〇: the sampled text holds one term every 3 tokens."""
    model = ScriptedLM({0: 1, 5: 1, 1: 2, 2: 3, 3: 1}, V).eval()
    ctx = context(model, char_tokenizer(), insertion_prompts=2, insertion_tokens=6, context_tokens=2,
                  batch_size=2)
    m = false_insertion(ctx, SPLIT, TERMS, text_occurrences=5)  # SPLIT's documents: per character too
    # prompts end before positions 1 and 8: after 一 the model writes 二三一二三一 (one 一二三), after 五
    # 一二三一二三 (two); the text there: 二三五六〇四 (三五, 五六) and 七一〇六六〇 (六六)
    assert m["n_false_insertion_tokens"] == 12
    assert m["false_insertion_gen_per_1k"] == pytest.approx(3 / 12 * 1000)
    assert m["false_insertion_human_per_1k"] == pytest.approx(3 / 12 * 1000)
    assert m["false_insertion_text_per_1k"] == pytest.approx(5 / 14 * 1000)  # 5 occurrences, 14 tokens
    assert m["false_insertion_rate"] == pytest.approx(0.7)
    # per 1,000 characters: a character a token here, so 3 terms in 12 characters against 5 in the
    # split's 11 characters (its 3 end-of-text tokens are no characters): 250 vs 454.5, rate 0.55
    assert m["n_false_insertion_chars"] == 12
    assert m["false_insertion_gen_per_1k_chars"] == pytest.approx(3 / 12 * 1000)
    assert m["false_insertion_human_per_1k_chars"] == pytest.approx(3 / 12 * 1000)
    assert m["false_insertion_text_per_1k_chars"] == pytest.approx(5 / 11 * 1000)
    assert m["false_insertion_rate_chars"] == pytest.approx(11 / 20)
    assert count_terms(["the acute MI was", "subacute MI; acute MIs; acute MI"],
                          [Term("acute MI", 3), Term("was", 1)]) == 3
    none = false_insertion(context(model, char_tokenizer(), insertion_prompts=0, insertion_tokens=6,
                                   context_tokens=2, batch_size=2), SPLIT, TERMS, 5)
    assert none == {"n_false_insertion_tokens": 0}


def test_logit_adjustment_lifts_rare_tokens_in_scores_and_terms():
    """tau 0.5 with log pi = -(1, 1, 1, 1, 1, 8, 8, 8) ln 2: tokens 5-7 gain 3.5 bits on the others."""
    model = bigram()
    bias = logit_adjustment(model, -LN2 * np.array([1, 1, 1, 1, 1, 8, 8, 8]), 0.5)
    assert (bias / LN2).tolist() == pytest.approx([0.5] * 5 + [4.0] * 3)
    plain = score_tokens(context(model, batch_size=8), TOKENS, BUCKETS, 100).metrics()
    m = score_tokens(EvalContext(model, None, 0, EvalParams(batch_size=8), logit_bias=bias), TOKENS, BUCKETS,
                     100).metrics()
    table = model.table.detach().double().numpy() + bias.double().numpy()  # adjusted log-scores
    nll = [np.logaddexp.reduce(table[a]) - table[a, b] for a, b in zip(TOKENS[:-1], TOKENS[1:], strict=True)]
    assert m["ppl"] == pytest.approx(math.exp(np.mean(nll)), rel=1e-6)
    # the frequent targets (0-3) lose, the rare one (6) gains
    assert m["ppl_frequent"] > plain["ppl_frequent"] and m["ppl_rare"] < plain["ppl_rare"]

    params = EvalParams(max_terms=100, context_tokens=2, batch_size=2)
    rows = evaluate_terms(EvalContext(model, char_tokenizer(), 0, params, logit_bias=bias), SPLIT, TERMS)
    got = {r["term"]: (r["output"], r["exact_match"]) for r in rows}
    # after 3 the adjusted scores (bits) of 0..7 are -4.5 -5.5 -6.5 -6.5 -0.5 2 1 0: 5 now beats 4
    assert got["五六"] == ("五六七", True)  # was 四五六
    assert got["一二三"] == ("一五六七", False)  # after 1, 5 (-4 + 4 bits) beats 2 (-1 + 0.5)
    after3 = np.array([-4.5, -5.5, -6.5, -6.5, -0.5, 2, 1, 0])  # P(5 | 3) = 2^2 / sum
    after5 = np.array([-2.5, -3.5, -4.5, -5.5, -6.5, -3, 3, 2])  # P(6 | 5) = 2^3 / sum
    want = (np.log2((2 ** after3).sum()) - 2 + np.log2((2 ** after5).sum()) - 3) / 2 * LN2
    assert rows[0]["term"] == "五六" and rows[0]["nll"] == pytest.approx(want, rel=1e-6)


def test_macro_average_weighs_terms_not_occurrences():
    rows = [{"term": "a", "train_count": 3, "band": "2-3", "mention": m, "exact_match": hit,
             "first_token_hit": hit, "nll": 1.0, "choice_rank": 1 if hit else 4}
            for m, hit in (("first", True), ("repeat", True), ("repeat", True))]
    rows.append({"term": "b", "train_count": 40, "band": "32-63", "mention": "first", "exact_match": False,
                 "first_token_hit": False, "nll": 3.0, "choice_rank": 2})
    m = term_metrics(rows, n_terms=2, n_occurrences=4)
    assert (m["term_exact_match"], m["term_exact_match_macro"]) == (3 / 4, 1 / 2)
    assert (m["term_exact_match_first"], m["term_exact_match_repeat"]) == (1 / 2, 1.0)
    assert (m["term_choice_acc"], m["term_choice_acc_macro"]) == (3 / 4, 1 / 2)
    assert (m["term_nll_first"], m["term_nll_repeat"]) == (2.0, 1.0)


def test_em50_finds_a_known_crossing_and_says_when_it_is_undefined():
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 1025, size=20000)
    p = 1 / (1 + np.exp(-(np.log2(counts) - np.log2(24.0)) * 1.5))  # 50% at 24 occurrences
    assert em50_train_count(counts, rng.random(len(counts)) < p) == pytest.approx(24.0, rel=0.05)
    assert em50_train_count(counts, np.zeros(len(counts), bool)) is None  # never crosses
    assert em50_train_count(counts, counts < 100) is None  # falls with the count
    assert em50_train_count(np.array([4, 4, 4]), np.array([True, False, True])) is None  # one count


def test_term_cap_is_round_robin_and_deterministic():
    rows = evaluate_terms(context(bigram(), char_tokenizer(), max_terms=3, context_tokens=2, batch_size=8,
                                  closed_set=False), SPLIT, TERMS)
    # first occurrences of terms 0, 1, 2 (the next round would start with term 3)
    assert [r["term"] for r in rows] == ["五六", "四五", "一二三"]
    assert {r["choice_rank"] for r in rows} == {None}


def test_mentions_and_word_boundaries_in_text():
    tok = char_tokenizer()
    docs = ["一二一二三一二", "三一二"]
    tokens = np.array([1, 2, 1, 2, 3, 1, 2, 0, 3, 1, 2, 0])
    per_term = term_search.find_occurrences(tok, docs, tokens, np.array([0, 8, 12]), [Term("一二", 4)])
    assert [(o.doc, o.char_start, o.start, o.end, o.mention) for o in per_term[0]] == [
        (0, 0, 0, 2, "first"), (0, 2, 2, 4, "repeat"), (0, 5, 5, 7, "repeat"), (1, 1, 9, 11, "first")]
    # space-separated scripts: whole words only; Han characters need no boundary
    assert term_search.find_in_text("art start art. arts", "art") == [(0, 3), (10, 13)]
    assert term_search.find_in_text("API网关 myAPI网关 通过API网关调用", "API网关") == [(0, 5), (16, 21)]
    assert term_search.find_in_text("心肌梗死心肌梗死", "心肌梗死") == [(0, 4), (4, 8)]


def test_terms_are_found_whatever_their_case():
    find = term_search.find_in_text
    assert find("PKI, pki and Pki. PKIs, myPKI, pkinit", "pki") == [(0, 3), (5, 8), (13, 16)]
    assert find("PKI, pki and Pki.", "PKI") == find("PKI, pki and Pki.", "Pki")  # the term's case neither
    text = "Real Programmers use FORTRAN; real programmers. Surreal programmers, real programmersx"
    assert [text[a:b] for a, b in find(text, "real programmers")] == ["Real Programmers", "real programmers"]
    # a Latin acronym inside Chinese text: no boundary needed beside Han characters
    text = "使用PKI证书签名。pki证书也行，但SPKI不是。"
    assert [text[a:b] for a, b in find(text, "PKI")] == ["PKI", "pki"]
    assert [text[a:b] for a, b in find(text, "pki证书")] == ["PKI证书", "pki证书"]
    assert find("心肌梗死", "心肌梗") == [(0, 3)]  # Han: exact, inside a longer word too
    # folding that changes the length maps back to whole characters of the text
    text = "Die STRASSE, die Straße, die Straßen"
    assert [text[a:b] for a, b in find(text, "straße")] == ["STRASSE", "Straße"]
    assert find("ﬁle ﬁ", "fi") == [(4, 5)]  # the ligature as a whole word; never half of it


def test_folded_positions_map_back_as_a_per_character_map_does():
    """FoldedText keeps only the characters that fold longer; compared with the full map."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        text = "".join(rng.choice(list("aAsSßẞﬁﬃİŉ x"), size=rng.integers(0, 12)))
        back = [i for i, c in enumerate(text) for _ in c.casefold()]
        whole = [k == 0 or back[k] != back[k - 1] for k in range(len(back))]
        folded = term_search.FoldedText(text)
        assert [folded.original(k) for k in range(len(back))] == list(zip(back, whole, strict=True)), text


def test_occurrences_keep_the_term_as_written():
    from rarelm.tokenize.tokenization import EOT, train_bpe

    docs = ["Sign it with PKI. The pki keys, Pki roots.", "使用PKI证书签名"]
    tok = train_bpe(iter(docs * 20), vocab_size=300, min_frequency=2)
    eot = tok.token_to_id(EOT)
    ids = [tok.encode(d, add_special_tokens=False).ids for d in docs]
    tokens = np.array(ids[0] + [eot] + ids[1] + [eot])
    offsets = np.array([0, len(ids[0]) + 1, len(tokens)])
    (found,) = term_search.find_occurrences(tok, docs, tokens, offsets, [Term("pki", 4)])
    assert [(o.doc, o.char_start, o.surface, o.mention) for o in found] == [
        (0, 13, "PKI", "first"), (0, 22, "pki", "repeat"), (0, 32, "Pki", "repeat"), (1, 2, "PKI", "first")]
    for o in found:  # the covering tokens are the text of lead + the term as written
        covered = tok.decode([int(t) for t in tokens[o.start:o.end]])
        assert covered.startswith(o.lead + o.surface), (covered, o)


def test_terms_load_in_their_display_form(tmp_path):
    rows = [{"term": "pki", "count": 3, "train_occurrences": 7, "display": "PKI"},
            {"term": "zlib", "count": 2}]  # written before display forms existed: as extracted
    (tmp_path / "terms.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_terms(tmp_path / "terms.jsonl") == [Term("PKI", 7), Term("zlib", 2)]


def test_exact_match_as_written_and_in_any_case():
    from rarelm.tokenize.tokenization import EOT, train_bpe

    doc = "Keys come from the PKI of the firm"
    tok = train_bpe(iter([doc, "a pki or Pki", "the PKI"] * 20), vocab_size=300, min_frequency=2)
    eot = tok.token_to_id(EOT)
    tokens = np.array(tok.encode(doc, add_special_tokens=False).ids + [eot])
    offsets = np.array([0, len(tokens)])
    terms = [Term("pki", 7), Term("firm", 1)]
    (o,), _ = term_search.find_occurrences(tok, [doc], tokens, offsets, terms)

    def writer(text: str) -> ScriptedLM:
        """A model that writes `text` after the prompt's last token (tokens must be distinct)."""
        chain = [int(tokens[o.start - 1])] + tok.encode(text, add_special_tokens=False).ids
        assert len(set(chain)) == len(chain)
        return ScriptedLM(dict(zip(chain, chain[1:], strict=False)), tok.get_vocab_size()).eval()

    got = []
    for text in (" PKI of", " pki of", " Pki", " key"):
        (row,) = evaluate_terms(context(writer(text), tok, eot, max_terms=1, context_tokens=64, batch_size=4),
                                SplitText("test", tokens, offsets, [doc]), terms)
        assert row["expected"] == " PKI" and row["term"] == "pki"
        got.append((row["exact_match"], row["exact_match_ci"]))
    assert got == [(True, True), (False, True), (False, True), (False, False)]
    rows = [{**row, "exact_match": em, "exact_match_ci": ci} for em, ci in got]
    m = term_metrics(rows, n_terms=2, n_occurrences=1)
    assert (m["term_exact_match"], m["term_exact_match_ci"]) == (1 / 4, 3 / 4)
    assert (m["term_exact_match_band_4-7"], m["term_exact_match_ci_band_4-7"]) == (1 / 4, 3 / 4)
    assert m["term_exact_match_ci_le15"] == 3 / 4


class ScriptedLM(BigramLM):
    """Writes a fixed token after each token: greedy decoding follows `successor` exactly."""

    def __init__(self, successor: dict[int, int], vocab: int):
        super().__init__(BigramConfig(vocab_size=vocab))
        table = torch.full((vocab, vocab), -30.0)
        table[:, 0] = 0.0  # anything not scripted ends the text
        for a, b in successor.items():
            table[a] = -30.0
            table[a, b] = 0.0
        self.table = torch.nn.Parameter(table)


@pytest.mark.parametrize("cjk", ["merge", "chars"])
def test_chinese_terms_inside_merged_tokens(cjk):
    """Byte-level BPE that merges across the term (merge) or never does (chars): found, scored on text."""
    from rarelm.tokenize.tokenization import EOT, train_bpe

    sentence = "董事会决定发行可交换保理。"
    corpus = [sentence, "公司发行可交换保理产品", "可交换保函", "the API网关 works"] * 30
    tok = train_bpe(iter(corpus), vocab_size=400, min_frequency=2, cjk=cjk)
    eot = tok.token_to_id(EOT)
    docs = [sentence, "通过API网关调用"]
    ids = [tok.encode(d, add_special_tokens=False).ids for d in docs]
    tokens = np.array(ids[0] + [eot] + ids[1] + [eot])
    offsets = np.array([0, len(ids[0]) + 1, len(tokens)])
    terms = [Term("可交换保理", 3), Term("可交换保函", 1), Term("API网关", 2)]
    per_term = term_search.find_occurrences(tok, docs, tokens, offsets, terms)
    (o,), (), (api,) = per_term
    assert (o.doc, o.char_start, api.doc, api.char_start) == (0, 7, 1, 2)
    # the prompt ends right before the first token covering the term; `lead` is that token's text
    # before the term, so prompt + lead + term is exactly the document's text up to the term's end
    prompt_text = tok.decode([int(t) for t in tokens[:o.start]], skip_special_tokens=False)
    assert prompt_text + o.lead == sentence[:7]
    covered = tok.decode([int(t) for t in tokens[o.start:o.end]])
    assert covered.startswith(o.lead + "可交换保理") and not covered[len(o.lead) + 5:].startswith("。" * 2)
    if cjk == "chars":  # every Han character its own token(s): the term starts on a token boundary
        assert o.lead == "" and covered == "可交换保理"
    else:  # BPE merged the term with its neighbours
        assert o.lead != "" or covered != "可交换保理"

    def writer(text: str) -> ScriptedLM:
        """A model that writes `text` after the prompt's last token (tokens must be distinct)."""
        out = tok.encode(text, add_special_tokens=False).ids
        chain = [int(tokens[o.start - 1])] + out
        assert len(set(chain)) == len(chain)
        return ScriptedLM(dict(zip(chain, chain[1:], strict=False)), tok.get_vocab_size()).eval()

    for text, hit in ((o.lead + "可交换保理。", True), (o.lead + "可交换保函", False)):
        rows = evaluate_terms(context(writer(text), tok, eot, max_terms=10, context_tokens=64, batch_size=4),
                              SplitText("test", tokens[:offsets[1]], offsets[:2], docs[:1]), terms[:2])
        assert len(rows) == 1 and rows[0]["exact_match"] is hit, rows[0]
        assert rows[0]["expected"] == o.lead + "可交换保理" and rows[0]["choice_rank"] == (1 if hit else 2)


def test_english_text_search_finds_what_the_token_search_found(tiny_raw):
    """Regression: on English text the text search finds every whole-word token-sequence match."""
    from rarelm.prepare import corpus
    from rarelm.tokenize.tokenization import train_bpe

    docs = list(corpus.iter_documents(corpus.CorpusParams(path=str(tiny_raw / "demo_en.txt.gz"))))[:300]
    docs = [corpus.clean(d) for d in docs]
    tok = train_bpe(iter(docs), vocab_size=600, min_frequency=2)
    ids = [tok.encode(d, add_special_tokens=False).ids for d in docs]
    tokens = np.array([t for doc in ids for t in doc + [0]])
    offsets = np.cumsum([0] + [len(doc) + 1 for doc in ids])
    glossary = [line.split("\t")[0] for line in
                (tiny_raw / "demo_en.glossary.tsv").read_text().splitlines()[1:60]]
    terms = [Term(t, 1) for t in glossary]
    per_term = term_search.find_occurrences(tok, docs, tokens, offsets, terms)
    # compared by where the term's tokens end: where the space is a token of its own ("Ġ", "er",
    # "os", ...) the old search started at the space and the text search starts at the term
    found = {(o.term, o.end) for occ in per_term for o in occ}
    for i, t in enumerate(terms):  # " term" as one token sequence, as the old search matched it
        seq = tok.encode(" " + t.text, add_special_tokens=False).ids
        old = {(i, p + len(seq)) for p in range(len(tokens) - len(seq))
               if tokens[p:p + len(seq)].tolist() == seq
               and tok.decode(tokens[p + len(seq):p + len(seq) + 1].tolist())[:1] in ("", " ", ".", ",")}
        assert old <= found
    assert len(found) > 50


def test_select_round_robin_prefers_breadth():
    per_term = [[Occurrence(0, 0, p, p, p + 1, "", "first") for p in range(10)],
                [Occurrence(1, 0, 50, 50, 51, "", "first")], []]
    chosen = term_search.select_round_robin(per_term, 4)
    assert sorted(o.term for o in chosen) == [0, 0, 0, 1]  # term 1's only occurrence is never crowded out
    assert len({o.start for o in chosen}) == 4
    # in the order (place in its term's text order, term): term 1's only occurrence is at place 0
    assert chosen == sorted(chosen, key=lambda o: (o.start if o.term == 0 else 0, o.term))
    everything = term_search.select_round_robin(per_term, 100)  # under the cap: all, in text order
    assert [(o.term, o.start) for o in everything] == [(0, 0), (1, 50)] + [(0, p) for p in range(1, 10)]


def test_a_capped_sample_holds_repeated_mentions_as_the_text_does():
    # 400 terms, each mentioned 4 times in its own document: one first mention, three repeats. A cap
    # of one occurrence per term drew only first mentions when each term's were taken in text order.
    per_term = [[Occurrence(t, t, 10 * i, 0, 1, "", "first" if i == 0 else "repeat") for i in range(4)]
                for t in range(400)]
    chosen = term_search.select_round_robin(per_term, 400)
    assert sorted(o.term for o in chosen) == list(range(400))
    repeats = sum(o.mention == "repeat" for o in chosen) / 400
    assert 0.70 <= repeats <= 0.80, repeats  # 3 of 4 in the text
    assert chosen == term_search.select_round_robin(per_term, 400)  # fixed: every run scores the same


def test_an_occurrence_sample_weights_each_term_by_how_often_the_text_holds_it():
    # one term mentioned 300 times in its document (a first mention, 299 repeats), 100 terms once each
    per_term = [[Occurrence(0, 0, 10 * i, i, i + 1, "", "first" if i == 0 else "repeat") for i in range(300)],
                *[[Occurrence(t, t, 5, 0, 1, "", "first")] for t in range(1, 101)]]
    by_terms, by_occurrences = (term_search.select(per_term, 100, s) for s in ("terms", "occurrences"))
    assert by_terms == term_search.select_round_robin(per_term, 100)
    assert sorted(o.term for o in by_terms) == list(range(100))  # every term its turn, term 0 once
    frequent = sum(o.term == 0 for o in by_occurrences)  # 300 of the 400 occurrences are term 0's
    assert 60 <= frequent <= 90, frequent
    assert sum(o.mention == "repeat" for o in by_occurrences) >= frequent - 1  # its repeats come with it
    assert len(set(map(id, by_occurrences))) == 100 and by_occurrences == term_search.select(per_term, 100,
                                                                                              "occurrences")
    assert term_search.select(per_term, 1000, "occurrences") == term_search.select_round_robin(per_term, 1000)


def test_stage_reports_the_repeat_share_of_the_scored_sample_and_of_the_text(eval_workspace, tmp_path):
    """`eval.term_sample=occurrences` with a cap above the split's occurrences scores them all, so the
    scored sample's repeat share (from the rows) is the text's (from every occurrence found)."""
    ws = tmp_path / "ws"
    shutil.copytree(eval_workspace, ws)
    set_params(ws, **{"eval.term_sample": "occurrences", "eval.max_terms": 100_000, "eval.splits": ["test"],
                      "eval.closed_set": False, "eval.diversity_prompts": 0, "eval.insertion_prompts": 0})
    result = stage("evaluate", ws, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    m = json.loads((ws / "metrics/eval.json").read_text())
    rows = [json.loads(line) for line in (ws / "metrics/eval_occurrences.jsonl").open()]
    assert m["n_eval_terms"] == m["n_term_occurrences"] == len(rows) > 40
    repeats = sum(r["mention"] == "repeat" for r in rows)
    assert 0 < repeats < len(rows)
    assert m["term_repeat_share"] == m["term_repeat_share_text"] == pytest.approx(repeats / len(rows))


def tiny_random_lm(arch: str):
    """A random causal LM with a large init, so greedy output varies from token to token."""
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
    )

    torch.manual_seed(0)
    if arch == "gpt2":  # learned absolute positions
        return GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                          bos_token_id=0, eos_token_id=0, initializer_range=0.5)).eval()
    if arch == "gemma3":  # a sliding-window layer (8 positions) and a global one
        return Gemma3ForCausalLM(Gemma3TextConfig(
            vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, sliding_window=8, max_position_embeddings=64, bos_token_id=0,
            eos_token_id=0, pad_token_id=0, initializer_range=0.5)).eval()
    return LlamaForCausalLM(LlamaConfig(  # rotary positions, grouped-query attention
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
        initializer_range=0.5)).eval()


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_closed_set_sums_equal_each_candidate_scored_in_full(arch):
    """The closed set's candidate NLL sums (a trie over one cached prompt) equal scoring prompt +
    candidate whole, also for Gemma 3, whose sliding-window cache a tree mask cannot address (it
    takes the row-per-prefix path; the tree layout stopped with a size mismatch)."""
    from rarelm.evaluate.scoring import tree_candidates_nll

    model = tiny_random_lm(arch)
    prompt, candidates = list(range(1, 13)), [[4, 5], [4, 7], [6], [8, 9, 10]]
    with torch.no_grad():
        whole = []
        for c in candidates:
            logp = torch.log_softmax(model(torch.tensor([prompt + c])).logits[0].double(), -1)
            whole.append(-sum(logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(c)))
    assert np.allclose(tree_candidates_nll(model, prompt, candidates), whole, atol=1e-4)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_term_scores_from_the_kept_logits_equal_the_full_pass(arch, monkeypatch):
    """continuation_scores asks the model for the logits from the first scored position on only
    (`logits_to_keep`); prompts of different lengths, right padded: the same NLL and ranks, bit for bit,
    as from every position's logits."""
    from rarelm.evaluate import scoring

    model = tiny_random_lm(arch)
    prompts, conts = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]], [[13, 14], [15, 16, 17], [18]]
    kept = scoring.continuation_scores(model, prompts, conts, pad_id=0)
    monkeypatch.setattr(scoring, "keeps_logits", lambda model: False)
    full = scoring.continuation_scores(model, prompts, conts, pad_id=0)
    for (a_nll, a_rank), (b_nll, b_rank) in zip(kept, full, strict=True):
        assert np.array_equal(a_nll, b_nll) and np.array_equal(a_rank, b_rank)
    assert [len(nll) for nll, _ in kept] == [2, 3, 1]


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
    # closed-set scoring shares the prompt's KV cache across candidates: same sums as full passes
    for p in prompts:
        sums = candidates_nll(model, p, conts + [[2]])
        want = [continuation_nll(model, [p], [c], pad_id=0)[0].sum() for c in conts + [[2]]]
        np.testing.assert_allclose(sums, want, rtol=1e-5)
        # with a bound, candidates that cannot beat it stop after their first token: same ranking
        heads = candidates_nll(model, p, [[c[0]] for c in conts])  # first tokens alone
        longest = 2 if heads[2] > heads[3] else 3  # of the two 3+-token candidates, the costlier start
        bound = float(heads[longest])  # is cut right there
        pruned = candidates_nll(model, p, conts + [[2]], bound=bound)
        assert ((pruned < bound) == (sums < bound)).all() and np.isinf(pruned[longest])
        np.testing.assert_allclose(pruned[np.isfinite(pruned)], sums[np.isfinite(pruned)], rtol=1e-5)


@pytest.fixture(scope="module")
def foldoc_sample(tmp_path_factory):
    """(folder, test documents) of the real corpus foldoc_en's first 400 documents, tokenized by a
    512-token BPE, with a random 1-layer GPT-2 in models/model."""
    import gzip

    from transformers import GPT2Config, GPT2LMHeadModel

    root = tmp_path_factory.mktemp("foldoc")
    with gzip.open(REPO / "data/raw/foldoc_en.txt.gz", "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(400)]
    (root / "foldoc.txt").write_text("".join(lines), encoding="utf-8")
    data = tokenized_in(root, root / "foldoc.txt",
                        **{"corpus.reference_glossary": "", "tokenizer.vocab_size": 512})
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=data.vocab_size, n_positions=64, n_embd=32, n_layer=1, n_head=2,
                               bos_token_id=data.eot_id, eos_token_id=data.eot_id,
                               initializer_range=0.2)).save_pretrained(root / "models/model")
    return root


@pytest.mark.parametrize("corpus", ["demo", "foldoc_en"])
def test_batched_evaluation_equals_per_occurrence(corpus, request):
    """eval.batch_size 1 (one prompt per decode, one row per open prefix of the closed set) and 8
    (batched decodes and scoring, a trie level per forward): the same rows, value for value; only
    NLLs may differ in float32's last bits (other matmul shapes), never tokens, matches or ranks."""
    from rarelm.artifacts.tokenized import TokenizedData, load_tokenizer
    from rarelm.evaluate.model_folder import load_causal_lm
    from rarelm.prepare.corpus import read_split

    root = request.getfixturevalue("eval_workspace" if corpus == "demo" else "foldoc_sample")
    data = TokenizedData.open(root / "data/tokenized")
    tokenizer = load_tokenizer(data.tokenizer_dir, data.vocab_size)
    documents = list(read_split(root / "data/prepared", "test"))
    tokens, offsets = data.tokens("test"), data.offsets("test")
    # terms of 1 to 4 words from the test split's text: closed-set tries of several depths
    words = [w.strip(".,:;()'\"{}") for d in documents[:20] for w in d.split()]
    phrases = dict.fromkeys(" ".join(words[i:i + 1 + i % 4]) for i in range(0, 400, 3))
    terms = [Term(p, 2 ** (i % 9)) for i, p in enumerate(phrases) if p.strip() and "  " not in p][:40]
    model = load_causal_lm(root / "models/model", "cpu")
    split = SplitText("test", tokens, offsets, documents)
    one, batched = (evaluate_terms(context(model, tokenizer, data.eot_id, max_terms=10, context_tokens=16,
                                           batch_size=size, closed_set=True), split, terms)
                    for size in (1, 8))
    assert len(one) == len(batched) == 10
    assert len({r["choice_rank"] for r in one}) > 3  # ranks that vary: the comparison can fail
    close = {"nll", "nll_sum", "nll_per_char"}
    for a, b in zip(one, batched, strict=True):
        assert {k: a[k] for k in a if k not in close} == {k: b[k] for k in b if k not in close}
        for key in close:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6)


def test_bad_rare_inputs_are_one_line_errors(tmp_path):
    np.save(tmp_path / "buckets.npy", np.zeros(5, dtype=np.int8))
    with pytest.raises(RarelmError, match=r"expected int8 \[8\] .* does not match the vocabulary"):
        load_buckets(tmp_path, 8)
    with pytest.raises(RarelmError, match="run the rare_terms stage first"):
        load_buckets(tmp_path / "nope", 8)
    (tmp_path / "terms.jsonl").write_text('{"term": "x"}\n')
    with pytest.raises(RarelmError, match=r"terms.jsonl:1: not a term record"):
        load_terms(tmp_path / "terms.jsonl")
    with pytest.raises(RarelmError, match="eval.splits"):
        EvalParams(splits=["test", "test"])


# ---------------------------------------------------------------- the stage through its CLI


def _hf_ppl(model_dir, tokens, block, bias=None):
    """Perplexity by torch's cross_entropy, window by window: an independent check of score_tokens.

    `bias`: a float64 numpy vector added to the logits (post-hoc logit adjustment).
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(tokens) - 1, block):
            ids = torch.tensor(tokens[s:s + block + 1].astype(np.int64))[None]
            logits = model(input_ids=ids[:, :-1]).logits[0]
            if bias is not None:
                logits = logits.double() + torch.as_tensor(bias)
            total += torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
            n += ids.shape[1] - 1
    return math.exp(total / n), n


def _assert_eval_plots(ws, m: dict, n: int) -> None:
    """The evaluate stage's plot CSVs against its metrics/eval.json `m` (n: scored test tokens)."""
    buckets_csv = (ws / "plots/eval_buckets.csv").read_text().splitlines()
    assert buckets_csv[0] == "bucket,tokens,ppl,acc,recall_at_5"
    assert buckets_csv[1].startswith(f"all,{n},{m['ppl']:.6g},")
    header, *band_lines = (ws / "plots/eval_term_bands.csv").read_text().splitlines()
    assert header == "band,terms,occurrences,exact_match,first_token_acc,choice_acc,nll,nll_per_char,ppl"
    bands = [dict(zip(header.split(","), line.split(","), strict=True)) for line in band_lines]
    assert sum(int(b["occurrences"]) for b in bands) == m["n_eval_terms"]
    # the term chart's panels: band means of NLL per character weigh back to the overall one,
    # and term perplexity is exp of the band's NLL per term token
    assert sum(int(b["occurrences"]) * float(b["nll_per_char"]) for b in bands) / m["n_eval_terms"] == \
        pytest.approx(m["term_nll_per_char"], rel=1e-4)
    ppl_of_nll = [math.exp(float(b["nll"])) for b in bands]
    assert [float(b["ppl"]) for b in bands] == pytest.approx(ppl_of_nll, rel=1e-4)


def test_stage_writes_metrics_plots_and_logs_into_the_training_run(eval_workspace, tmp_path):
    import mlflow

    from rarelm.artifacts.tokenized import TokenizedData

    ws = tmp_path / "ws"
    shutil.copytree(eval_workspace, ws)
    uri = f"sqlite:///{ws / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("rarelm")).info.run_id
    (ws / "models/model/mlflow_run.json").write_text(json.dumps(  # as train writes it: the repo's store
        {"run_id": run_id, "tracking_uri": "sqlite:///mlflow.db", "experiment": "rarelm"}))

    set_params(ws, **{"eval.splits": ["test", "val"]})
    result = stage("evaluate", ws, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    # where the time went, per split (and, once a split has taken 10 s, a line per measurement:
    # `evaluate: test: scoring tokens 12.0 s (15.0 s so far)`, rarelm/progress.py)
    lines = result.stderr.splitlines()
    assert [line.split(" finding terms ")[0] for line in lines if " split: " in line] == [
        "evaluate: test split:", "evaluate: val split:"]
    assert all(re.fullmatch(r"evaluate: (test|val): [a-z ]+ [0-9].* so far\)", line)
               for line in lines if " split: " not in line), result.stderr
    m = json.loads((ws / "metrics/eval.json").read_text())
    # the summary: a block of short lines per split, then the time; the headline file for DVC
    from rarelm.evaluate.stage import split_summary
    from rarelm.tracking.metrics import summary_file

    lines = result.stdout.splitlines()
    assert lines[0] == (f"evaluate: test split, {m['n_eval_tokens']:,} tokens, "
                        f"{m['n_eval_terms']:,} term occurrences")
    assert result.stdout.startswith(split_summary("test", m) + "\n" + split_summary("val", m["val"]) + "\n")
    # 9 lines a split, the line that no general text was found (the workspace has no data/general/),
    # the time
    assert len(lines) == 2 * 9 + 2 and max(map(len, lines)) <= 100
    assert lines[-2] == ("evaluate: eval.general_text auto: no data/general/<language>.txt here, forgetting "
                         "not measured")
    assert lines[-1].startswith("evaluate: ") and lines[-1].endswith(" s; every figure in metrics/eval.json, "
                                                                     "the headline in metrics/summary.json")
    headline = json.loads((ws / "metrics/summary.json").read_text())
    assert headline == summary_file(m, ["test", "val"]) and "tokens_per_s" not in headline  # no train.json
    assert headline["ppl"] == m["ppl"] and headline["val"]["ppl"] == m["val"]["ppl"]
    test_tokens = np.asarray(TokenizedData.open(ws / "data/tokenized").tokens("test"))
    ppl, n = _hf_ppl(ws / "models/model", test_tokens, block=64)
    assert m["n_eval_tokens"] == n == len(test_tokens) - 1
    assert m["ppl"] == pytest.approx(ppl, rel=1e-5)
    # the overall perplexity is the token-weighted geometric mean of the buckets'
    parts = [(m[f"n_tokens_{b}"], m[f"ppl_{b}"]) for b in BUCKET_NAMES if m[f"n_tokens_{b}"]]
    assert sum(k for k, _ in parts) == n
    assert math.exp(sum(k * math.log(p) for k, p in parts) / n) == pytest.approx(m["ppl"], rel=1e-9)
    assert 0 < m["n_eval_terms"] <= 40 and 0 <= m["term_exact_match"] <= m["term_first_token_acc"] <= 1
    assert m["n_tokens_term"] > 0 and m["ppl_term"] > 1 and 0 <= m["term_choice_acc"] <= 1
    assert m["n_gen_tokens"] == 4 * 8 and m["n_false_insertion_tokens"] == 4 * 8
    assert m["false_insertion_text_per_1k"] == pytest.approx(1000 * m["n_term_occurrences"] / (n + 1))
    assert 0 < m["false_insertion_start_mass"] < 1 and 0 <= m["false_insertion_start_freq"] < 1
    assert 0 < m["term_nll_per_char"] < m["term_nll_per_term"] and 0 <= m["term_token_acc"] <= 1
    val_tokens = TokenizedData.open(ws / "data/tokenized").tokens("val")
    assert m["val"]["n_eval_tokens"] == len(val_tokens) - 1 and m["val"]["ppl"] > 1

    _assert_eval_plots(ws, m, n)
    _assert_logged_into_the_run(client, run_id, ws, m, tmp_path)


def _assert_logged_into_the_run(client, run_id: str, ws: Path, m: dict, tmp_path: Path) -> None:
    """The evaluate stage's figures and rows as logged into the training run's MLflow run."""
    logged = client.get_run(run_id)
    assert logged.data.metrics["summary/ppl"] == pytest.approx(m["ppl"])
    assert logged.data.metrics["summary/term_exact_match"] == pytest.approx(m["term_exact_match"])
    assert not any(k.startswith("eval/") for k in logged.data.metrics)  # the other figures: eval.json
    assert logged.data.tags["eval.logit_adjust_tau"] == "0.0" and "logit_adjust_tau" not in m
    assert logged.data.tags["eval.term_trie"] == "False" and "term_trie" not in m
    assert "evaluate" in logged.data.tags["stages"]
    artifacts = {a.path for a in client.list_artifacts(run_id, "eval")}
    assert artifacts == {"eval/eval.json", "eval/eval_buckets.csv", "eval/eval_term_bands.csv",
                         "eval/eval_occurrences.jsonl", "eval/term_samples.json"}  # + the MLflow table
    rows_file = client.download_artifacts(run_id, "eval/eval_occurrences.jsonl", str(tmp_path))
    rows = [json.loads(line) for line in open(rows_file, encoding="utf-8")]
    table_file = client.download_artifacts(run_id, "eval/term_samples.json", str(tmp_path))
    table = json.loads(open(table_file, encoding="utf-8").read())
    assert [dict(zip(table["columns"], r, strict=True))["output"] for r in table["data"]] == \
        [r["output"] for r in rows]
    assert rows == [json.loads(line) for line in (ws / "metrics/eval_occurrences.jsonl").open()]
    test_rows = [r for r in rows if r["split"] == "test"]
    assert len(test_rows) == m["n_eval_terms"] and len(rows) == m["n_eval_terms"] + m["val"]["n_eval_terms"]
    assert sum(r["exact_match"] for r in test_rows) == round(m["term_exact_match"] * m["n_eval_terms"])
    assert term_metrics(test_rows, m["n_terms"], m["n_term_occurrences"]).items() <= m.items()


def test_stage_scores_the_general_text_as_ppl_general(eval_workspace, tmp_path):
    """eval.general_text: the file's documents, each followed by the end-of-text token, scored as
    ppl is scored (checked against torch's cross_entropy window by window). The default, `auto`, is
    the project's slice for the corpus' language, data/general/en.txt here; a workspace without it
    says in one line that the guard is not measured. eval.general_text_outside `auto` scores
    data/general/en.outside.txt the same way, by the model alone, as ppl_general_outside."""
    from rarelm.artifacts.tokenized import TokenizedData, load_tokenizer
    from rarelm.evaluate.general_text import token_stream
    from rarelm.fmt import four_digits

    ws = tmp_path / "ws"
    shutil.copytree(eval_workspace, ws)
    assert load_params(ws / "params.yaml").eval.general_text == "auto"
    result = stage("evaluate", ws)
    assert result.returncode == 0, result.stderr
    assert "ppl_general" not in json.loads((ws / "metrics/eval.json").read_text())
    assert "auto: no data/general/<language>.txt here, forgetting not measured" in result.stdout
    documents = ["The acute phase of a bilateral condition was noted.", "A second, unrelated document."]
    (ws / "data/general").mkdir()
    (ws / "data/general/en.txt").write_text("\n".join(documents) + "\n", encoding="utf-8")
    result = stage("evaluate", ws)  # auto: the corpus is English (data/prepared/stats.json)
    assert result.returncode == 0 and "forgetting not measured" not in result.stdout, result.stderr
    metrics = json.loads((ws / "metrics/eval.json").read_text())
    assert "ppl_general_outside" not in metrics and "outside-family" not in result.stdout
    # eval.general_text_outside auto: data/general/en.outside.txt, scored apart by the model alone
    outside = ["Fortune favours the bold.", "A penny saved is a penny earned."]
    (ws / "data/general/en.outside.txt").write_text("\n".join(outside) + "\n", encoding="utf-8")
    result = stage("evaluate", ws)
    assert result.returncode == 0, result.stderr
    both = json.loads((ws / "metrics/eval.json").read_text())
    assert both["ppl_general"] == metrics["ppl_general"]
    assert json.loads((ws / "metrics/summary.json").read_text())["ppl_general_outside"] == \
        both["ppl_general_outside"] != both["ppl_general"]
    assert f"outside-family ppl   {four_digits(both['ppl_general_outside'])}" in result.stdout
    (ws / "general.txt").write_text("\n".join(documents) + "\n", encoding="utf-8")
    set_params(ws, **{"eval.general_text": "general.txt"})
    result = stage("evaluate", ws)
    assert result.returncode == 0, result.stderr
    assert json.loads((ws / "metrics/eval.json").read_text())["ppl_general"] == metrics["ppl_general"]
    data = TokenizedData.open(ws / "data/tokenized")
    tokenizer = load_tokenizer(data.tokenizer_dir, data.vocab_size)
    tokens = token_stream(tokenizer, documents, data.eot_id)
    ppl, n = _hf_ppl(ws / "models/model", tokens, 64)  # eval.block_size 0: the model's context of 64
    assert metrics["n_general_tokens"] == n == len(tokens) - 1
    assert metrics["ppl_general"] == pytest.approx(ppl, rel=1e-5)
    assert metrics["ppl_general_model"] == metrics["ppl_general"]  # nothing mixed in: the same figure
    ppl, n = _hf_ppl(ws / "models/model", token_stream(tokenizer, outside, data.eot_id), 64)
    assert both["n_general_outside_tokens"] == n
    assert both["ppl_general_outside"] == pytest.approx(ppl, rel=1e-5)
    assert "general-text ppl" in result.stdout and "the model alone" not in result.stdout
    # a decode-time cache mixed in: ppl_general is the mixture's, ppl_general_model (forgetting) the
    # model's alone, the same figure as without the cache
    set_params(ws, **{"knn.cache_window": 16, "knn.cache_weight": 0.5})
    result = stage("evaluate", ws)
    assert result.returncode == 0, result.stderr
    mixed = json.loads((ws / "metrics/eval.json").read_text())
    assert mixed["ppl_general_model"] == metrics["ppl_general"]
    assert mixed["ppl_general_outside"] == both["ppl_general_outside"]  # the model alone, mixing or not
    assert mixed["ppl_general"] != pytest.approx(metrics["ppl_general"], rel=1e-3)
    assert "the model alone" in result.stdout


def test_stage_with_logit_adjustment_scores_the_adjusted_model(eval_workspace, tmp_path):
    """eval.logit_adjust_tau > 0 reads data/rare/counts.npy; perplexity is that of logits - tau log pi."""
    from rarelm.artifacts.tokenized import TokenizedData

    ws = tmp_path / "ws"
    shutil.copytree(eval_workspace, ws)
    set_params(ws, **{"eval.logit_adjust_tau": 0.5, "eval.splits": ["test"]})
    counts_file = ws / "data/rare/counts.npy"
    counts = np.load(counts_file)
    counts_file.unlink()
    missing = "data/rare/counts.npy: not found; run the rare_terms stage first"
    assert_user_error(stage("evaluate", ws), missing, ws, "metrics", "plots", stage="evaluate")
    np.save(counts_file, counts)
    result = stage("evaluate", ws, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    m = json.loads((ws / "metrics/eval.json").read_text())
    log_pi = np.log(counts + 1.0) - np.log(counts.sum() + len(counts))  # add-one smoothed prior, by hand
    test_tokens = np.asarray(TokenizedData.open(ws / "data/tokenized").tokens("test"))
    ppl, n = _hf_ppl(ws / "models/model", test_tokens, block=64, bias=-0.5 * log_pi)
    assert m["n_eval_tokens"] == n and m["ppl"] == pytest.approx(ppl, rel=1e-5)
    assert m["ppl"] != pytest.approx(_hf_ppl(ws / "models/model", test_tokens, block=64)[0], rel=1e-3)


def test_stage_with_term_trie_completes_terms_and_scores_as_without(eval_workspace, tmp_path):
    """`-S eval.term_trie=true` through the stage: a random model that never completes a term given
    its first token completes them inside the trie; every teacher-forced figure is the plain one.
    Gated (`eval.term_trie_min_mass=0.5`), the trie leaves it alone: it never heads for a term."""
    runs = {}
    for trie, gate in ((False, 0.0), (True, 0.0), (True, 0.5)):
        ws = tmp_path / f"ws-{trie}-{gate}"
        shutil.copytree(eval_workspace, ws)
        set_params(ws, **{"eval.term_trie": trie, "eval.term_trie_min_mass": gate, "eval.splits": ["test"]})
        result = stage("evaluate", ws, env={"OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, result.stderr
        runs[trie, gate] = json.loads((ws / "metrics/eval.json").read_text())
    plain, trie = runs[False, 0.0], runs[True, 0.0]
    assert runs[True, 0.5]["term_completion_match"] == plain["term_completion_match"]
    for name in ("ppl", "ppl_rare", "term_ppl", "term_nll_per_char", "false_insertion_start_mass"):
        assert trie[name] == plain[name], name
    assert plain["term_completion_match"] < 0.1 < 0.5 < trie["term_completion_match"]
    # every occurrence whose term, after " ", has one way on at each of its tokens is completed; where
    # two terms share a beginning (" a" of " admitted to" and " acute changes") the model chooses
    from rarelm.artifacts.tokenized import TokenizedData, load_tokenizer
    from rarelm.evaluate.term_trie import term_trie

    data = TokenizedData.open(eval_workspace / "data/tokenized")
    tokenizer = load_tokenizer(data.tokenizer_dir, data.vocab_size)
    paths = term_trie(tokenizer, load_terms(eval_workspace / "data/rare/terms.jsonl"), lead=" ")
    rows = [json.loads(line) for line in (tmp_path / "ws-True-0.0/metrics/eval_occurrences.jsonl").open()]

    def one_way(text: str) -> bool:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        return text.startswith(" ") and all(paths.allowed(ids[:k]) == [ids[k]] for k in range(1, len(ids)))

    unambiguous = [r for r in rows if one_way(r["expected"])]
    assert len(unambiguous) >= 10 and all(r["completion_match"] for r in unambiguous)


def test_stage_puts_the_tokenizers_lead_before_every_window_and_prompt(eval_workspace, tmp_path):
    """A tokenizer that starts every text with a token (Gemma 3's <bos>; here the end-of-text token as
    the post-processor's lead): evaluate says so in one line, scores the same targets, and every term
    prompt is one token longer; the plain tokenizer gets nothing before its windows."""
    from tokenizers import Tokenizer, processors

    runs = {}
    for lead in (False, True):
        ws = tmp_path / f"ws-{lead}"
        shutil.copytree(eval_workspace, ws)
        set_params(ws, **{"eval.splits": ["test"], "eval.block_size": 32})
        if lead:
            path = ws / "data/tokenized/tokenizer/tokenizer.json"
            tokenizer = Tokenizer.from_file(str(path))
            eot = tokenizer.token_to_id("<|endoftext|>")
            tokenizer.post_processor = processors.TemplateProcessing(
                single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", eot)])
            tokenizer.save(str(path))
        result = stage("evaluate", ws, env={"OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, result.stderr
        assert ("every window, prompt and sample starts with <|endoftext|>" in result.stderr) == lead
        runs[lead] = json.loads((ws / "metrics/eval.json").read_text())
    assert runs[True]["n_eval_tokens"] == runs[False]["n_eval_tokens"]
    assert runs[True]["ppl"] != pytest.approx(runs[False]["ppl"])
    assert [r["prompt_tokens"] for r in _rows(tmp_path / "ws-True")] == \
        [r["prompt_tokens"] + 1 for r in _rows(tmp_path / "ws-False")]


def test_stage_with_retrieval_scores_windows_after_train_passages(eval_workspace, tmp_path):
    """`-S retrieval.enabled=true` through the stage: one line says what is retrieved; the in-domain and
    the mixture's general-text perplexity change, the model alone's (forgetting) does not; windows
    and passages that do not fit the model's context are one error line, nothing written."""
    runs = {}
    for enabled in (False, True):
        ws = tmp_path / f"ws-{enabled}"
        shutil.copytree(eval_workspace, ws)
        (ws / "general.txt").write_text("A general sentence about the weather.\nAnother one.\n")
        set_params(ws, **{"retrieval.enabled": enabled, "retrieval.passage_tokens": 8, "eval.block_size": 32,
                          "eval.splits": ["test"], "eval.general_text": "general.txt"})
        result = stage("evaluate", ws, env={"OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, result.stderr
        runs[enabled] = json.loads((ws / "metrics/eval.json").read_text())
        assert ("retrieving 1 passage of 8 tokens, query 32 tokens" in result.stderr) == enabled
    plain, found = runs[False], runs[True]
    assert found["n_eval_tokens"] == plain["n_eval_tokens"] and found["ppl"] != pytest.approx(plain["ppl"])
    assert found["ppl_general_model"] == plain["ppl_general"] != pytest.approx(found["ppl_general"])
    assert [r["prompt_tokens"] for r in _rows(tmp_path / "ws-True")] == \
        [r["prompt_tokens"] + 9 for r in _rows(tmp_path / "ws-False")]
    ws = tmp_path / "ws-True"
    shutil.rmtree(ws / "metrics")
    set_params(ws, **{"eval.block_size": 64})  # the model's whole context of 64, and 9 tokens more
    assert_user_error(stage("evaluate", ws), "eval.block_size 64 + the 9 tokens before it (lead and "
                      "retrieved passages) exceed the model's context of 64", ws, "metrics/eval.json",
                      stage="evaluate")
    set_params(ws, **{"eval.block_size": 0, "retrieval.passage_tokens": 63})  # 0: the context less 64
    assert_user_error(stage("evaluate", ws), "the 64 tokens before every window (lead and retrieved "
                      "passages) leave no room in the model's context of 64", ws, "metrics/eval.json",
                      stage="evaluate")
    set_params(ws, **{"retrieval.passage_tokens": 8})  # 0: windows of 55 targets after the 9 tokens
    assert stage("evaluate", ws).returncode == 0
    assert json.loads((ws / "metrics/eval.json").read_text())["n_eval_tokens"] == plain["n_eval_tokens"]


def test_stage_retrieves_by_the_models_states_after_the_datastore_stage(eval_workspace, tmp_path):
    """`-S retrieval.dense=true`: without the datastore stage's store, one error line and nothing
    written; after it (the stage builds the store for retrieval alone), one line says what is
    retrieved, prompts are a passage and an end-of-text longer, and the scores move."""
    ws = tmp_path / "ws"
    shutil.copytree(eval_workspace, ws)
    env = {"OMP_NUM_THREADS": "1"}
    set_params(ws, **{"eval.splits": ["test"], "eval.block_size": 32})
    assert stage("evaluate", ws, env=env).returncode == 0
    plain = json.loads((ws / "metrics/eval.json").read_text())
    before = _rows(ws)
    shutil.rmtree(ws / "metrics")
    set_params(ws, **{"retrieval.enabled": True, "retrieval.dense": True, "retrieval.passage_tokens": 8})
    assert_user_error(stage("evaluate", ws, env=env), "no meta.json; run the datastore stage first", ws,
                      "metrics/eval.json", stage="evaluate")
    built = stage("datastore", ws, env=env)
    assert built.returncode == 0 and built.stdout.startswith("datastore: "), built.stderr
    entries = json.loads((ws / "data/datastore/meta.json").read_text())["entries"]
    result = stage("evaluate", ws, env=env)
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stderr.splitlines() if x.startswith("evaluate: retrieving"))
    assert line.startswith("evaluate: retrieving 1 passage of 8 tokens, query 32 tokens, by states from ")
    assert line.endswith(f"(by the model's states: the passage after each nearest of {entries:,} datastore "
                         "keys)")
    found = json.loads((ws / "metrics/eval.json").read_text())
    assert found["n_eval_tokens"] == plain["n_eval_tokens"] and found["ppl"] != pytest.approx(plain["ppl"])
    assert [r["prompt_tokens"] for r in _rows(ws)] == [r["prompt_tokens"] + 9 for r in before]


def _rows(ws) -> list[dict]:
    return [json.loads(line) for line in (ws / "metrics/eval_occurrences.jsonl").open()]


def test_unreachable_store_is_one_warning_line_or_one_error_if_required(tmp_path, monkeypatch, capsys):
    """The store is MLFLOW_TRACKING_URI's (the model's run file names another: no hint)."""
    from rarelm.params import Params, TrackingParams
    from rarelm.tracking.run import open_run

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    run_file = tmp_path / "mlflow_run.json"
    run_file.write_text(json.dumps({"run_id": "0" * 32, "tracking_uri": f"sqlite:///{tmp_path}/x.db",
                                    "experiment": "rarelm"}))
    optional = Params(tracking=TrackingParams(required=False))
    for path in (run_file, tmp_path / "missing.json"):  # a model trained with tracking or without
        run = open_run(path, "evaluate", optional)
        log_eval_metrics(run, {"ppl": 3.0}, inputs=[])
        log_eval_files(run, [], log_text=True)
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            "rarelm evaluate: warning: MLflow tracking store http://127.0.0.1:9 is not reachable"), lines
    assert not (tmp_path / "x.db").exists()
    run = open_run(run_file, "evaluate", Params())  # tracking.required: true
    with pytest.raises(RarelmError, match=r"^MLflow tracking store http://127.0.0.1:9 cannot log \("):
        log_eval_metrics(run, {"ppl": 3.0}, inputs=[])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("breakage,message", [
    ("no_model", "models/model: no such model folder"),
    ("no_terms", "data/rare/terms.jsonl: no such file; run the rare_terms stage first"),
    ("no_buckets", "data/rare/buckets.npy: not found; run the rare_terms stage first"),
    ("no_prepared", "data/prepared/test.jsonl: no such file; run the prepare stage first"),
    ("short_prepared", "the prepared split has 1 documents but the tokenized one"),
    ("other_text", "the tokenizer does not reproduce document 0 of the tokenized split"),
    ("no_general", "params: eval.general_text = 'data/general/none.txt': no such file"),
])
def test_bad_inputs_are_one_line_errors_without_output(eval_workspace, tmp_path, breakage, message):
    ws = tmp_path / "ws"
    shutil.copytree(eval_workspace, ws)
    prepared = ws / "data/prepared/test.jsonl"
    lines = prepared.read_text(encoding="utf-8").splitlines(keepends=True)
    if breakage == "no_model":
        shutil.rmtree(ws / "models/model")
    elif breakage == "no_prepared":
        prepared.unlink()
    elif breakage == "short_prepared":  # the text no longer matches the tokenized split
        prepared.write_text(lines[0], encoding="utf-8")
    elif breakage == "other_text":  # same documents, other words: a term found in text, other tokens
        first = json.loads(lines[0])["text"]
        words = [w.strip(".,:") for w in first.split()]
        lines[0] = json.dumps({"text": f"{words[0]} {words[1]} " + first}) + "\n"
        prepared.write_text("".join(lines), encoding="utf-8")
    elif breakage == "no_general":
        set_params(ws, **{"eval.general_text": "data/general/none.txt"})
    else:
        (ws / "data/rare" / ("terms.jsonl" if breakage == "no_terms" else "buckets.npy")).unlink()
    result = stage("evaluate", ws)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (ws / "metrics").exists() and not (ws / "plots").exists()


def test_folder_that_is_not_a_causal_lm(tmp_path):
    """In-process (the stage path is the same as above): transformers is already imported here."""
    from rarelm.evaluate.model_folder import load_causal_lm

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(RarelmError, match="not a loadable causal language model") as info:
        load_causal_lm(tmp_path)
    assert "\n" not in str(info.value)


def test_dvc_plots_show_renders_the_eval_plots(repo):
    """dvc.yaml declares both CSVs with their templates; `dvc plots show` draws them."""
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]
    plots = {next(iter(p)): p[next(iter(p))] for p in stages["evaluate"]["plots"]}
    assert plots["plots/eval_buckets.csv"]["template"] == "bar_horizontal_log"  # `unseen` dwarfs the rest
    (repo / "plots").mkdir(exist_ok=True)
    (repo / "plots/eval_buckets.csv").write_text("bucket,tokens,ppl,acc,recall_at_5\nall,10,5.5,0.3,0.6\n"
                                                 "rare,2,40.25,0.1,0.2\n")
    (repo / "plots/eval_term_bands.csv").write_text(
        "band,terms,occurrences,exact_match,first_token_acc,choice_acc,nll\n"
        "band 01: 1,3,4,0.25,0.5,0.75,3.5\n")
    result = run(["dvc", "plots", "show", "-o", "out", "plots/eval_buckets.csv", "plots/eval_term_bands.csv"],
                 repo, check=True)
    html = (repo / "out/index.html").read_text()
    assert "40.25" in html and "band 01: 1" in html and "bar" in html, result.stdout

