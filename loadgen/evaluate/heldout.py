#!/usr/bin/env python3
"""The held-out evaluation of a routing policy, in one command: the workloads issue 28's
"done when" names (unequal replicas at the seed's rate and at 1.0 rps per pair, 12k-token
prompts, 12 families on 3 replicas, overload, 8 replicas), the seed, and Mooncake's trace at
4, 8 and 16 replicas, each simulated on the virtual clock with the baselines beside the
policy, then one table: every route's total
of good requests, the policy's margin over the best baseline, and each (round, scenario)
cell where the policy is more than MARGIN good requests below the best baseline there.

    cargo build --release -p loadgen
    loadgen/evaluate/heldout.py [--only NAME,...] [--route prefix-load] [--margin 4] [--draws N] [--out DIR]

Routing settings come from the environment as for `loadgen simulate` (PREFIXGATE_PREFIX_LOAD_*,
AIBRIX_PREFIX_CACHE_*), so a setting is evaluated by exporting it. Exits 1 when a workload's
policy total is below its best baseline or a cell is more than MARGIN below; 0 otherwise.
The whole set is about six minutes of one core (release build), most of it the trace, run
`--jobs` (the machine's cores) at a time; `--only` picks workloads.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = "l20-qwen27b-fp8"
SLOW = str(ROOT / "config/engines/l20-qwen27b-fp8-slow.toml")
MATRIX = ROOT / "config/matrix-24.toml"
MATRIX_X3 = str(ROOT / "config/matrix-24x3.toml")
BASELINES = ["random", "least-request", "prefix-cache"]


def variant(edits):
    """config/matrix-24.toml with `key = value` lines of its [workload] replaced."""
    def make(folder):
        text = MATRIX.read_text()
        for key, value in edits.items():
            text, n = re.subn(rf"(?m)^{key} = [^#\n]*", f"{key} = {value} ", text)
            if n != 1:
                sys.exit(f"heldout.py: {MATRIX} has no single `{key} =` line to edit")
        path = Path(folder) / ("matrix-" + "-".join(f"{k}{v}" for k, v in edits.items()) + ".toml")
        path.write_text(text)
        return str(path)
    return make


def unequal(fleet, replicas, profiles, rps, count):
    """An unequal fleet on the three-round matrix (replica i runs profiles[i % len])."""
    return (f"{fleet}, {rps} rps", ["--matrix", MATRIX_X3, "--replicas", str(replicas),
            "--engine-profile", ",".join(profiles), "--rps", rps, "--count", str(count)])


# name: (what it is, the `loadgen simulate` arguments; a callable makes its matrix file in the
# run's folder and stands for its path)
WORKLOADS = {
    "seed": ("the seed matrix, 2 replicas", []),
    "u2": unequal("L20 + slow", 2, [ENGINE, SLOW], "1.6", 96),
    "u2-1.0": unequal("L20 + slow", 2, [ENGINE, SLOW], "1.0", 96),
    "u3": unequal("2 L20 + slow", 3, [ENGINE, ENGINE, SLOW], "2.4", 144),
    "u3-1.5": unequal("2 L20 + slow", 3, [ENGINE, ENGINE, SLOW], "1.5", 144),
    "u4": unequal("2 L20 + 2 slow", 4, [ENGINE, SLOW], "3.2", 192),
    "u4-2.0": unequal("2 L20 + 2 slow", 4, [ENGINE, SLOW], "2.0", 192),
    "p12k": ("12k-token prompts, 0.67 rps", ["--matrix", variant({"prefix_tokens": 11000,
              "tail_tokens": "[900, 1100]"}), "--rps", "0.67"]),
    "f12r3": ("12 families, 3 replicas, 2.4 rps", ["--matrix", variant({"families": 12}),
               "--replicas", "3", "--rps", "2.4", "--count", "144"]),
    "overload": ("config/workloads/overload.toml", [
        "--matrix", str(ROOT / "config/workloads/overload.toml")]),
    "overload-3k": ("config/workloads/overload-3k.toml", [
        "--matrix", str(ROOT / "config/workloads/overload-3k.toml")]),
    "r8": ("8 replicas, 6.4 rps", ["--replicas", "8", "--rps", "6.4", "--count", "384"]),
}
# Mooncake's synthetic trace, replayed on the virtual clock (`loadgen replay --sim`): one
# total per route, no cells. The trace sits outside the repository (../shared/traces/).
TRACE = ROOT.parent / "shared/traces/mooncake-synthetic.jsonl"
for replicas in (4, 8, 16):
    WORKLOADS[f"mooncake-{replicas}"] = (f"Mooncake trace, {replicas} replicas", [
        "--trace", str(TRACE), "--sim", "--replicas", str(replicas)])


def good_by_cell(results):
    """{(round, scenario): {route: good}} of `loadgen simulate` results (the same workload
    under several routing draws: the mean over them)."""
    cells = defaultdict(lambda: defaultdict(float))
    for result in results:
        for phase in result["phases"]:
            cell = cells[(phase["phase"].split("-")[0], phase["scenario"])]
            cell[phase["route"]] += phase["good"] / len(results)
    return cells


def simulate(loadgen, args, folder, name, route, draw):
    """One `loadgen simulate` (or, for a trace, `loadgen replay`) result, as phases."""
    args = [a(folder) if callable(a) else a for a in args]
    out = Path(folder) / f"{name}-draw{draw}.json"
    replay = "--trace" in args
    command = [loadgen, "replay" if replay else "simulate",
               "--routes", ",".join(BASELINES + [route]), *args, "--out", str(out)]
    if not replay:  # a replay has no routing draw to set
        command[-2:-2] = ["--routing-draw", str(draw)]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        return None, why(run.stderr)
    result = json.loads(out.read_text())
    if replay:  # the whole trace as one cell
        result = {"phases": [{"phase": "trace", "scenario": "all", "route": run["route"],
                              "good": run["good"]} for run in result["runs"]]}
    return result, None


def runs(loadgen, name, folder, route, draws):
    """Every draw's result of workload `name`, or the error that stopped one."""
    _, args = WORKLOADS[name]
    results = []
    # A replay has no routing draw: one run is every run.
    for draw in range(1 if "--trace" in args else draws):
        result, error = simulate(loadgen, args, folder, name, route, draw)
        if error:
            return [], error
        results.append(result)
    return results, None


