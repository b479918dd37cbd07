"""The front page and the docs: README.md short and undated, every link resolving, every
generated table on docs/results.md, every docs page in the table of contents.

A link's anchor is checked against the headings of the page it points to, slugged as GitHub does:

    >>> slug("`tokenizer.cjk`: one token per Han character, or BPE across them")
    'tokenizercjk-one-token-per-han-character-or-bpe-across-them'
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (outside code fences); a repeated heading gets -1, -2, ..."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = re.match(r"#{1,6} (.*)", line)
        if heading and not fenced:
            s = slug(heading.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
    return found


def test_slug_matches_githubs_anchors():
    assert slug("Model size: DDP, FSDP or LoRA") == "model-size-ddp-fsdp-or-lora"
    assert slug("Does a change help? Demo regime, learning curves, `rarelm compare`") == \
        "does-a-change-help-demo-regime-learning-curves-rarelm-compare"


def test_readme_fits_on_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, len(lines)
    text = "\n".join(lines)
    # no issue numbers, no dated measurements, no generated blocks
    assert not re.search(r"\bissue \d+", text, re.I)
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text)
    assert ":start -->" not in text and ":end -->" not in text
    # its sections in the agreed order: a newcomer's two commands before the findings
    heads = [line[3:] for line in lines if line.startswith("## ")]
    assert heads == ["Two commands", "What rarelm does and what it found", "Your own corpus and model",
                     "The DAG", "Metrics", "Remedies", "Outputs"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        to = (page.parent / path) if path else page
        if not to.exists():
            broken.append(target)
        elif anchor and to.suffix == ".md" and anchor not in anchors(to):
            broken.append(target)
    assert broken == []


def test_readmes_make_targets_exist():
    targets = set(re.findall(r"^([a-zA-Z][\w-]*):", (REPO / "Makefile").read_text(), re.M))
    used = set(re.findall(r"`make ([a-z][\w-]*)", README.read_text(encoding="utf-8")))
    used |= set(re.findall(r"^    make ([a-z][\w-]*)", README.read_text(encoding="utf-8"), re.M))
    assert used >= {"repro", "test"} and used <= targets, used - targets


def test_every_plans_tables_sit_on_the_results_page():
    """`rarelm headline` writes a plan's tables between its section's markers on docs/results.md."""
    results = (DOCS / "results.md").read_text(encoding="utf-8")
    plans = [REPO / "headline.yaml", *sorted(REPO.glob("*/*.yaml"))]  # realtext/, smollm2/, ...
    plans = [p for p in plans if "configurations" in (yaml.safe_load(p.read_text()) or {})]
    assert REPO / "realtext" / "headline_foldoc_en.yaml" in plans
    for plan in plans:
        section = yaml.safe_load(plan.read_text()).get("section", "headline")
        for marker in (f"<!-- {section}:start -->", f"<!-- {section}:end -->"):
            assert results.count(marker) == 1, (plan.name, marker)


def test_the_table_of_contents_links_every_docs_page():
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    linked = {t.split("#")[0] for t in LINK.findall(index)}
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md"}
    assert pages <= linked, pages - linked
    assert "docs/index.md" in README.read_text(encoding="utf-8")
