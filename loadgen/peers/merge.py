#!/usr/bin/env python3
"""Merges loadgen matrix results from several routers into one file for `loadgen report`.

Usage: merge.py OUT FILE[:LABEL] ...

A FILE given with a LABEL (a peer router, which ignores the `routing-strategy` header, was
run with one placeholder route) has every phase's route, and the route part of its phase
name, replaced by LABEL; a FILE without one keeps its routes (prefixgate's). The top level
is the first file's, with the phase counts summed and `complete` true only if every file's
is; `runtime` and `aibrix` list each file's.
"""

import json
import sys


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    out, specs = argv[1], argv[2:]
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


if __name__ == "__main__":
    main(sys.argv)
