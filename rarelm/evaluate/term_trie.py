"""Term-trie constrained decoding (eval.term_trie): once the model has begun a term, the next token
continues that term.

The extracted terms, each tokenized after the split's usual lead (" " in English, "" in Chinese),
form a trie. Before every generated token, the longest suffix of the model's own tokens (what it
wrote in this decode, and what the caller gives as written by it: the term's first token of the
completion match) that is a path from the trie's root decides: if it is a term's proper prefix and
no whole term, only the tokens that continue it in the trie may come next; otherwise (no such
suffix, or a whole term, which may end there or go on) the model chooses freely. With a gate
(eval.term_trie_min_mass > 0) a step is constrained only where the distribution being decoded (the
model's, with a logit bias or a kNN-LM mixed in where on) puts at least that much probability on
the term's continuations: a token that merely begins a term, in text going elsewhere, is not made
to finish one (the ungated trie's false insertions, docs/results.md). With the terms
" access control list" and " access point", after the model's " access" the next token is
" control" or " point", after " access control" it is " list"; after " list" nothing is constrained.

The prompt's own text opens no term, except for the whitespace at its very end, a term's lead
where a tokenizer writes " " as a token of its own (a term " is a" as "Ġ" "is" "Ġa" after a prompt
ending in "Ġ"): in Chinese, whose terms no space sets off, a prompt's last characters are often a
term's beginning (所有 of 所有者 before 文件), and a trie that read them forced that term where the
text goes on with another (until 2026-12-07 it did: docs/results.md, the term trie on manpages_zh).

It acts on generation alone (greedy and sampled: exact match, completion, diversity, false
insertion); teacher-forced scores (perplexity, term NLL, closed-set ranks) never pass through it.

    with constrained(term_trie(tokenizer, terms, lead=" ")):
        ...  # every greedy_continue / sample_continue in the block (rarelm.evaluate.decoding)
"""

from __future__ import annotations

import copy

import torch
from transformers import LogitsProcessor


class TermTrie(LogitsProcessor):
    """The logits processor: tokens outside the trie's continuations get -inf where a term is open.

    `bound(starts)` is the processor of one decode: row r's term may begin at position starts[r] of
    its (left-padded) ids or later, or on the `blank` tokens (whitespace alone) right before it, not
    earlier in the prompt; unbound, anywhere.

    >>> trie = TermTrie([[4, 5, 6], [4, 7], [8], [9, 4, 7]], blank={9})
    >>> trie.allowed([1, 4]), trie.allowed([1, 4, 5]), trie.allowed([4, 7]), trie.allowed([1, 8])
    ([5, 7], [6], None, None)
    >>> trie.allowed([1, 4, 5], start=2), trie.allowed([1, 4, 5], start=3)  # 4 is the prompt's: free
    (None, None)
    >>> trie.allowed([1, 9, 4], start=2)  # the prompt's blank 9 leads the model's 4: 9 4 7
    [7]
    >>> scores = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, -9.0, 0.0, 0.0]])
    >>> trie(torch.tensor([[1, 4]]), scores.clone()).argmax(-1).item()  # only 5 or 7 may follow 4
    5
    >>> trie.bound([2])(torch.tensor([[1, 4]]), scores.clone()).argmax(-1).item()  # 4 the prompt's: free
    6
    >>> scores[0, [5, 7]] = float("-inf")  # a distribution that rules 5 and 7 out (a kNN-LM): free
    >>> trie(torch.tensor([[1, 4]]), scores.clone()).argmax(-1).item()
    6
    >>> scores = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, -9.0, 0.0, 0.0]])  # 5, 7: 0.232
    >>> gated = [TermTrie([[4, 5, 6], [4, 7]], min_mass=gate) for gate in (0.2, 0.5)]
    >>> [g(torch.tensor([[1, 4]]), scores.clone()).argmax(-1).item() for g in gated]  # 0.5 > 0.232: free
    [5, 6]
    """

    def __init__(self, sequences: list[list[int]], blank: set[int] = frozenset(), min_mass: float = 0.0):
        self.blank = frozenset(blank)
        self.min_mass = min_mass
        self.children: dict[tuple[int, ...], set[int]] = {}
        self.ends: set[tuple[int, ...]] = set()
        for seq in sequences:
            if not seq:
                continue
            self.ends.add(tuple(seq))
            for k in range(1, len(seq)):
                self.children.setdefault(tuple(seq[:k]), set()).add(seq[k])
        self.longest = max(map(len, self.ends), default=0)
        self.starts: list[int] | None = None

    def bound(self, starts: list[int]) -> TermTrie:
        """This trie for one decode whose row r may open a term from position starts[r] on."""
        one = copy.copy(self)
        one.starts = list(starts)
        return one

    def allowed(self, row: list[int], start: int = 0) -> list[int] | None:
        """The tokens that may come after `row`, or None where the model chooses freely; a term
        begins at position `start` of the row or later, or on the blank tokens right before it."""
        while start > 0 and row[start - 1] in self.blank:
            start -= 1
        for k in range(min(self.longest, len(row) - start), 0, -1):  # the longest suffix on a trie path
            suffix = tuple(row[-k:])
            if suffix in self.ends:
                return None
            if suffix in self.children:
                return sorted(self.children[suffix])
        return None

    def __call__(self, input_ids, scores):
        for r, row in enumerate(input_ids.tolist()):
            allowed = self.allowed(row, self.starts[r] if self.starts is not None else 0)
            if allowed is not None:
                keep = torch.as_tensor(allowed, device=scores.device)
                kept = scores[r, keep]
                if torch.isneginf(kept).all():  # the distribution rules every continuation out: free
                    continue
                if self.min_mass and torch.softmax(scores[r].float(), -1)[keep].sum() < self.min_mass:
                    continue  # the model is not heading for the term: free
                scores[r] = float("-inf")
                scores[r, keep] = kept
        return scores


def term_trie(tokenizer, terms, lead: str, min_mass: float = 0.0) -> TermTrie:
    """The trie of the extracted terms (term_search.Term), each tokenized as lead + its text; a
    term's first token that decodes to whitespace alone is a blank one (TermTrie); `min_mass`: the
    gate (TermTrie)."""
    paths = [e.ids for e in tokenizer.encode_batch([lead + t.text for t in terms], add_special_tokens=False)]
    firsts = {p[0] for p in paths if p}
    return TermTrie(paths, blank={i for i in firsts if not tokenizer.decode([i]).strip()}, min_mass=min_mass)


def usual_lead(per_term) -> str:
    """The commonest whitespace lead of the found occurrences (" " in English, "" in Chinese); ""
    when none is found.

    >>> from types import SimpleNamespace as O
    >>> usual_lead([[O(lead=" "), O(lead="(")], [O(lead=" ")]]), usual_lead([[O(lead="")]]), usual_lead([])
    (' ', '', '')
    """
    counts: dict[str, int] = {}
    for occurrences in per_term:
        for o in occurrences:
            if not o.lead.strip():
                counts[o.lead] = counts.get(o.lead, 0) + 1
    return max(counts, key=counts.__getitem__, default="")
