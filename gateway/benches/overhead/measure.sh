# The measuring half of the overhead scripts (sourced by run.sh, side_by_side.sh and
# profile.sh, not run): the line describing the machine, start processes and wait for their
# address, one wrk run as one result row with the proxy's CPU per request read from /proc,
# and the summary over rounds. The caller sets $WORK (a scratch folder), $RESULTS (the rows'
# file), the PIDS array and the CPU placement (PROXY_CPUS, UPSTREAM_CPUS, LOAD_CPUS,
# WRK_THREADS), and traps EXIT with cleanup (stops PIDS).

TICKS=$(getconf CLK_TCK)

cleanup() { # on exit: stop the processes in PIDS, wait for them, remove $WORK
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}

describe_machine() { # the first line of every result: when, on what, how loaded, pinned how
    echo "# $(date -u +%FT%TZ) $(nproc) CPUs, load average: $(cut -d' ' -f1-3 /proc/loadavg), PIN=${PIN:-0} (proxy ${PROXY_CPUS}, upstream ${UPSTREAM_CPUS}, wrk ${LOAD_CPUS} with ${WRK_THREADS} threads)"
}

pin() { # pin CPUS COMMAND...: run pinned when PIN=1 (exec: $! must be the measured process)
    local cpus=$1; shift
    if [[ "${PIN:-0}" == 1 ]]; then exec taskset -c "$cpus" "$@"; else exec "$@"; fi
}

# start NAME PATTERN COMMAND...: starts a process, waits (bounded) for PATTERN + URL in its
# output, and sets $STARTED_URL and $STARTED_PID.
start() {
    local name=$1 pattern=$2; shift 2
    "$@" >"$WORK/$name.log" 2>&1 &
    STARTED_PID=$!
    PIDS+=("$STARTED_PID")
    for _ in $(seq 1 100); do
        STARTED_URL=$(grep -o "$pattern http://[0-9.:]*" "$WORK/$name.log" 2>/dev/null | head -1 | awk '{print $NF}') || true
        [[ -n "$STARTED_URL" ]] && return 0
        sleep 0.1
    done
    echo "$name did not start:" >&2; cat "$WORK/$name.log" >&2; exit 1
}

cpu_ticks() { # user + system ticks of a process, all threads
    awk '{print $14 + $15}' "/proc/$1/stat"
}

to_us() { # wrk latency ("85.00us", "1.20ms", "2.00s") to microseconds
    awk -v v="$1" 'BEGIN {
        n = v + 0
        if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else if (v ~ /s$/) print n * 1000000; else print n }'
}

result_header() {
    printf 'case\tc\ttarget\trequests\trps\tp50_us\tp99_us\tproxy_cpu_us_per_req\tupstream_cpu_us_per_req\tnon2xx\n'
}

# measure CASE C TARGET URL PROXY_PID UPSTREAM_PID LUA: one wrk run of $SECONDS_PER_RUN s at
# concurrency C (wrk pinned to $LOAD_CPUS with up to $WRK_THREADS threads), printed and
# appended to $RESULTS as one row. PROXY_PID empty: no proxy (direct).
measure() {
    local case=$1 c=$2 target=$3 url=$4 pid=$5 upstream_pid=$6 lua=$7
    local before=0 after=0 up_before up_after threads out requests rps p50 p99 non2xx cpu up_cpu
    [[ -n "$pid" ]] && before=$(cpu_ticks "$pid")
    up_before=$(cpu_ticks "$upstream_pid")
    threads=$(( c < WRK_THREADS ? c : WRK_THREADS ))  # wrk needs connections >= threads
    out=$( (pin "$LOAD_CPUS" wrk -t"$threads" -c"$c" -d"${SECONDS_PER_RUN}s" --latency \
        -s "$lua" "$url/v1/chat/completions") )
    [[ -n "$pid" ]] && after=$(cpu_ticks "$pid")
    up_after=$(cpu_ticks "$upstream_pid")
    requests=$(echo "$out" | awk '/requests in/ {print $1}')
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    p50=$(to_us "$(echo "$out" | awk '$1 == "50%" {print $2}')")
    p99=$(to_us "$(echo "$out" | awk '$1 == "99%" {print $2}')")
    non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
    cpu=$(awk -v d=$((after - before)) -v t="$TICKS" -v n="$requests" \
        'BEGIN { printf "%.1f", (n > 0 ? d / t * 1e6 / n : 0) }')
    up_cpu=$(awk -v d=$((up_after - up_before)) -v t="$TICKS" -v n="$requests" \
        'BEGIN { printf "%.1f", (n > 0 ? d / t * 1e6 / n : 0) }')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$case" "$c" "$target" \
        "$requests" "$rps" "$p50" "$p99" "$cpu" "$up_cpu" "${non2xx:-0}" | tee -a "$RESULTS"
}

summarize() { # ROUNDS: mean per (case, c, target) of the rows in $RESULTS, against direct
    echo
    echo "# summary over $1 rounds: mean rps and p50/p99, CPU per request over all requests;"
    echo "# ratio = target rps / direct rps, added = target p50 - direct p50"
    printf 'case\tc\ttarget\trps\tratio\tp50_us\tadded_p50_us\tp99_us\tadded_p99_us\tproxy_cpu_us_per_req\n'
    awk -F'\t' '
        { key = $1 "\t" $2 "\t" $3; if (!(key in n)) order[++k] = key
          n[key]++; req[key] += $4; rps[key] += $5; p50[key] += $6; p99[key] += $7
          cpu[key] += $8 * $4 }
        END {
            for (i = 1; i <= k; i++) {
                key = order[i]; split(key, f, "\t"); d = f[1] "\t" f[2] "\tdirect"
                printf "%s\t%.0f\t%.2f\t%.0f\t%+.0f\t%.0f\t%+.0f\t%.1f\n", key, rps[key] / n[key],
                    rps[key] / rps[d], p50[key] / n[key], p50[key] / n[key] - p50[d] / n[d],
                    p99[key] / n[key], p99[key] / n[key] - p99[d] / n[d],
                    (req[key] > 0 ? cpu[key] / req[key] : 0)
            }
        }' "$RESULTS"
}
