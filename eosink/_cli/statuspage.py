"""``eosink status --html FILE``: one self-contained page per sink, with charts.

The page answers an operator's "is this sink keeping up, and since when is it slow?" from the
meta store alone (a dead driver's sink too): epochs over time (PENDING -> COMMITTED latency,
PENDING epochs and recorded losses marked), visibility lag, rows per epoch, the durations of
the two phases, what is PENDING, lost or open at the target. The charts are matplotlib SVG
inlined in the page (no script, no font or file fetched: it opens from a mail attachment or
a CI artifact as it is). The data is what ``eosink status --json`` prints with every
COMMITTED epoch the store keeps (it garbage-collects older ones: ``gc_keep``).
"""

from __future__ import annotations

import hashlib
import html
import io
import re
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import MissingExtraError
from .text import run_label

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1b1f24;
max-width:1180px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.sub{color:#57606a;margin-bottom:16px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{border:1px solid #d0d7de;border-radius:6px;padding:8px 12px;min-width:150px}
.card b{display:block;font-size:18px}.card span{color:#57606a;font-size:12px}
.bad b{color:#cf222e}.ok b{color:#1a7f37}
.charts{display:grid;grid-template-columns:1fr 1fr;gap:12px}
figure{margin:0;border:1px solid #d0d7de;border-radius:6px;padding:6px}
figure svg{width:100%;height:auto}
figcaption{font-size:12px;color:#57606a;padding:2px 6px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:left}th{background:#f6f8fa}
.none{color:#57606a;font-style:italic}
"""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingExtraError("matplotlib", "charts", "eosink status --html") from exc
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: small, searchable
    import matplotlib.pyplot as plt

    return plt


def _t(iso: str | None) -> datetime | None:
    return datetime.fromisoformat(iso) if iso else None


def _svg(plt: Any, draw: Callable[[Any], None], empty: str | None) -> str:
    """One chart as an inline ``<svg>`` element (``empty``: the text shown instead of data)."""
    fig, ax = plt.subplots(figsize=(5.6, 2.9), dpi=100)
    try:
        if empty:
            ax.text(0.5, 0.5, empty, ha="center", va="center", color="#57606a")
            ax.set_axis_off()
        else:
            draw(ax)
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
    finally:
        plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]


def _dates(ax: Any, xs: Sequence[datetime | None]) -> None:
    """Time ticks for points at ``xs`` (under a minute: ticks in seconds)."""
    import matplotlib.dates

    mdates: Any = matplotlib.dates  # untyped
    ts = [x for x in xs if x is not None]
    span = (max(ts) - min(ts)).total_seconds() if ts else 0.0
    if ts and span < 60:  # AutoDateLocator has no ticks this fine
        pad = max(span * 0.08, 1.0) / 86400
        ax.set_xlim(mdates.date2num(min(ts)) - pad, mdates.date2num(max(ts)) + pad)
        step = 1 if span < 8 else 5 if span < 30 else 10
        ax.xaxis.set_major_locator(mdates.SecondLocator(bysecond=range(0, 60, step)))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        return
    if ts:  # every point, and the losses' lines (axvline does not widen the axis)
        lo, hi = mdates.date2num(min(ts)), mdates.date2num(max(ts))
        ax.set_xlim(lo - (hi - lo) * 0.04, hi + (hi - lo) * 0.04)
    loc = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(loc)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(loc))


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str], none: str) -> str:
    if not rows:
        return f'<p class="none">{html.escape(none)}</p>'
    if not header:
        head = ""
    else:
        head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table>{head}{body}</table>"


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def sink_page(s: dict[str, Any], store: str, now: float | None = None) -> str:
    """The page of one sink, from its ``eosink status --json`` dict."""
    plt = _pyplot()
    now = time.time() if now is None else now
    now_dt = datetime.fromtimestamp(now).astimezone()
    commits = sorted(s["recent_commits"], key=lambda r: r["epoch"])
    pending = s["pending"]
    losses = s["losses"]
    timed = [r for r in commits if r["pending_since"] and r["committed_at"]]
    lags = [r["visibility_lag_s"] for r in commits if r["visibility_lag_s"] >= 0]

    def latency(ax: Any) -> None:
        xs = [_t(r["pending_since"]) for r in timed]
        ys = [r["pending_to_committed_s"] for r in timed]
        ax.plot(xs, ys, "o-", ms=3, lw=1, color="#0969da", label="committed")
        if pending:
            px = [_t(p["pending_since"]) for p in pending]
            py = [(now_dt - x).total_seconds() if x else 0.0 for x in px]
            ax.plot(px, py, "x", ms=8, mew=2, color="#cf222e", label="PENDING (age so far)")
        for i, x in enumerate(losses):
            ax.axvline(
                _t(x["recorded_at"]),
                color="#cf222e",
                ls="--",
                lw=1,
                label="loss recorded" if i == 0 else None,
            )
        ax.set_ylabel("PENDING -> COMMITTED (s)")
        _dates(
            ax,
            xs + [_t(p["pending_since"]) for p in pending] + [_t(x["recorded_at"]) for x in losses],
        )

    def lag(ax: Any) -> None:
        xs = [_t(r["committed_at"]) for r in commits if r["visibility_lag_s"] >= 0]
        ax.plot(xs, lags, "o-", ms=3, lw=1, color="#8250df")
        med = statistics.median(lags)
        ax.axhline(med, color="#57606a", ls=":", lw=1, label=f"median {med:.2f} s")
        ax.set_ylabel("visibility lag (s)")
        _dates(ax, xs)

    def rows(ax: Any) -> None:
        for group, color, label in (
            (commits, "#0969da", None),
            (pending, "#bf8700", "PENDING"),
            (losses, "#cf222e", "lost (abandoned)"),
        ):
            if group:
                ax.bar([g["epoch"] for g in group], [g["rows"] for g in group], color=color,
                       label=label)  # fmt: skip
        ax.set_xlabel("epoch")
        ax.set_ylabel("rows")

    def phases(ax: Any) -> None:
        es = [r["epoch"] for r in commits]
        ax.plot(es, [r["pre_commit_ms"] for r in commits], ".-", lw=1, label="phase 1 (ms)")
        ax.plot(es, [r["commit_ms"] for r in commits], ".-", lw=1, label="phase 2 (ms)")
        ax.set_xlabel("epoch")
        ax.set_ylabel("ms")

    nothing = "no COMMITTED epoch recorded"
    charts = [
        (
            "Epochs over time: seconds from PENDING to COMMITTED, by PENDING time",
            _svg(plt, latency, None if timed or pending else nothing),
        ),
        (
            "Visibility lag: end of the micro-batch to COMMITTED",
            _svg(plt, lag, None if lags else nothing),
        ),
        (
            "Rows per epoch",
            _svg(plt, rows, None if commits or pending or losses else nothing),
        ),
        ("Phase durations per epoch", _svg(plt, phases, None if commits else nothing)),
    ]

    # The cards: what an operator looks at first.
    cards: list[tuple[str, str, str]] = []
    last_at = _t(commits[-1]["committed_at"]) if commits else None
    if last_at is not None:
        cards.append(("", _age((now_dt - last_at).total_seconds()), "since the last commit"))
    cards.append(("", str(s["last_committed_epoch"]), "last committed epoch"))
    oldest = min((datetime.fromisoformat(p["pending_since"]) for p in pending), default=None)
    cards.append(
        (
            "bad" if pending else "ok",
            str(len(pending)),
            "PENDING" + (f", oldest {_age((now_dt - oldest).total_seconds())}" if oldest else ""),
        )
    )
    if lags:
        recent = lags[-10:]
        cards.append(("", f"{statistics.median(recent):.2f} s", "visibility lag, last 10"))
    cards.append(("bad" if losses else "ok", str(len(losses)), "recorded losses"))
    alive = {True: ("ok", "running"), False: ("", "not running"), None: ("", "unknown")}
    cls, word = alive[s["owner_alive"]]
    cards.append((cls, word, f"owner {s['owner']}"))

    card_html = "".join(
        f'<div class="card {c}"><b>{html.escape(v)}</b><span>{html.escape(t)}</span></div>'
        for c, v, t in cards
    )
    fig_html = "".join(
        f"<figure>{svg}<figcaption>{html.escape(cap)}</figcaption></figure>" for cap, svg in charts
    )
    facts = [
        ("plugin", s["plugin"]),
        ("target", s["target"] or "not recorded"),
        ("generation", s["generation"]),
        ("created", s["created_at"]),
        ("last change", s["updated_at"]),
        ("last heartbeat", s["heartbeat_at"] or "-"),
        ("current stream", s["stream_lineage"] or "-"),
        ("committed epochs", s["committed_epochs"]),
        ("aborted epochs", ", ".join(map(str, s["aborted_epochs"])) or "none"),
    ]
    if s["last_error"]:
        facts.append(("last error", f"{s['last_error_at']}: {s['last_error'][:500]}"))
    if s.get("retired"):
        r = s["retired"]
        facts.append(
            (
                "retired",
                f"by `eosink retire` at {r['at'] or '(unknown)'} by {r['by'] or '(unknown)'}, "
                f"with epochs up to {r['high']} (later runs write above them)",
            )
        )
    open_rows = [[i.get("kind", "open"), i.get("what", "")] for i in s["open_at_target"] or []]
    open_note = s["open_at_target_note"] or ""
    parts = [
        f"<h1>{html.escape(s['sink_id'])}</h1>",
        f'<div class="sub">meta store {html.escape(store)} &middot; page written '
        f"{html.escape(now_dt.isoformat(timespec='seconds'))} &middot; {len(commits)} "
        "COMMITTED epochs kept by the store</div>",
        f'<div class="cards">{card_html}</div>',
        f'<div class="charts">{fig_html}</div>',
        "<h2>PENDING epochs</h2>",
        _table(
            [
                [p["epoch"], run_label(p["run"]), p["rows"], p["files"], p["pending_since"]]
                for p in pending
            ],
            ["epoch", "run", "rows", "files", "PENDING since"],
            "none",
        ),
        "<h2>Recorded losses</h2>",
        _table(
            [
                [
                    x["epoch"],
                    run_label(x["run"]),
                    x["rows"],
                    x["files"],
                    x["recorded_at"],
                    x["recorded_by"],
                    x["reason"],
                    "yes" if x["written_again"] else "no",
                ]
                for x in losses
            ],
            ["epoch", "run", "rows", "files", "recorded", "by", "reason", "written again"],
            "none",
        ),
        "<h2>Open at the target</h2>",
        _table(open_rows, ["kind", "what"], open_note or "not described by this sink"),
        f'<p class="none">{html.escape(open_note)}</p>' if open_rows and open_note else "",
        "<h2>The sink</h2>",
        _table([[k, v] for k, v in facts], [], ""),
        "<h2>Recent commits</h2>",
        _table(
            [
                [
                    r["epoch"],
                    run_label(r["run"]),
                    r["rows"],
                    r["files"],
                    r["committed_at"],
                    r["pre_commit_ms"],
                    r["commit_ms"],
                    r["visibility_lag_s"],
                ]
                for r in reversed(commits[-20:])
            ],
            ["epoch", "run", "rows", "files", "committed", "phase 1 ms", "phase 2 ms", "lag s"],
            "none",
        ),
    ]
    return _page(f"eosink: {s['sink_id']}", "".join(parts))


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def page_name(path: Path, sink_id: str) -> Path:
    """The page of one of several sinks: ``path``'s name + a file-name-safe form of the id
    (and a short hash of it, so that two ids that read alike never share a page)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", sink_id).strip("_")[:60]
    digest = hashlib.sha1(sink_id.encode()).hexdigest()[:8]
    return path.with_name(f"{path.stem}.{safe}-{digest}{path.suffix or '.html'}")


def write_pages(sinks: list[dict[str, Any]], file: str, store: str) -> list[Path]:
    """Write the page(s): ``file`` itself for one sink (or none); for several, ``file`` is an
    index linking to one page per sink beside it. Returns the paths written."""
    path = Path(file)
    path.parent.mkdir(parents=True, exist_ok=True)
    now = time.time()
    if len(sinks) == 1:
        path.write_text(sink_page(sinks[0], store, now), encoding="utf-8")
        return [path]
    written = []
    links = []
    for s in sinks:
        p = page_name(path, s["sink_id"])
        p.write_text(sink_page(s, store, now), encoding="utf-8")
        written.append(p)
        state = f"{len(s['pending'])} PENDING, {len(s['losses'])} losses"
        links.append(
            f'<li><a href="{html.escape(p.name)}">{html.escape(s["sink_id"])}</a> '
            f"({html.escape(s['plugin'])}, last committed epoch "
            f"{s['last_committed_epoch']}, {state})</li>"
        )
    body = f'<h1>eosink sinks</h1><div class="sub">meta store {html.escape(store)}</div>' + (
        f"<ul>{''.join(links)}</ul>" if links else '<p class="none">no sinks recorded yet</p>'
    )
    path.write_text(_page("eosink sinks", body), encoding="utf-8")
    return [path, *written]
