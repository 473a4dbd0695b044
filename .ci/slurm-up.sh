#!/usr/bin/env bash
# Start a single-node Slurm (munged + slurmctld + slurmd) on this machine, as root, with
# real accounting (MariaDB + slurmdbd) where those are installed.
#
# Usage:  eval "$(.ci/slurm-up.sh [DIR])"
#
# Installs nothing: it expects Debian's `slurm-wlm` and `munge` packages, and for
# accounting `slurmdbd` and `mariadb-server` (CI installs all four). State, spool, logs,
# the MariaDB data directory, slurm.conf and slurmdbd.conf go to DIR (default
# $TRAINBENCH_SLURM_DIR, else /tmp/trainbench-slurm). Progress goes to stderr; stdout is
# one line, `export SLURM_CONF=DIR/slurm.conf`, because clients (sbatch, squeue, sacct,
# trainbench) find the cluster through that variable.
# Running it again while the cluster is up reuses it; anything half up is stopped first
# and started afresh. Stop it with .ci/slurm-down.sh.
# The recipe is ../shared/reference/slurm-single-node.md: no cgroups, no systemd, so
# proctrack/linuxproc + task/none. Without slurmdbd/mariadbd the cluster has no
# accounting (sacct says it is disabled); job completion always goes to a text file too.
set -euo pipefail

D="${1:-${TRAINBENCH_SLURM_DIR:-/tmp/trainbench-slurm}}"
HERE="$(cd "$(dirname "$0")" && pwd)"
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

# Accounting only when every piece of it is installed; otherwise today's plain cluster.
accounting=1
for bin in /usr/sbin/slurmdbd /usr/sbin/mariadbd mariadb-install-db mariadb mariadb-admin \
           sacctmgr sacct; do
    command -v "$bin" >/dev/null 2>&1 || accounting=0
done

mkdir -p "$D/state" "$D/spool" "$D/log"
D="$(cd "$D" && pwd)"
export SLURM_CONF="$D/slurm.conf"
host="$(hostname -s)"
cluster=trainbench-ci
# MariaDB's run files must live under /run/mysqld; slurmdbd reaches it through the
# client library's default socket there (StorageHost=localhost), so TCP stays off.
DB_SOCKET=/run/mysqld/mysqld.sock
DB_PIDFILE=/run/mysqld/trainbench-mariadbd.pid

alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
registered() { sacctmgr -n -P show cluster format=cluster 2>/dev/null | grep -qx "$cluster"; }

if alive "$D/slurmctld.pid" && alive "$D/slurmd.pid" \
        && [[ "$(sinfo -h -o %t 2>/dev/null | head -n1)" =~ ^(idle|mix|alloc) ]] \
        && { ((accounting == 0)) \
             || { alive "$D/slurmdbd.pid" && alive "$DB_PIDFILE" && registered; }; }; then
    say "already up in $D"
    echo "export SLURM_CONF=$SLURM_CONF"
    exit 0
fi

# Whatever an earlier run left half up (daemons holding ports, a stale database server)
# is stopped by its pid files before anything starts.
"$HERE/slurm-down.sh" "$D" 2>/dev/null || true

# munge: the package created /etc/munge/munge.key; the daemon only needs its run dir.
mkdir -p /run/munge
chown munge:munge /run/munge
if ! munge -n </dev/null >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n </dev/null >/dev/null 2>&1 || { say "munged did not start"; exit 1; }
fi

if ((accounting)); then
    storage="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux"
else
    storage="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi

cat >"$SLURM_CONF" <<EOF
# Written by trainbench .ci/slurm-up.sh: a single-node cluster for tests.
ClusterName=$cluster
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
$storage
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
# A cancelled job's processes get this long between SIGTERM and SIGKILL.
KillWait=5
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF

db_fail() {
    say "$1; logs:"
    tail -n 20 "$D/log/mariadb-install.log" "$D/log/mariadb.log" "$D/log/slurmdbd.log" \
        2>/dev/null >&2 || true
    exit 1
}

if ((accounting)); then
    # MariaDB, data kept in DIR (job history survives a restart like the job ids do).
    # It runs as root so that DIR may be anywhere root can write.
    mkdir -p /run/mysqld
    # Ours was stopped above, so a server answering on the socket is someone else's.
    if mariadb-admin --no-defaults --socket="$DB_SOCKET" ping >/dev/null 2>&1; then
        say "a MariaDB not started by slurm-up already serves $DB_SOCKET; stop it first"
        exit 1
    fi
    if [[ ! -d "$D/mysql/mysql" ]]; then
        rm -rf "$D/mysql"
        mariadb-install-db --no-defaults --user=root --datadir="$D/mysql" \
            --auth-root-authentication-method=socket --skip-test-db --innodb-log-file-size=16M \
            >"$D/log/mariadb-install.log" 2>&1 \
            || db_fail "mariadb-install-db failed (see $D/log/mariadb-install.log)"
    fi
    setsid /usr/sbin/mariadbd --no-defaults --user=root --datadir="$D/mysql" \
        --socket="$DB_SOCKET" --pid-file="$DB_PIDFILE" --skip-networking \
        --innodb-buffer-pool-size=64M --innodb-log-file-size=16M --log-error="$D/log/mariadb.log" \
        </dev/null >/dev/null 2>&1 &
    for _ in $(seq 150); do
        mariadb-admin --no-defaults --socket="$DB_SOCKET" ping >/dev/null 2>&1 && break
        sleep 0.2
    done
    mariadb-admin --no-defaults --socket="$DB_SOCKET" ping >/dev/null 2>&1 \
        || db_fail "mariadbd did not answer in 30 s"

    # A fresh password each bring-up; only slurmdbd.conf (mode 600) holds it.
    pass="$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
    mariadb --no-defaults --socket="$DB_SOCKET" -u root <<SQL \
        || db_fail "could not create the slurm database user"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pass';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL

    # slurmdbd reads slurmdbd.conf beside slurm.conf and refuses it unless only root can read it.
    rm -f "$D/slurmdbd.conf"
    (umask 077; cat >"$D/slurmdbd.conf" <<EOF
# Written by trainbench .ci/slurm-up.sh: accounting for the test cluster.
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$D/slurmdbd.pid
LogFile=$D/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$pass
StorageLoc=slurm_acct_db
EOF
    )
    chmod 600 "$D/slurmdbd.conf"
    /usr/sbin/slurmdbd
    up=0
    for _ in $(seq 100); do
        if sacctmgr -n -P show cluster format=cluster >/dev/null 2>&1; then up=1; break; fi
        sleep 0.2
    done
    ((up)) || db_fail "slurmdbd did not answer sacctmgr in 20 s"
    if ! registered; then
        sacctmgr -i add cluster "$cluster" >/dev/null \
            || db_fail "sacctmgr could not add cluster $cluster"
    fi
fi

/usr/sbin/slurmctld
/usr/sbin/slurmd

for _ in $(seq 100); do
    state="$(sinfo -h -o %t 2>/dev/null | head -n1 || true)"
    if [[ "$state" =~ ^(idle|mix|alloc) ]]; then
        if ((accounting)); then what="accounting via slurmdbd"; else what="no accounting"; fi
        say "up: node $host ($state), partition debug, $what, conf $SLURM_CONF"
        echo "export SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 0.2
done
say "slurm did not become idle in 20 s (node state: '${state:-none}'); logs:"
tail -n 20 "$D/log/slurmctld.log" "$D/log/slurmd.log" >&2 || true
exit 1
