"""The benchmark's charts: matplotlib SVG drawn from a run's raw figures.

``python -m bench`` writes them with its report (``--charts DIR``; by default ``img/`` beside
the report) together with the figures they are drawn from (``bench-results.json``);
``python -m bench.charts RESULTS.json DIR`` draws them again from such a file.

* ``bench-throughput.svg``: every throughput ratio eosink / peer, the median with the range
  of the per-repetition ratios, and its target;
* ``bench-lag.svg``: the distribution of the visibility lag of a stream at a 1 s trigger
  (per epoch), with its commit durations;
* ``bench-protocol.svg``: the protocol cost per epoch over the whole run (p50 and p99 of each
  run of epochs), per meta store, against its target.
"""

from __future__ import annotations

import io
import json
import statistics
import sys
import textwrap
from pathlib import Path
from typing import Any

THROUGHPUT = "bench-throughput.svg"
LAG = "bench-lag.svg"
PROTOCOL = "bench-protocol.svg"


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"
    matplotlib.rcParams["svg.hashsalt"] = "eosink-bench"  # stable ids: diffs show real changes
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    path.write_text(buf.getvalue())
    return path


def throughput(plt: Any, rows: list[dict[str, Any]], path: Path) -> Path:
    """One horizontal bar per ratio: the median ratio, whiskers from the lowest to the highest
    per-repetition ratio, the target as a tick."""
    fig, ax = plt.subplots(figsize=(10, 0.62 * len(rows) + 1.6))
    labels, medians, lows, highs = [], [], [], []
    for r in rows:
        pairs = [p / e for p, e in zip(r["peer_s"], r["eosink_s"], strict=False)]
        ratio = statistics.median(r["peer_s"]) / statistics.median(r["eosink_s"])
        lines = textwrap.wrap(r["measure"], 62)
        labels.append("\n".join(lines[:3]) + (" ..." if len(lines) > 3 else ""))
        medians.append(ratio)
        lows.append(ratio - min(pairs))
        highs.append(max(pairs) - ratio)
    y = list(range(len(rows)))[::-1]
    colors = [
        "#8c959f" if r["target"] is None else "#1a7f37" if m >= r["target"] else "#cf222e"
        for r, m in zip(rows, medians, strict=False)
    ]
    ax.barh(y, medians, xerr=[lows, highs], color=colors, alpha=0.8, capsize=3)
    for yi, r in zip(y, rows, strict=False):
        if r["target"] is not None:
            ax.plot([r["target"]] * 2, [yi - 0.4, yi + 0.4], color="black", lw=2)
    ax.axvline(1.0, color="#57606a", ls=":", lw=1)
    ax.set_yticks(y, labels, fontsize=6.5)
    ax.set_xlabel("throughput eosink / peer (median; whiskers: range of the repetitions)")
    ax.set_title(
        "eosink against its peers\n(black tick: target; green: met, red: not met, grey: "
        "information only)",
        fontsize=10,
    )
    return _save(plt, fig, path)


def lag(plt: Any, figs: dict[str, Any], path: Path) -> Path:
    """The visibility lag of each epoch, as a histogram, with the trigger interval."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.2))
    lags, commits = figs["lag_ms"], figs["commit_ms"]
    a1.hist(lags, bins=min(30, max(5, len(lags) // 2)), color="#8250df")
    a1.axvline(statistics.median(lags), color="black", ls="--", lw=1, label="p50")
    a1.set_xlabel(f"visibility lag per epoch (ms; trigger every {figs['trigger_ms']:.0f} ms)")
    a1.set_ylabel("epochs")
    a1.legend(fontsize=8)
    a2.hist(commits, bins=min(30, max(5, len(commits) // 2)), color="#0969da")
    a2.set_xlabel("commit (phase 2) per epoch (ms)")
    fig.suptitle(
        f"A stream at a 1 s processing-time trigger: {len(lags)} epochs, commit after Spark's "
        "checkpoint",
        fontsize=10,
    )
    return _save(plt, fig, path)


def protocol(
    plt: Any, series: dict[str, dict[str, list[float]]], targets: dict[str, float], path: Path
) -> Path:
    """p50 and p99 of each run of epochs over the whole run, per meta store."""
    fig, axes = plt.subplots(1, len(series), figsize=(4.6 * len(series), 3.2), squeeze=False)
    for ax, (name, s) in zip(axes[0], series.items(), strict=False):
        ax.plot(s["epoch"], s["p50"], lw=1.2, label="p50")
        ax.plot(s["epoch"], s["p99"], lw=0.8, alpha=0.8, label="p99")
        if name in targets:
            ax.axhline(targets[name], color="#cf222e", ls=":", lw=1, label="target (p50)")
        # A few GC pauses or fsync stalls would flatten the rest: the axis stops at twice
        # the 95th percentile of the p99s (the spikes are cut, the p50 line is whole).
        top = max(sorted(s["p99"])[int(0.95 * (len(s["p99"]) - 1))] * 2, max(s["p50"]) * 1.2)
        ax.set_ylim(0, max(top, targets.get(name, 0) * 1.2))
        ax.set_title(f"{name} meta store", fontsize=10)
        ax.set_xlabel("epoch")
        ax.set_ylabel("ms per epoch")
        ax.legend(fontsize=8)
    fig.suptitle("Protocol cost per epoch (an empty epoch, stream with its journal)", fontsize=10)
    return _save(plt, fig, path)


def draw(results: dict[str, Any], out: Path) -> list[Path]:
    """Every chart the figures of ``results`` allow, into ``out``; returns what it wrote."""
    plt = _plt()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if results.get("throughput"):
        written.append(throughput(plt, results["throughput"], out / THROUGHPUT))
    if results.get("lag", {}).get("lag_ms"):
        written.append(lag(plt, results["lag"], out / LAG))
    if results.get("protocol"):
        targets = results.get("protocol_targets_ms", {})
        written.append(protocol(plt, results["protocol"], targets, out / PROTOCOL))
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m bench.charts RESULTS.json DIR", file=sys.stderr)
        return 2
    for p in draw(json.loads(Path(args[0]).read_text()), Path(args[1])):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
