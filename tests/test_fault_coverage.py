"""Every fault point of the code is fired by at least one crash test (a real SIGKILL or
SIGSTOP of a driver or an executor), so that a point added without its crash case, or a
case dropped, fails here rather than going unnoticed (issue 24)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from eosink.faults import DRIVER_FAULT_POINTS, EXECUTOR_FAULT_POINTS

ROOT = Path(__file__).resolve().parents[1]


def _points_in_code() -> set[str]:
    """The names of every ``fault_point("...")`` call of eosink and the built-in plugins."""
    names: set[str] = set()
    for path in [*ROOT.joinpath("eosink").rglob("*.py"), *ROOT.joinpath("plugins").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "fault_point"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names.add(str(node.args[0].value))
    return names


def _crash_test_strings() -> str:
    """The string literals (docstrings left out) of the test modules that kill real
    processes (``crash`` mark)."""
    out: list[str] = []
    for path in ROOT.joinpath("tests").glob("test_*.py"):
        text = path.read_text()
        if "pytest.mark.crash" not in text:
            continue
        tree = ast.parse(text)
        docstrings = {
            id(body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and (body := node.body)
            and isinstance(body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
            ):
                out.append(node.value)
    return "\n".join(out)


def test_every_fault_point_is_declared() -> None:
    declared = set(DRIVER_FAULT_POINTS) | set(EXECUTOR_FAULT_POINTS)
    in_code = _points_in_code()
    assert in_code, "no fault_point call found"
    assert in_code <= declared, f"undeclared fault points: {sorted(in_code - declared)}"


def test_every_fault_point_fires_in_a_crash_test() -> None:
    literals = _crash_test_strings()
    points = _points_in_code() | set(DRIVER_FAULT_POINTS) | set(EXECUTOR_FAULT_POINTS)
    missing = sorted(
        p
        for p in points
        if not re.search(rf"(^|[^a-z_]){re.escape(p)}(@\d+)?($|[^a-z_])", literals, re.M)
    )
    assert missing == [], f"fault points no crash test fires: {missing}"
