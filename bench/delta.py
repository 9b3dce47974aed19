"""``python -m bench.delta``: eosink's delta sink against Delta's own Spark sink, a naive
``foreachBatch`` + ``write_deltalake`` and ``foreachBatch`` + delta-spark ``MERGE``, side by
side in one run, in the pyspark 4.0 environment with delta-spark (``bench/_py40.py``); and
the sink's commit time over 1,000 epochs. Prints the throughput ratios (medians of the
interleaved repetitions) and the checks of every side's table by Delta's Spark reader. See
``bench/delta_run.py`` for what runs.

    python -m bench.delta [--reps 3] [--files 8] [--rows 250000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from . import _py40
from ._common import Size, make_data

ROOT = Path(__file__).resolve().parents[1]

TARGETS = {("append", "delta-spark"): 1.0, ("append", "naive"): 1.0, ("upsert", "merge"): 1.5}
"""The issue's targets: throughput eosink / peer."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--rows", type=int, default=250_000, help="rows per input file")
    ap.add_argument("--epochs", type=int, default=1000, help="epochs of the commit-cost run")
    ap.add_argument("--quick", action="store_true", help="small sizes, 1 repetition")
    a = ap.parse_args()
    if a.quick:
        a.reps, a.files, a.rows, a.epochs = 1, 4, 20_000, 200
    py = _py40.venv(print)
    jars = ",".join(str(j) for j in _py40.delta_jars(print))
    tmp = Path(tempfile.mkdtemp(prefix="eosink-bench-delta-"))
    data = make_data(tmp / "data", Size(files=a.files, rows_per_file=a.rows, reps=a.reps))
    out = tmp / "result.json"
    cmd = [str(py), "-m", "bench.delta_run", "--data", str(data.path), "--jars", jars]
    cmd += ["--reps", str(a.reps), "--epochs", str(a.epochs), "--tmp", str(tmp / "run")]
    cmd += ["--out", str(out)]
    if a.quick:
        cmd += ["--base", "20000", "--changes", "5000", "--change-files", "3"]
    with open(tmp / "run.log", "w") as lf:
        rc = subprocess.run(cmd, cwd=ROOT, env=_py40.child_env(py), stderr=lf).returncode
    if not out.exists():
        print(f"the run failed (exit {rc}); its log: {tmp / 'run.log'}")
        return 1
    res = json.loads(out.read_text())
    print(f"\n{res['versions']}; input: {res['input']}, {data.rows:,} rows in {data.files} files")
    print(
        "| row | eosink median s | peer median s | throughput eosink / peer | per-rep range "
        "| target |"
    )
    print("|---|---|---|---|---|---|")
    for group, times in res["times"].items():
        eos = times.get("eosink")
        for peer, t in times.items():
            if peer == "eosink" or not eos or not t:
                continue
            pairs = sorted(p / e for p, e in zip(t, eos, strict=False))
            ratio = statistics.median(t) / statistics.median(eos)
            target = TARGETS.get((group, peer))
            print(
                f"| {group} / {peer} | {statistics.median(eos):.2f} | {statistics.median(t):.2f} "
                f"| **{ratio:.2f}** | {pairs[0]:.2f}-{pairs[-1]:.2f} | >= {target} |"
            )
    c = res["commits"]
    print(
        f"\ncommit (phase 1 + commit) per epoch over {c['epochs']} epochs: p50 of the first 100 "
        f"{c['p50_first_100_ms']:.1f} ms, of the last 100 {c['p50_last_100_ms']:.1f} ms, "
        f"p99 {c['p99_ms']:.1f} ms"
    )
    print("checks (Delta's Spark reader):", json.dumps(res["checks"]))
    print("eosink's writers:", sorted(set(res["writers"])))
    if res["errors"]:
        print("errors:", json.dumps(res["errors"]))
    print(f"raw: {out}")
    return 0 if all(res["checks"].values()) and not res["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
