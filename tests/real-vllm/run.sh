#!/usr/bin/env bash
# The real-vLLM suite, whole, from a fresh machine:
#
#   tests/real-vllm/run.sh [FILTER...]
#
# installs vLLM's CPU build into its cached venv (install.sh), builds the tiny model
# (model.sh), builds prefixgate's release binary, starts two real vLLM replicas (start.sh),
# runs the suite (tests/tests/real_vllm/, every test #[ignore]d in a plain `cargo test`)
# one test at a time against them, stops them, and ends with one line: `N passed, 0 failed`.
# FILTERs pass to the test runner (e.g. `kv_events`). PREFIXGATE_BIN runs another prefixgate
# binary instead of the release build. Costs and what each test checks: docs/REAL_VLLM.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
started=$SECONDS

echo "== real vLLM: install (cached venv)" >&2
"$here/install.sh" >/dev/null
echo "   ready after $((SECONDS - started)) s" >&2

if [ -z "${PREFIXGATE_BIN:-}" ]; then
    echo "== prefixgate release build" >&2
    cargo build --release -p gateway --bin prefixgate
    export PREFIXGATE_BIN="${CARGO_TARGET_DIR:-$root/target}/release/prefixgate"
fi

state=$(mktemp -d -t real-vllm.XXXXXX)
trap '"$here/stop.sh" "$state"; rm -rf "$state"' EXIT
echo "== two real vLLM replicas" >&2
"$here/start.sh" 2 "$state"
echo "   serving after $((SECONDS - started)) s" >&2

echo "== the suite" >&2
log="$state/suite.log"
set +e
PREFIXGATE_REAL_VLLM_STATE="$state" cargo test -p prefixgate-tests --test real_vllm -- \
    --ignored --test-threads=1 "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
summary=$(grep -E '^test result: ' "$log" | tail -n 1)
passed=$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$summary")
failed=$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$summary")
if [ "$status" -ne 0 ]; then
    # Whatever the replicas and gateways said, for whoever reads the log.
    for file in "$state"/*.log; do
        [ "$(basename "$file")" = suite.log ] && continue
        echo "--- the end of $(basename "$file")"
        tail -n 15 "$file"
    done
fi
echo "real-vLLM suite ($((SECONDS - started)) s in all): ${passed:-0} passed, ${failed:-?} failed"
exit "$status"
