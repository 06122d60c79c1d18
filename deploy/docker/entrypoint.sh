#!/bin/sh
# The image's entrypoint: runs prefixgate with the config file named by PREFIXGATE_CONFIG
# (default /etc/prefixgate/gateway.toml) and any further flags, e.g. `--mock-engines 2`.
# A prefixgate subcommand runs as `prefixgate SUBCOMMAND …` (no config file added); any other
# first argument that is not a flag is run as a command instead (`mock-engine …`, `sh`).
# `exec` makes the program PID 1, so the container's SIGTERM reaches it and it drains.
set -eu

case "${1:-}" in
    "" | -*)
        config="${PREFIXGATE_CONFIG:-/etc/prefixgate/gateway.toml}"
        if [ ! -r "$config" ]; then
            echo "prefixgate-entrypoint: config file $config (PREFIXGATE_CONFIG) is not readable" >&2
            exit 2
        fi
        exec prefixgate --config "$config" "$@"
        ;;
    route-replay | help)
        exec prefixgate "$@"
        ;;
    *)
        exec "$@"
        ;;
esac
