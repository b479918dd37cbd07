"""General-text replay: a fixed share of every training batch's rows from text the base model trained on.

A fine-tune on a small domain corpus forgets general language (one seed on manpages_zh: general-text
perplexity 79.9 -> 446.4 after the plain fine-tune). Continual pre-training keeps forgetting down by
mixing a few percent of the old pretraining data into the new data's batches (Ibrahim et al. 2024,
"Simple and Scalable Strategies to Continually Pre-train Large Language Models", arXiv:2403.08763:
replay of 1-5% of the old data, no change to the loss). Here, with share s = `train.replay_share` and
micro-batch B = `train.batch_size`, every micro-batch of every rank holds

    r = floor(s * B + 1/2) rows from `train.replay_text`  and  B - r rows of the domain corpus,

the replay rows last. They are windows of `model.block_size + 1` tokens of the replay text (one
document a line, each followed by the end-of-text token, tokenized with the run's tokenizer), drawn by
their own `WeightedDistributedSampler` (equal weights: each replay window once per replay epoch,
shuffled and sharded over the ranks with a seed derived from `seed`), so each rank takes its own share
and the replay stream's position is checkpointed beside the domain stream's. The loss, the objective
and the step are the plain ones: the batch is what changes.

Both streams address one token space: domain windows start in [0, N) of the train split's N tokens,
replay windows at N + their start in the replay tokens (`JoinedTokens`), so `to_batch` and the
objective read them alike (a term index knows no position >= N: replay rows have no term targets).

Worked example: B = 16, s = 0.25 gives r = floor(4.5) = 4 replay rows and 12 domain rows per
micro-batch; with N = 1000 train tokens a replay window starting at token 40 of the replay text has
start 1040:

    >>> replay_rows(0.25, 16), replay_rows(0.03, 16), replay_rows(0.0, 16)
    (4, 0, 0)
    >>> joined = JoinedTokens(np.arange(5), np.array([50, 51, 52]))
    >>> len(joined), joined[np.array([[3, 4], [5, 7]])].tolist()
    (8, [[3, 4], [50, 52]])
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rarelm.errors import RarelmError
from rarelm.files import read_input

# SeedSequence key that sets the replay stream's seed apart from the domain stream's (b"repl")
_REPLAY_KEY = 0x7265706C


def replay_rows(share: float, batch_size: int) -> int:
    """Rows of a micro-batch of `batch_size` drawn from the replay text: share * batch_size, rounded
    half up (rarelm.params.TrainParams checks the same formula)."""
    return int(np.floor(share * batch_size + 0.5))


def replay_seed(seed: int) -> int:
    """The replay sampler's seed: derived from the run's `seed`, apart from the domain sampler's.

    >>> replay_seed(1337) == replay_seed(1337) != replay_seed(1338)
    True
    """
    return int(np.random.SeedSequence([seed, _REPLAY_KEY]).generate_state(1, np.uint32)[0])


def replay_tokens(path: str | Path, tokenizer, eot_id: int, block_size: int) -> np.ndarray:
    """The replay text's tokens (int64): each non-empty line a document, followed by `eot_id`, as the
    tokenize stage lays out a split. A missing, non-UTF-8 or too short file is a RarelmError."""
    path = Path(path)
    what = f"params: train.replay_text = {str(path)!r}"
    try:
        documents = [line for line in read_input("train.replay_text", path).decode("utf-8").splitlines()
                     if line.strip()]
    except FileNotFoundError:
        raise RarelmError(f"{what}: no such file (a UTF-8 text file, one document a line; "
                          "e.g. data/general/en.replay.txt)") from None
    except UnicodeDecodeError as exc:
        raise RarelmError(f"{what}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(documents, add_special_tokens=False):
        ids.extend(encoding.ids)
        ids.append(eot_id)
    if len(ids) < block_size + 1:
        raise RarelmError(f"{what}: {len(ids)} tokens, fewer than one window of model.block_size + 1 "
                          f"= {block_size + 1}")
    return np.asarray(ids, dtype=np.int64)


class JoinedTokens:
    """The train tokens followed by the replay tokens, as one read-only array for `to_batch`:
    position p < len(domain) is domain[p], else replay[p - len(domain)]. Nothing is copied (the
    train tokens stay memory-mapped)."""

    def __init__(self, domain: np.ndarray, replay: np.ndarray):
        self.domain, self.replay = domain, replay

    def __len__(self) -> int:
        return len(self.domain) + len(self.replay)

    def __getitem__(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        out = np.empty(positions.shape, dtype=np.int64)
        in_domain = positions < len(self.domain)
        out[in_domain] = self.domain[positions[in_domain]]
        out[~in_domain] = self.replay[positions[~in_domain] - len(self.domain)]
        return out


class ReplayStream:
    """A `SampleStream` of the domain with `rows` replay windows at the end of every `take`.

    The same interface as `SampleStream` (take, state, restore, tokens); its state is the domain
    stream's plus the replay stream's under "replay", so a checkpoint puts both back exactly.
    """

    def __init__(self, domain, replay, share: float):
        self.domain, self.replay, self.share = domain, replay, share
        self.tokens = JoinedTokens(domain.tokens, replay.tokens)

    def take(self, n: int) -> np.ndarray:
        """`n` start positions: n - r of the domain, then r of the replay text shifted past it."""
        r = replay_rows(self.share, n)
        return np.concatenate([self.domain.take(n - r),
                               len(self.domain.tokens) + self.replay.take(r)])

    def state(self) -> dict:
        return {**self.domain.state(), "replay": self.replay.state()}

    def restore(self, state: dict) -> None:
        self.domain.restore(state)
        self.replay.restore(state["replay"])
