"""rarelm/report/plots_page.py and the committed .dvc/plots/offline.html: `dvc plots` pages draw offline."""

from __future__ import annotations

import configparser
import hashlib
import re
import subprocess
import sys

import pytest

from rarelm.errors import RarelmError
from rarelm.report.plots_page import (
    LICENSES,
    PACKAGES,
    PAGE,
    Script,
    build_page,
    inlined_scripts,
    licenses_text,
)
from tests.conftest import REPO


def test_page_inlines_the_scripts_in_order_around_dvcs_placeholders():
    scripts = [Script("vega", "1.0.0", "BSD-3-Clause", "var vega = {};"),
               Script("vega-embed", "2.0.0", "BSD-3-Clause", "function vegaEmbed() {}")]
    page = build_page(scripts)
    assert inlined_scripts(page) == {"vega@1.0.0": "var vega = {};",
                                     "vega-embed@2.0.0": "function vegaEmbed() {}"}
    order = [page.index(s) for s in ("{refresh_tag}", "var vega", "vegaEmbed", "{plot_divs}")]
    assert order == sorted(order)
    assert "<script src" not in page and "http" not in page


def test_a_script_that_would_end_its_element_is_refused():
    with pytest.raises(RarelmError, match="x@1: its code holds </script"):
        build_page([Script("x", "1", "MIT", "s = '</SCRIPT>';")])


def test_licenses_name_each_package_its_build_and_sha256():
    scripts = [Script("vega", "5.33.1", "BSD-3-Clause", "a"),
               Script("vega-lite", "5.23.0", "BSD-3-Clause", "b")]
    text = licenses_text(scripts, {"vega": "Copyright V\n", "vega-lite": "Copyright L\n"})
    sha = hashlib.sha256(b"a").hexdigest()
    assert f"vega@5.33.1 (BSD-3-Clause), vega/build/vega.min.js sha256 {sha}" in text
    assert text.index("Copyright V") < text.index("vega-lite@5.23.0") < text.index("Copyright L")


def test_committed_page_holds_the_pinned_builds_listed_in_the_licenses_file():
    page = (REPO / PAGE).read_text(encoding="utf-8")
    licenses = (REPO / LICENSES).read_text(encoding="utf-8")
    scripts = inlined_scripts(page)
    assert list(scripts) == [f"{package}@{version}" for package, version, _ in PACKAGES]
    recorded = dict(re.findall(r"^(\S+@\S+) \(BSD-3-Clause\), \S+ sha256 ([0-9a-f]{64})$", licenses, re.M))
    assert recorded == {name: hashlib.sha256(code.encode()).hexdigest() for name, code in scripts.items()}
    assert licenses.count("Redistribution and use in source and binary forms") == 3
    assert "<script src" not in page and len(page.encode()) < 1_500_000
    assert {"vega", "vegaLite", "vegaEmbed"} <= set(re.findall(r"\.(vega\w*)=", page))  # globals DVC calls


def test_dvc_config_makes_it_the_default_page_and_dvc_plots_uses_it(tmp_path):
    config = configparser.ConfigParser()
    config.read(REPO / ".dvc/config")
    assert (REPO / ".dvc" / config["plots"]["html_template"]) == REPO / PAGE  # relative to .dvc/
    out = tmp_path / "plots"
    done = subprocess.run([sys.executable, "-m", "dvc", "plots", "show", "-o", str(out)], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    html = (out / "index.html").read_text(encoding="utf-8")
    assert "cdn.jsdelivr.net" not in html and "<script src" not in html
    assert "/* vega-embed@6.29.0, BSD-3-Clause" in html and html.count("vegaEmbed('#") == 5  # every chart
