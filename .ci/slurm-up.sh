#!/usr/bin/env bash
# Start a single-node Slurm (munged + slurmctld + slurmd) on this machine, as root.
#
# Usage:  eval "$(.ci/slurm-up.sh [DIR])"
#
# Installs nothing: it expects Debian's `slurm-wlm` and `munge` packages (CI runs
# `apt-get install -y slurm-wlm munge` first). State, spool, logs and slurm.conf go to
# DIR (default $TRAINBENCH_SLURM_DIR, else /tmp/trainbench-slurm). Progress goes to
# stderr; stdout is one line, `export SLURM_CONF=DIR/slurm.conf`, because clients
# (sbatch, squeue, trainbench) find the cluster through that variable.
# Running it again while the cluster is up reuses it. Stop it with .ci/slurm-down.sh.
# The recipe is ../shared/reference/slurm-single-node.md: no cgroups, no systemd, so
# proctrack/linuxproc + task/none; no slurmdbd, so job completion goes to a text file.
set -euo pipefail

D="${1:-${TRAINBENCH_SLURM_DIR:-/tmp/trainbench-slurm}}"
say() { echo "slurm-up: $*" >&2; }

missing=()
for bin in /usr/sbin/munged /usr/sbin/slurmctld /usr/sbin/slurmd sbatch sinfo; do
    command -v "$bin" >/dev/null 2>&1 || missing+=("$bin")
done
if ((${#missing[@]})); then
    say "not installed: ${missing[*]}; run: apt-get install -y slurm-wlm munge"
    exit 3
fi
if [[ $(id -u) != 0 ]]; then
    say "must run as root (slurmd starts jobs as any user)"
    exit 3
fi

mkdir -p "$D/state" "$D/spool" "$D/log"
D="$(cd "$D" && pwd)"
export SLURM_CONF="$D/slurm.conf"
host="$(hostname -s)"

alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

if alive "$D/slurmctld.pid" && alive "$D/slurmd.pid" \
        && [[ "$(sinfo -h -o %t 2>/dev/null | head -n1)" =~ ^(idle|mix|alloc) ]]; then
    say "already up in $D"
    echo "export SLURM_CONF=$SLURM_CONF"
    exit 0
fi

# munge: the package created /etc/munge/munge.key; the daemon only needs its run dir.
mkdir -p /run/munge
chown munge:munge /run/munge
if ! munge -n </dev/null >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n </dev/null >/dev/null 2>&1 || { say "munged did not start"; exit 1; }
fi

cat >"$SLURM_CONF" <<EOF
# Written by trainbench .ci/slurm-up.sh: a single-node cluster for tests.
ClusterName=trainbench-ci
SlurmctldHost=$host
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
# A cancelled job's processes get this long between SIGTERM and SIGKILL.
KillWait=5
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF

# Stale daemons from an earlier run in this directory would hold the ports.
for pidfile in "$D/slurmd.pid" "$D/slurmctld.pid"; do
    if alive "$pidfile"; then kill "$(cat "$pidfile")" 2>/dev/null || true; sleep 1; fi
done

/usr/sbin/slurmctld
/usr/sbin/slurmd

for _ in $(seq 100); do
    state="$(sinfo -h -o %t 2>/dev/null | head -n1 || true)"
    if [[ "$state" =~ ^(idle|mix|alloc) ]]; then
        say "up: node $host ($state), partition debug, conf $SLURM_CONF"
        echo "export SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 0.2
done
say "slurm did not become idle in 20 s (node state: '${state:-none}'); logs:"
tail -n 20 "$D/log/slurmctld.log" "$D/log/slurmd.log" >&2 || true
exit 1
