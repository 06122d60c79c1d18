#!/usr/bin/env python3
"""The top costs of a callgrind profile (profile.sh), per request.

Reads one callgrind output file (its only event: instructions, Ir) and prints:
- the functions with the most exclusive instructions (their own code),
- the functions with the most inclusive instructions (their own code and what they call),
- the exclusive instructions per crate (the first path segment of a Rust symbol; C
  libraries by their object file), so a table shows which component a request's cost is in.
Figures are divided by --requests (1 by default). With --total it prints only the total.
Recursion is counted once per call edge, as callgrind_annotate does. With --callers NAME
it prints instead the callers of the functions whose name holds NAME, by inclusive cost.
"""

import argparse
import collections
import re
import sys

NAMED = re.compile(r"^(c?(?:fn|ob|fl|fi|fe))=\((\d+)\)(?: (.*))?$")


def read(path):
    """Exclusive and inclusive instructions per function, and each function's object."""
    names = {"fn": {}, "ob": {}}
    exclusive = collections.Counter()
    inclusive = collections.Counter()
    objects = {}
    calls = collections.Counter()
    fn = ob = None
    call_pending = False
    cfn = None
    total = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            m = NAMED.match(line)
            if m:
                kind, ident, name = m.groups()
                base = kind.lstrip("c") if kind in ("cfn", "cob") else kind
                table = names.setdefault(base, {})
                if name is not None:
                    table[ident] = name
                value = table.get(ident, ident)
                if kind == "fn":
                    fn = value
                    objects.setdefault(fn, ob)
                elif kind == "ob":
                    ob = value
                elif kind == "cfn":
                    cfn = value
                continue
            if line.startswith("calls="):
                call_pending = True
                continue
            if line.startswith("summary:") or line.startswith("totals:"):
                total = max(total, int(line.split()[1]))
                continue
            if not (line[0].isdigit() or line[0] in "+-*"):
                continue
            fields = line.split()
            cost = int(fields[1]) if len(fields) > 1 else 0
            if call_pending:
                # The cost of a call: inclusive for the caller only (not its own code).
                if cfn != fn:
                    inclusive[fn] += cost
                calls[(fn, cfn)] += cost
                call_pending = False
            else:
                exclusive[fn] += cost
                inclusive[fn] += cost
    return exclusive, inclusive, calls, objects, total or sum(exclusive.values())


def crate_of(name, obj):
    """The component a function belongs to: its Rust crate, else its object file."""
    if obj and ".so" in obj:
        return obj.rsplit("/", 1)[-1].split(".so")[0]
    stripped = name.lstrip("<&*_ ")
    stripped = re.sub(r"^(dyn |mut |const )+", "", stripped)
    segment = re.split(r"::|<| |\(", stripped, maxsplit=1)[0]
    return segment or name


def short(name, width=110):
    return name if len(name) <= width else name[: width - 1] + "…"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--requests", type=float, default=1.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--total", action="store_true")
    parser.add_argument("--callers", metavar="NAME", help="who calls the functions named so")
    args = parser.parse_args()
    exclusive, inclusive, calls, objects, total = read(args.file)
    if args.total:
        print(total)
        return
    per = args.requests
    if args.callers:
        edges = collections.Counter()
        for (caller, callee), cost in calls.items():
            if args.callers in callee:
                edges[(caller, callee)] += cost
        for (caller, callee), cost in edges.most_common(args.top):
            print(f"{cost / per:>10,.0f}  {short(caller, 90)}  ->  {short(callee, 60)}")
        return
    print(f"# {args.file}: {total / per:,.0f} instructions per request ({per:.0f} requests)")
    print("\n## exclusive (own code), instructions per request, share")
    for name, cost in exclusive.most_common(args.top):
        print(f"{cost / per:>10,.0f}  {100 * cost / total:5.1f} %  {short(name)}")
    print("\n## inclusive (own code and callees), instructions per request, share")
    for name, cost in inclusive.most_common(args.top):
        print(f"{cost / per:>10,.0f}  {100 * cost / total:5.1f} %  {short(name)}")
    crates = collections.Counter()
    for name, cost in exclusive.items():
        crates[crate_of(name, objects.get(name))] += cost
    print("\n## exclusive per crate or library, instructions per request, share")
    for crate, cost in crates.most_common(args.top):
        print(f"{cost / per:>10,.0f}  {100 * cost / total:5.1f} %  {crate}")


if __name__ == "__main__":
    sys.exit(main())
