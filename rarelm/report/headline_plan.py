"""The headline plan (headline.yaml) and the rules fixed in it before any result is seen.

The plan lists configurations as `dvc exp run -S` overrides on top of `common`, and `decode`
variants that change only `evaluate`'s params of a trained configuration. The rounds that run it:
rarelm/report/headline.py.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from rarelm.errors import RarelmError

PREFIX = "hl-"
RANK_SLICE = "all"
RANK_METRIC, TIE_METRIC = "nll_per_char", "token_acc"  # lower first; then higher first (a plan's tie_metric)
# what a plan may break ties by (higher first): term-token accuracy, or the completion of a term
# given its first token (spelling, apart from when to say it)
TIE_METRICS = {"token_acc": "term-token accuracy",
               "completion_match": "the completion given the term's first token"}  # -> the page's words
# "nll" (NLL per term token) is asked for so that compare derives term perplexity (term_ppl) from it
TABLE_METRICS = (RANK_METRIC, TIE_METRIC, "nll", "completion_match", "exact_match", "exact_match_ci",
                 "prefix_share")
# the false-insertion figures a plan's guard can use (eval.json), with their name in the tables:
# terms in sampled text per 1,000 tokens over the text's own rate (counts: coarse when the baseline
# makes one or two), the same per 1,000 characters (tokenizer-invariant: models of different
# tokenizers, or terms as tokens, compare), or the teacher-forced mass on term-start tokens where no
# term starts (a mean over every scored position)
INSERTION_METRICS = {"false_insertion_rate": "false insertion",
                     "false_insertion_rate_chars": "false insertion per character",
                     "false_insertion_start_mass": "term-start mass off terms"}


@dataclasses.dataclass(frozen=True)
class Plan:
    """headline.yaml: what to run."""

    common: list[str]
    screen_seeds: list[int]  # the seeds that choose the finalists
    final_seeds: list[int]  # fresh seeds that confirm them (none of the screening seeds)
    configurations: dict[str, list[str]]  # name -> overrides; the first is the baseline
    decode: dict[str, dict[str, Any]]  # name -> {"of": configuration, "set": overrides}
    finalists: int = 2
    combine: int = 2
    # only configurations whose overall perplexity (all tokens) is within this fraction of the
    # baseline's are ranked: a remedy must not buy rare terms with the common text
    ppl_tolerance: float = 0.02
    # ... and whose false-insertion figure is within this fraction (relative) of the baseline's
    insertion_tolerance: float = 0.10
    insertion_metric: str = "false_insertion_rate"  # which figure: one of INSERTION_METRICS
    # ... and whose general-text perplexities (ppl_general_model and ppl_general_outside, the model
    # alone: forgetting; each where the runs score it) are within this fraction of the baseline's
    general_tolerance: float = 0.02
    # ties of the ranking metric (term NLL per character, lower first) broken by this, higher first
    tie_metric: str = TIE_METRIC
    screen_split: str = "val"  # the split the choice is made on
    final_split: str = "test"  # the split the finalists are confirmed on
    prefix: str = PREFIX  # experiment names: <prefix><configuration>-s<seed>
    section: str = "headline"  # docs/results.md holds its tables between <!-- section:start/end -->

    @property
    def fixed(self) -> bool:
        """No screen_seeds: a fixed comparison, every configuration confirmed, nothing chosen."""
        return not self.screen_seeds

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        path = Path(path)
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise RarelmError(f"{path}: cannot read the headline plan ({exc})") from None
        try:
            plan = cls(common=[str(s) for s in raw.get("common") or []],
                       screen_seeds=[int(s) for s in raw["screen_seeds"]],
                       final_seeds=[int(s) for s in raw["final_seeds"]],
                       configurations={str(k): [str(s) for s in v or []]
                                       for k, v in raw["configurations"].items()},
                       decode={str(k): {"of": str(v["of"]), "set": [str(s) for s in v["set"]]}
                               for k, v in (raw.get("decode") or {}).items()},
                       finalists=int(raw.get("finalists", 2)), combine=int(raw.get("combine", 2)),
                       ppl_tolerance=float(raw.get("ppl_tolerance", 0.02)),
                       insertion_tolerance=float(raw.get("insertion_tolerance", 0.10)),
                       insertion_metric=str(raw.get("insertion_metric", "false_insertion_rate")),
                       general_tolerance=float(raw.get("general_tolerance", 0.02)),
                       tie_metric=str(raw.get("tie_metric", TIE_METRIC)),
                       screen_split=str(raw.get("screen_split", "val")),
                       final_split=str(raw.get("final_split", "test")),
                       prefix=str(raw.get("prefix", PREFIX)), section=str(raw.get("section", "headline")))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise RarelmError(f"{path}: not a headline plan ({type(exc).__name__}: {exc}); "
                              "see rarelm/report/headline_plan.py") from None
        if not plan.final_seeds or not plan.configurations:
            raise RarelmError(f"{path}: the plan needs final_seeds and at least one configuration (the "
                              "baseline); screen_seeds: [] makes it a fixed comparison")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", plan.prefix + plan.section):
            raise RarelmError(f"{path}: prefix and section must be letters, digits, '_', '.' or '-'")
        if plan.insertion_metric not in INSERTION_METRICS:
            raise RarelmError(f"{path}: insertion_metric {plan.insertion_metric!r} is not one of "
                              f"{', '.join(INSERTION_METRICS)}")
        if plan.tie_metric not in TIE_METRICS:
            raise RarelmError(f"{path}: tie_metric {plan.tie_metric!r} is not one of "
                              f"{', '.join(TIE_METRICS)}")
        reused = sorted(set(plan.screen_seeds) & set(plan.final_seeds))
        if reused:
            raise RarelmError(f"{path}: final_seeds repeat screening seed {reused[0]}; the finalists are "
                              "confirmed on seeds that took no part in choosing them")
        unknown = [d["of"] for d in plan.decode.values() if d["of"] not in plan.configurations]
        if unknown:
            raise RarelmError(f"{path}: decode variant of unknown configuration {unknown[0]!r}")
        return plan

    @property
    def baseline(self) -> str:
        return next(iter(self.configurations))

    def overrides(self, name: str, extra: dict[str, list[str]]) -> list[str]:
        """A configuration's or decode variant's -S overrides, without common and seed."""
        if name in self.decode:
            return [*self.overrides(self.decode[name]["of"], extra), *self.decode[name]["set"]]
        return extra.get(name) or self.configurations[name]

    def experiment(self, name: str, seed: int) -> str:
        return experiment(name, seed, self.prefix)

    def queue_order(self, names: list[str]) -> list[str]:
        """`names` with each decode variant right after the configuration it evaluates: it then
        runs while DVC's run cache still holds that configuration's trained model on this machine
        (only `evaluate` runs), and a command stopped part-way has the cheap variants done.

        >>> plan = Plan([], [1], [2], {"a": [], "b": []}, {"a-t1": {"of": "a", "set": []},
        ...                                               "a-t2": {"of": "a", "set": []}})
        >>> plan.queue_order(["a", "b", "a-t1", "a-t2"])
        ['a', 'a-t1', 'a-t2', 'b']
        """
        order = [n for n in names if n not in self.decode]
        for name in reversed([n for n in names if n in self.decode]):
            of = self.decode[name]["of"]
            order.insert(order.index(of) + 1 if of in order else len(order), name)
        return order

    def batch(self, names: list[str], seeds: list[int], extra: dict[str, list[str]],
              split: str) -> list[tuple[str, list[str]]]:
        """(experiment, -S overrides) of each seed x name: common, the round's split, the seed, then
        the configuration's. `evaluate` scores only the split its round is judged on (an
        `eval.splits` in common gives way to it): a screening run never computes a test figure,
        and no run pays for a split nothing reads (its figures do not depend on the other splits)."""
        common = [s for s in self.common if not s.replace(" ", "").startswith("eval.splits=")]
        return [(self.experiment(n, s), [*common, f"eval.splits=[{split}]", f"seed={s}",
                                         *self.overrides(n, extra)])
                for s in seeds for n in names]


def experiment(name: str, seed: int, prefix: str = PREFIX) -> str:
    """The DVC experiment of a configuration and seed.

    >>> experiment("baseline", 1337), experiment("finetune", 1, "rt-foldoc_en-")
    ('hl-baseline-s1337', 'rt-foldoc_en-finetune-s1')
    """
    return f"{prefix}{name}-s{seed}"


def combination(ranked: list[str], overrides: Callable[[str], list[str]], n: int) -> list[str]:
    """Merge the overrides of the first `n` ranked configurations whose keys do not clash.

    >>> table = {"a": ["loss.targets=terms", "loss.rare_weight=2"], "b": ["loss.rare_weight=4"],
    ...          "c": ["alpha=1"]}
    >>> combination(["a", "b", "c"], table.__getitem__, 2)
    ['loss.targets=terms', 'loss.rare_weight=2', 'alpha=1']
    """
    merged: dict[str, str] = {}
    taken = 0
    for name in ranked:
        sets = dict(s.split("=", 1) for s in overrides(name))
        if not sets or set(sets) & set(merged):
            continue
        merged.update(sets)
        taken += 1
        if taken == n:
            break
    return [f"{k}={v}" for k, v in merged.items()] if taken == n else []
