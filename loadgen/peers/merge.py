#!/usr/bin/env python3
"""Merges loadgen results from several routers into one file for `loadgen report`.

Usage: merge.py [--time-scale S] OUT FILE[:LABEL] ...

The files are all matrix results (`phases`) or all trace replays (`runs`).

A FILE given with a LABEL (a peer router, which ignores the `routing-strategy` header, was
run with one placeholder route) has every phase's route, and the route part of its phase
name, replaced by LABEL; a FILE without one keeps its routes (prefixgate's).

Matrix results: the top level is the first file's, with the phase counts summed and
`complete` true only if every file's is; `runtime` and `aibrix` list each file's.

Trace replays: the runs are concatenated under the first file's `trace` (its `runtime`
lists each file's). `loadgen replay --gateway` measures wall seconds; at engine time scale S
the replay ran S times faster with the SLO divided by S, so its times, speedup and SLO are
turned back into engine seconds here. Also prints a table with TTFT p95 and the replica split
(engine counters), which `loadgen report` does not show.
"""

import json
import math
import sys


def main(argv):
    time_scale = 1.0
    if len(argv) > 2 and argv[1] == "--time-scale":
        time_scale = float(argv[2])
        argv = argv[:1] + argv[3:]
    if len(argv) < 3:
        sys.exit(__doc__)
    out, specs = argv[1], argv[2:]
    with open(specs[0].partition(":")[0], encoding="utf-8") as f:
        if "runs" in json.load(f):
            return merge_replays(out, specs, time_scale)
    merged = None
    runtimes, gateways = [], []
    for spec in specs:
        path, _, label = spec.partition(":")
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
        for phase in result["phases"]:
            if label:
                old = phase["route"]
                if phase["phase"].endswith("-" + old):
                    phase["phase"] = phase["phase"][: -len(old)] + label
                phase["route"] = label
                if isinstance(phase.get("config"), dict):
                    phase["config"]["route"] = label
        runtimes.append(f"{label or 'prefixgate'}: {result.get('runtime', '')}")
        gateways.append(label or result.get("aibrix", ""))
        if merged is None:
            merged = result
        else:
            merged["phases"].extend(result["phases"])
            merged["measured_phases"] += result["measured_phases"]
            merged["planned_phases"] += result["planned_phases"]
            merged["complete"] = merged["complete"] and result["complete"]
    merged["runtime"] = "; ".join(runtimes)
    merged["aibrix"] = ", ".join(gateways)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(merged, f, indent=2)
        f.write("\n")


TIMES = ("ttft", "tpot", "e2e")


def merge_replays(out, specs, time_scale):
    merged, runtimes = None, []
    for spec in specs:
        path, _, label = spec.partition(":")
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
        for run in result["runs"]:
            if label:
                run["route"] = label
            rescale(run, time_scale)
        runtimes.append(f"{label or 'prefixgate'}: {result['trace'].get('runtime', '')}")
        if merged is None:
            merged = result
            trace = merged["trace"]
            # duration_s is trace time already (the last send times the speedup).
            trace["speedup"] /= time_scale
            trace["slo"] = {k: v * time_scale for k, v in trace["slo"].items()}
        else:
            merged["runs"].extend(result["runs"])
            merged["complete"] = merged["complete"] and result["complete"]
    merged["trace"]["runtime"] = "; ".join(runtimes)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(merged, f, indent=2)
        f.write("\n")
    print_split_table(merged)


def rescale(run, s):
    """Wall seconds of a replay at engine time scale `s` to engine seconds."""
    for key in TIMES:
        run[key] = {q: (v * s if v is not None else None) for q, v in run[key].items()}
    run["elapsed_s"] *= s
    for record in run.get("records") or []:
        record["at_s"] *= s
        for key in TIMES:
            if record[f"{key}_s"] is not None:
                record[f"{key}_s"] *= s


def quantile(values, q):
    """Linear between order statistics, as loadgen's tails (None when empty)."""
    if not values:
        return None
    values = sorted(values)
    rank = q * (len(values) - 1)
    lower = math.floor(rank)
    upper = min(lower + 1, len(values) - 1)
    return values[lower] + (rank - lower) * (values[upper] - values[lower])


def print_split_table(merged):
    print("| router / route | good | errors | TTFT p50 s | TTFT p95 s | hit ratio | replica split (engines) |")
    print("|---|---|---|---|---|---|---|")
    for run in merged["runs"]:
        ttfts = [r["ttft_s"] for r in run.get("records") or [] if r["ttft_s"] is not None and r["error"] is None]
        split = "/".join(f"{r['engine_completed']:.0f}" for r in run["replicas"].values())
        fmt = lambda v: "–" if v is None else f"{v:.2f}"
        print(
            f"| {run['route']} | {run['good']} / {run['requests']} | {run['errors']} "
            f"| {fmt(quantile(ttfts, 0.5))} | {fmt(quantile(ttfts, 0.95))} "
            f"| {run['cache_hit_ratio']:.3f} | {split} |"
        )
    print()


if __name__ == "__main__":
    main(sys.argv)
