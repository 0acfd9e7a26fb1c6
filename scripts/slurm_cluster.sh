#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, without systemd: for the tests (tests/test_slurm.py) and for trying the
# sbatch scripts before a real cluster. Needs root and Debian's `slurm-wlm` and `munge` packages.
#   scripts/slurm_cluster.sh start DIR   # config, state and logs in DIR; prints the SLURM_CONF line to export
#   export SLURM_CONF=DIR/slurm.conf     # sbatch, squeue, scancel, scontrol then talk to it
#   scripts/slurm_cluster.sh stop DIR    # stops the daemons it started, by PID
# munged runs as the munge user (started here only when none runs); slurmctld and slurmd run as root with the
# config in DIR, so /etc/slurm is left alone. The node has this machine's CPUs (nproc) and is idle within seconds.
# Job credentials live 10 s (cred_expire; SLURM's default is 120 s): a requeued job may start again that soon.
# Finished jobs stay listed for at least 10 s (MinJobAge=10; the default is 300 s, and SLURM 22.05 reads 0 as 2): then
# `sbatch --wait` asks whether a job has ended after 2 s and every 8 s after (with the default: 2, 8, 32, 32, ... s).
# Each job's end (state, exit code, times) is also written to DIR/jobcomp.log (jobcomp/filetxt), kept until DIR goes:
# the scheduler's own record of finished jobs on a cluster without an accounting database.
set -euo pipefail
action="${1:?usage: scripts/slurm_cluster.sh start|stop DIR}"
dir="${2:?usage: scripts/slurm_cluster.sh start|stop DIR}"

stop_pidfile() {
    [ -f "$1" ] || return 0
    pid="$(cat "$1")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$1"
}

if [ "$action" = stop ]; then
    # jobs first (their steps would outlive the daemons), then the daemons
    if [ -f "$dir/slurm.conf" ] && [ -f "$dir/slurmctld.pid" ]; then
        export SLURM_CONF="$dir/slurm.conf"
        scancel --full --user="$(id -un)" 2> /dev/null || true
        for _ in $(seq 100); do [ -z "$(squeue -h 2> /dev/null)" ] && break; sleep 0.1; done
    fi
    stop_pidfile "$dir/slurmd.pid"
    stop_pidfile "$dir/slurmctld.pid"
    stop_pidfile "$dir/munged.pid"  # only when this script started it
    exit 0
fi
[ "$action" = start ] || { echo "unknown action: $action (start or stop)" >&2; exit 2; }
for binary in munged slurmctld slurmd sinfo; do
    command -v "$binary" > /dev/null || PATH="$PATH:/usr/sbin"
    command -v "$binary" > /dev/null || { echo "$binary not found: apt-get install -y slurm-wlm munge" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "the daemons need root" >&2; exit 2; }

mkdir -p "$dir/state" "$dir/spool"
dir="$(cd "$dir" && pwd)"
if ! pgrep -x munged > /dev/null; then
    mkdir -p /run/munge
    chown munge:munge /run/munge
    runuser -u munge -- munged
    pgrep -x -n munged > "$dir/munged.pid"
fi
memory_mb=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 8 / 10))
cat > "$dir/slurm.conf" << EOF
ClusterName=local
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
MinJobAge=10
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N localhost
for _ in $(seq 100); do
    state="$(sinfo -h -N -o %t 2> /dev/null || true)"
    if [ "$state" = idle ]; then
        echo "export SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 0.2
done
echo "the node did not become idle in 20 s (state: ${state:-none}); logs in $dir" >&2
"$0" stop "$dir"
exit 1
