#!/usr/bin/env bash
# Stop the single-node Slurm started by .ci/slurm-up.sh (same DIR argument).
# Daemons are stopped by their pid files only; munged is left running because other
# users of munge on the machine may need it. Installs and removes nothing.
set -uo pipefail

D="${1:-${TRAINBENCH_SLURM_DIR:-/tmp/trainbench-slurm}}"

for pidfile in "$D/slurmd.pid" "$D/slurmctld.pid"; do
    [[ -s "$pidfile" ]] || continue
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$pidfile"
done
echo "slurm-down: stopped daemons of $D" >&2
