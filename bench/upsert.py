"""``python -m bench.upsert``: eosink's iceberg upsert stream against Spark's Iceberg runtime
``foreachBatch`` + ``MERGE INTO`` (copy-on-write and merge-on-read), side by side in one run,
in the pyspark 4.0 environment (``bench/_py40.py``: Iceberg ships no runtime for the
project's pyspark). Prints the throughput ratios (medians), the checks of both tables (by
pyiceberg and by Spark's Iceberg runtime) and the full-scan cost of the tables each side
leaves. See ``bench/iceberg_upsert.py`` for what runs.

    python -m bench.upsert [--reps 3] [--base 200000] [--changes 20000] [--files 8]
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

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--base", type=int, default=200_000, help="rows of the first file")
    ap.add_argument("--changes", type=int, default=20_000, help="changes per later file")
    ap.add_argument("--files", type=int, default=8, help="files of changes (micro-batches)")
    a = ap.parse_args()
    py = _py40.venv(print)
    jar = _py40.jar(print)
    tmp = Path(tempfile.mkdtemp(prefix="eosink-bench-upsert-"))
    out = tmp / "result.json"
    env = _py40.child_env(py)
    cmd = [str(py), "-m", "bench.iceberg_upsert", "--jar", str(jar), "--tmp", str(tmp / "run")]
    cmd += ["--out", str(out), "--reps", str(a.reps), "--base", str(a.base)]
    cmd += ["--changes", str(a.changes), "--files", str(a.files)]
    with open(tmp / "run.log", "w") as lf:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stderr=lf).returncode
    if not out.exists():
        print(f"the run failed (exit {rc}); its log: {tmp / 'run.log'}")
        return 1
    res = json.loads(out.read_text())
    times = res["times"]
    med = {k: statistics.median(v) for k, v in times.items() if v}
    inp = res["input"]
    changes = inp["base_rows"] + inp["changes_per_file"] * inp["files"]
    print(f"\n{res['versions']}; input: {inp}")
    print(
        "| side | median s | changes/s | data files | delete files | full scan s (Spark) |"
        " after compaction s |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, m in med.items():
        r = res["reads"].get(name, {})
        print(
            f"| {name} | {m:.2f} | {changes / m:,.0f} | {r.get('data_files', '?')} | "
            f"{r.get('delete_files', '?')} | {r.get('spark_scan_s', 0):.2f} | "
            f"{r.get('spark_scan_after_compaction_s', float('nan')):.2f} |"
        )
    if "eosink" in med:
        for peer in ("merge-cow", "merge-mor"):
            if peer in med:
                print(f"ratio eosink / {peer} (throughput): {med[peer] / med['eosink']:.2f}")
        scan = res["reads"].get("eosink", {}).get("pyiceberg_scan_s")
        if scan is not None:
            print(f"eosink's table, full pyiceberg scan: {scan:.2f} s")
    print("checks:", json.dumps(res["checks"]))
    if res["errors"]:
        print("errors:", json.dumps(res["errors"]))
    print(f"raw: {out}")
    return 0 if all(res["checks"].values()) and not res["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
