"""False insertion: does the model write terms where the text has none?

(a) `false_insertion`: sampled continuations (rarelm.evaluate.diversity.sampled_continuations);
extracted terms per 1,000 tokens in them vs in the split's text (`false_insertion_rate`), and per
1,000 characters (`false_insertion_rate_chars`: a tokenizer that cuts text into more tokens would
otherwise look as if it wrote fewer terms, so models of different tokenizers compare only here).
(b) `term_start_mask` marks where term occurrences start, so that token scoring
(rarelm.evaluate.token_scoring) measures the probability mass on term-start tokens elsewhere.
"""

from __future__ import annotations

import numpy as np

from rarelm.evaluate.common import EvalContext, SplitText, ratio
from rarelm.evaluate.diversity import sampled_continuations
from rarelm.rare_terms import term_search


def count_terms(texts: list[str], terms: list[term_search.Term]) -> int:
    """Term occurrences in some texts, found as in the evaluated split (term_search.find_in_text).

    >>> count_terms(["the acute MI was", "acute MIs; acute MI"], [term_search.Term("acute MI", 3)])
    2
    """
    text = term_search.FoldedText("\n".join(texts))  # folded once for all terms
    glossary = term_search.glossary_of(terms)  # Chinese terms: jieba's words, glossary terms whole
    return sum(len(text.find(t.text, t.han_words, glossary)) for t in terms if "\n" not in t.text)


def term_start_mask(per_term: list[list[term_search.Occurrence]], n_tokens: int) -> np.ndarray:
    """Boolean per split position: the first token covering a term occurrence is there."""
    mask = np.zeros(n_tokens, dtype=bool)
    for occurrences in per_term:
        for o in occurrences:
            mask[o.start] = True
    return mask


def insertion_rates(generated: list[str], human: list[str], n_tokens: int, terms: list[term_search.Term],
                    text_occurrences: int, split: SplitText) -> dict:
    """False insertion (a): extracted terms per 1,000 tokens written by the model vs in the text.

    `false_insertion_gen_per_1k`: in the sampled continuations (`generated`, `n_tokens` tokens);
    `_human_per_1k`: in the text that followed the same prompts (`human`, as many tokens);
    `_text_per_1k`: in the whole split (its `text_occurrences` term occurrences over its tokens);
    `false_insertion_rate` = gen / text (1 = the model writes terms as often
    as the text has them; above 1 it inserts terms where the text has none). A worked example:
    3 terms in 1,000 sampled tokens, 300 occurrences in a 50,000-token split: 3 vs 6 per 1,000,
    ratio 0.5. The same per 1,000 characters (`_per_1k_chars`, `false_insertion_rate_chars`) when
    the split has documents (its characters): the sampled texts' characters as decoded.
    """
    found_gen, found_human = count_terms(generated, terms), count_terms(human, terms)
    gen = 1000.0 * found_gen / n_tokens
    text = ratio(1000.0 * text_occurrences, len(split.tokens))
    out = {"false_insertion_gen_per_1k": gen,
           "false_insertion_human_per_1k": 1000.0 * found_human / n_tokens,
           "false_insertion_text_per_1k": text,
           "false_insertion_rate": None if not text else gen / text,
           "n_false_insertion_tokens": n_tokens}
    chars, text_chars = sum(map(len, generated)), sum(map(len, split.documents))
    if text_chars and chars:
        gen_chars, text_per_chars = 1000.0 * found_gen / chars, 1000.0 * text_occurrences / text_chars
        out.update({"false_insertion_gen_per_1k_chars": gen_chars,
                    "false_insertion_human_per_1k_chars": ratio(1000.0 * found_human, sum(map(len, human))),
                    "false_insertion_text_per_1k_chars": text_per_chars,
                    "false_insertion_rate_chars": gen_chars / text_per_chars if text_occurrences else None,
                    "n_false_insertion_chars": chars})
    return out


def false_insertion(ctx: EvalContext, split: SplitText, terms: list[term_search.Term],
                    text_occurrences: int) -> dict:
    """insertion_rates on eval.insertion_prompts continuations of eval.insertion_tokens sampled
    tokens (sampled_continuations); per character too where the split has its documents."""
    sampled = sampled_continuations(ctx, split, ctx.params.insertion_prompts, ctx.params.insertion_tokens,
                                    what="sampling for false insertion")
    if sampled is None:
        return {"n_false_insertion_tokens": 0}

    def texts(rows: np.ndarray) -> list[str]:
        return [ctx.tokenizer.decode([int(t) for t in row], skip_special_tokens=False) for row in rows]

    gen, human = sampled  # as many tokens: n_new after each of the same prompts
    return insertion_rates(texts(gen), texts(human), gen.size, terms, text_occurrences, split)
