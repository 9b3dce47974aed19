"""Render the docs' diagrams: ``docs/diagrams/<name>.mmd`` (Mermaid) -> ``docs/img/<name>.svg``.

    uv run --frozen --all-extras python docs/_ext/diagrams.py

Mermaid runs in Debian's Chromium (``/usr/bin/chromium``, driven by Playwright) from the
``mermaid`` package of the npm registry (``npm pack``, version :data:`MERMAID`); the SVGs are
committed, so neither the docs build nor a reader needs JavaScript. Each SVG starts with a
comment holding its source's SHA-256: tests/test_docs.py fails when a source changed and its
SVG was not rendered again. Labels are SVG text (no ``foreignObject``), so the files show
the same in an ``<img>``, on GitHub and in the mkdocs site.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

MERMAID = "11.17.2"
DOCS = Path(__file__).resolve().parents[1]
SOURCES = DOCS / "diagrams"
OUT = DOCS / "img"


def source_hash(source: Path) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()


def header(source: Path) -> str:
    """The first line of a rendered SVG: what it was rendered from."""
    rel = source.relative_to(DOCS.parent).as_posix()
    return f"<!-- rendered by docs/_ext/diagrams.py from {rel} sha256 {source_hash(source)} -->"


def _mermaid_js(tmp: Path) -> str:
    subprocess.run(
        ["npm", "pack", f"mermaid@{MERMAID}", "--silent"], cwd=tmp, check=True, capture_output=True
    )
    [tgz] = tmp.glob("mermaid-*.tgz")
    subprocess.run(["tar", "xzf", tgz.name], cwd=tmp, check=True)
    return (tmp / "package" / "dist" / "mermaid.min.js").read_text()


def main() -> int:
    from playwright.sync_api import sync_playwright

    sources = sorted(SOURCES.glob("*.mmd"))
    with tempfile.TemporaryDirectory() as d, sync_playwright() as p:
        js = _mermaid_js(Path(d))
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page()
        page.set_content("<html><body></body></html>")
        page.add_script_tag(content=js)
        page.evaluate(
            """() => mermaid.initialize({startOnLoad: false, theme: 'neutral',
                htmlLabels: false, flowchart: {htmlLabels: false},
                sequence: {useMaxWidth: false}, state: {useMaxWidth: false}})"""
        )
        for i, src in enumerate(sources):
            svg = page.evaluate(
                "async ([id, text]) => (await mermaid.render(id, text)).svg",
                [f"d{i}", src.read_text()],
            )
            out = OUT / f"{src.stem}.svg"
            out.write_text(header(src) + "\n" + svg + "\n")
            print(f"wrote {out.relative_to(DOCS.parent)} ({len(svg):,} bytes)")
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
