"""Term-trie constrained decoding (eval.term_trie): once the text ends inside a term, the next token
continues that term.

The extracted terms, each tokenized after the split's usual lead (" " in English, "" in Chinese),
form a trie. Before every generated token, the longest suffix of the text so far (prompt included)
that is a path from the trie's root decides: if it is a term's proper prefix and no whole term,
only the tokens that continue it in the trie may come next; otherwise (no such suffix, or a whole
term, which may end there or go on) the model chooses freely. With the terms " access control list"
and " access point", after " access" the next token is " control" or " point", after " access
control" it is " list"; after " list" nothing is constrained.

It acts on generation alone (greedy and sampled: exact match, completion, diversity, false
insertion); teacher-forced scores (perplexity, term NLL, closed-set ranks) never pass through it.

    with constrained(term_trie(tokenizer, terms, lead=" ")):
        ...  # every greedy_continue / sample_continue in the block (rarelm.evaluate.decoding)
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor


class TermTrie(LogitsProcessor):
    """The logits processor: tokens outside the trie's continuations get -inf where a term is open.

    >>> trie = TermTrie([[4, 5, 6], [4, 7], [8]])
    >>> trie.allowed([1, 4]), trie.allowed([1, 4, 5]), trie.allowed([4, 7]), trie.allowed([1, 8])
    ([5, 7], [6], None, None)
    >>> scores = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, -9.0, 0.0]])
    >>> trie(torch.tensor([[1, 4, 5]]), scores.clone()).argmax(-1).item()  # only 6 may follow 4 5
    6
    >>> scores[0, 6] = float("-inf")  # a distribution that rules 6 out (a kNN-LM at lambda 1): free
    >>> trie(torch.tensor([[1, 4, 5]]), scores.clone()).argmax(-1).item()
    5
    """

    def __init__(self, sequences: list[list[int]]):
        self.children: dict[tuple[int, ...], set[int]] = {}
        self.ends: set[tuple[int, ...]] = set()
        for seq in sequences:
            if not seq:
                continue
            self.ends.add(tuple(seq))
            for k in range(1, len(seq)):
                self.children.setdefault(tuple(seq[:k]), set()).add(seq[k])
        self.longest = max(map(len, self.ends), default=0)

    def allowed(self, row: list[int]) -> list[int] | None:
        """The tokens that may come after `row`, or None where the model chooses freely."""
        for k in range(min(self.longest, len(row)), 0, -1):  # the longest suffix on a trie path
            suffix = tuple(row[-k:])
            if suffix in self.ends:
                return None
            if suffix in self.children:
                return sorted(self.children[suffix])
        return None

    def __call__(self, input_ids, scores):
        for r, row in enumerate(input_ids.tolist()):
            allowed = self.allowed(row)
            if allowed is not None:
                keep = torch.as_tensor(allowed, device=scores.device)
                kept = scores[r, keep]
                if torch.isneginf(kept).all():  # the distribution rules every continuation out: free
                    continue
                scores[r] = float("-inf")
                scores[r, keep] = kept
        return scores


def term_trie(tokenizer, terms, lead: str) -> TermTrie:
    """The trie of the extracted terms (term_search.Term), each tokenized as lead + its text."""
    return TermTrie([e.ids for e in tokenizer.encode_batch([lead + t.text for t in terms],
                                                            add_special_tokens=False)])


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