def row(name, results, route, margin):
    """The table row of `name`'s results, and whether the workload passes."""
    what, _ = WORKLOADS[name]
    cells = good_by_cell(results)
    totals = {r: round(sum(c.get(r, 0) for c in cells.values())) for r in BASELINES + [route]}
    best = max(BASELINES, key=lambda r: totals[r])
    low = []
    for (rnd, scenario), good in sorted(cells.items()):
        rival = max(BASELINES, key=lambda r: good.get(r, 0))
        gap = good.get(route, 0) - good.get(rival, 0)
        if gap < -margin and len(cells) > 1:
            low.append(f"{rnd} {scenario} {gap:+.3g} ({rival})")
    passes = totals[route] >= totals[best] and not low
    text = (f"| {name}: {what} | {' | '.join(str(totals[r]) for r in BASELINES)} | "
            f"**{totals[route]}** | {totals[route] - totals[best]:+d} ({best}) | "
            f"{'; '.join(low) or 'none'} |")
    return text, passes


def why(stderr):
    """What a failed loadgen said: its `Error:` and the causes under it, on one line (any
    backtrace after them left out)."""
    lines = [line.strip() for line in stderr.splitlines()]
    start = next((i for i, line in enumerate(lines) if line.startswith("Error:")), None)
    if start is None:
        return next((line for line in reversed(lines) if line), "(no output)")
    said = []
    for line in lines[start:]:
        if line.startswith("Stack backtrace") or line.startswith("0:"):
            break
        if line and line != "Caused by:":
            said.append(line)
    return ": ".join(said)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loadgen", default=str(ROOT / "target/release/loadgen"))
    parser.add_argument("--route", default="prefix-load", help="the policy under test")
    parser.add_argument("--margin", type=int, default=4,
                        help="a cell more than this many good requests below the best baseline fails")
    parser.add_argument("--only", help="comma-separated workload names: " + ", ".join(WORKLOADS))
    parser.add_argument("--out", help="keep the result JSONs in this folder")
    parser.add_argument("--draws", type=int, default=1,
                        help="run each workload with routing draws 0..N-1 (the same arrivals, other "
                        "tie-breaks) and judge the mean: tells a route's luck from its rule")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="simulations run at once (default: the machine's cores)")
    options = parser.parse_args()
    names = options.only.split(",") if options.only else list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"no workload {', '.join(unknown)}; the workloads: {', '.join(WORKLOADS)}")
    if not os.access(options.loadgen, os.X_OK):
        parser.error(f"{options.loadgen} is not an executable: cargo build --release -p loadgen")
    if options.draws < 1 or options.jobs < 1:
        parser.error("--draws and --jobs take a number of at least 1")

    folder = options.out or tempfile.mkdtemp(prefix="heldout-")
    Path(folder).mkdir(parents=True, exist_ok=True)
    route = options.route
    print(f"| workload | {' | '.join(BASELINES)} | {route} | vs best baseline | cells > {options.margin} below |")
    print("|---|" + "---|" * (len(BASELINES) + 3))
    failed = 0
    with ThreadPoolExecutor(max_workers=options.jobs) as pool:
        pending = [pool.submit(runs, options.loadgen, name, folder, route, options.draws)
                   for name in names]
        for name, future in zip(names, pending):  # in the set's order, each once it is done
            results, error = future.result()
            if error:
                text, passes = (f"| {name}: {WORKLOADS[name][0]} | "
                                f"{' | '.join('' for _ in BASELINES)} | | stopped: {error} | |"), False
            else:
                text, passes = row(name, results, route, options.margin)
            failed += not passes
            print(text, flush=True)
    print(f"\n{len(names) - failed} of {len(names)} workloads pass (results in {folder})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
