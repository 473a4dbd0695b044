#!/usr/bin/env bash
# Stop the single-node Slurm started by .ci/slurm-up.sh (same DIR argument): slurmd,
# slurmctld, then slurmdbd and MariaDB where accounting ran. Daemons are stopped by their
# pid files only; munged is left running because other users of munge on the machine may
# need it. Installs and removes nothing (the MariaDB data stays in DIR for the next start).
set -uo pipefail

D="${1:-${TRAINBENCH_SLURM_DIR:-/tmp/trainbench-slurm}}"

# stop PIDFILE SECONDS: SIGTERM, wait up to SECONDS for a clean exit, then SIGKILL.
stop() {
    local pidfile="$1" wait_s="$2" pid
    [[ -s "$pidfile" ]] || return 0
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq $((wait_s * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$pidfile"
}

stop "$D/slurmd.pid" 5
stop "$D/slurmctld.pid" 5
stop "$D/slurmdbd.pid" 10
# MariaDB flushes InnoDB on SIGTERM; give it time before forcing.
stop /run/mysqld/trainbench-mariadbd.pid 30
echo "slurm-down: stopped daemons of $D" >&2
