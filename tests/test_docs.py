"""The docs build without warnings, and the README starts with the two promised commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "site" / "plugins" / "index.html").exists()


def test_readme_opens_with_demo_and_test_commands() -> None:
    lines = [ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith("python3")]
    assert "eosink demo" in lines[0]
    assert "pytest" in lines[1]
    assert lines[1].split("&& ", 1)[1] in (ROOT / ".ci" / "run").read_text()


def test_plugin_docs_ship_the_example_plugin_verbatim() -> None:
    """Plugin authors copy the example from the docs: it must be the tested source."""
    src = (ROOT / "tests" / "example_plugin" / "eosink_example" / "__init__.py").read_text()
    assert f"```python\n{src}```" in (ROOT / "docs" / "plugins.md").read_text()
