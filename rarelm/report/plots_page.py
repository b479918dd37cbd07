"""The page `dvc plots show/diff` writes, with Vega, Vega-Lite and Vega-Embed inside it: it draws offline.

DVC's default page loads the three libraries from a CDN, so without a network it is blank. This
page template (.dvc/plots/offline.html, named by `plots.html_template` in .dvc/config) carries
their minified builds inline instead, 828 KB from the npm packages pinned in PACKAGES (BSD-3-Clause;
texts and sha256 sums in .dvc/plots/offline-licenses.txt). Inline rather than beside the page:
`dvc plots diff -o DIR` writes the page anywhere, where a relative <script src> would not resolve,
and the page stays one file that can be mailed or attached. The majors are the ones DVC 3.67's
own page loads (vega 5, vega-lite 5, vega-embed 6), so its templates' Vega-Lite v5 specs draw the
same.

`python -m rarelm.report.plots_page` (or `make plots-page`) rebuilds both files with `npm pack`;
the committed copies are what it wrote. A page is a template: DVC replaces `{plot_divs}` and
`{refresh_tag}` in it.

    >>> page = build_page([Script("vega", "5.33.1", "BSD-3-Clause", "var vega = 1;")])
    >>> print(page.splitlines()[6])
    <script>/* vega@5.33.1, BSD-3-Clause: .dvc/plots/offline-licenses.txt */
    >>> "{plot_divs}" in page and "{refresh_tag}" in page and "http" not in page
    True
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rarelm.errors import RarelmError

PAGE = Path(".dvc/plots/offline.html")
LICENSES = Path(".dvc/plots/offline-licenses.txt")
# (package, version, file in the package): the builds DVC's page would load, at the newest release
# of the same major. The vega package ships no LICENSE file; its repository's (vega/vega) comes
# with vega-util 1.17.3, a package of the same repository (1.17.4, vega 5.33.1's, ships none either).
PACKAGES = (("vega", "5.33.1", "build/vega.min.js"), ("vega-lite", "5.23.0", "build/vega-lite.min.js"),
            ("vega-embed", "6.29.0", "build/vega-embed.min.js"))
LICENSE_FROM = {"vega": ("vega-util", "1.17.3")}


@dataclass(frozen=True)
class Script:
    package: str
    version: str
    license: str
    code: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.code.encode("utf-8")).hexdigest()


def build_page(scripts: list[Script]) -> str:
    """The HTML template: the scripts inline in <head>, DVC's two placeholders in place.

    A script that contains `</script` would end its element early; none of the pinned builds does,
    and a new one that did is refused rather than escaped (escaping inside minified code is unsafe).
    """
    for script in scripts:
        if "</script" in script.code.lower():
            raise RarelmError(f"{script.package}@{script.version}: its code holds </script; cannot inline it")
    inline = "\n".join(f"<script>/* {s.package}@{s.version}, {s.license}: {LICENSES.as_posix()} */\n"
                       f"{s.code}\n</script>" for s in scripts)
    head = '<!DOCTYPE html>\n<html>\n<head>\n{refresh_tag}\n<meta charset="utf-8">\n<title>DVC plots</title>'
    style = "<style>table { border-spacing: 15px; }</style>"
    return f"{head}\n{inline}\n{style}\n</head>\n<body>\n{{plot_divs}}\n</body>\n</html>\n"


def inlined_scripts(page: str) -> dict[str, str]:
    """"package@version" -> the code of each script that build_page inlined (to check sha256 sums)."""
    out = {}
    for chunk in page.split("<script>/* ")[1:]:
        header, _, rest = chunk.partition("\n")
        out[header.split(",")[0]] = rest.split("\n</script>")[0]
    return out


def licenses_text(scripts: list[Script], texts: dict[str, str]) -> str:
    """One section per package: name, version, licence, sha256 of the inlined build, licence text."""
    builds = {package: build for package, _, build in PACKAGES}
    sections = [f"{s.package}@{s.version} ({s.license}), {s.package}/{builds.get(s.package, '?')} sha256 "
                f"{s.sha256}\n\n{texts[s.package].strip()}\n" for s in scripts]
    head = f"The scripts inlined in {PAGE.as_posix()} (rarelm/report/plots_page.py builds it from npm).\n"
    return head + "".join(f"\n{'=' * 72}\n{section}" for section in sections)


def npm_pack(package: str, version: str, into: Path) -> Path:
    """`npm pack package@version` unpacked under `into`: the package folder."""
    done = subprocess.run(["npm", "pack", "--silent", f"{package}@{version}"], cwd=into,
                          capture_output=True, text=True)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise RarelmError(f"npm pack {package}@{version}: {reason}")
    target = into / f"{package}-{version}"
    with tarfile.open(into / done.stdout.strip().splitlines()[-1]) as archive:
        archive.extractall(target, filter="data")
    return target / "package"


def main(root: Path = Path(".")) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        scripts, texts = [], {}
        for package, version, build in PACKAGES:
            folder = npm_pack(package, version, Path(tmp))
            license_id = json.loads((folder / "package.json").read_text(encoding="utf-8"))["license"]
            scripts.append(Script(package, version, license_id, (folder / build).read_text(encoding="utf-8")))
            source = npm_pack(*LICENSE_FROM[package], Path(tmp)) if package in LICENSE_FROM else folder
            texts[package] = (source / "LICENSE").read_text(encoding="utf-8")
    (root / PAGE).write_text(build_page(scripts), encoding="utf-8")
    (root / LICENSES).write_text(licenses_text(scripts, texts), encoding="utf-8")
    print(f"{PAGE}: {(root / PAGE).stat().st_size // 1000} KB; {LICENSES}")


if __name__ == "__main__":
    try:
        main()
    except RarelmError as exc:
        print(f"plots_page: error: {exc}", file=sys.stderr)
        sys.exit(2)
