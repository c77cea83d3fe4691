#!/usr/bin/env bash
# Start a one-node SLURM cluster on this machine for tests/test_slurm.py: munge, slurmctld and slurmd, with a
# slurm.conf of its own under $1 (default /tmp/bnrotation-slurm). Prints the slurm.conf path (export it as
# SLURM_CONF). Needs Debian's slurmctld, slurmd, slurm-client and munge packages, and root (as in CI).
set -euo pipefail
dir=${1:-/tmp/bnrotation-slurm}
mkdir -p "$dir/state" "$dir/spool" "$dir/log"
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))
cat > "$dir/slurm.conf" <<CONF
ClusterName=bnrotation
SlurmctldHost=$(hostname -s)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ReturnToService=2
KillWait=5
MinJobAge=600
NodeName=$(hostname -s) CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$(hostname -s) Default=YES MaxTime=INFINITE State=UP
CONF
if ! pgrep -x munged >/dev/null; then
  mkdir -p /run/munge && chown munge:munge /run/munge
  runuser -u munge -- /usr/sbin/munged
fi
pkill -x slurmctld || true
pkill -x slurmd || true
sleep 1
/usr/sbin/slurmctld -f "$dir/slurm.conf" -i
/usr/sbin/slurmd -f "$dir/slurm.conf"
for _ in $(seq 1 30); do
  if SLURM_CONF="$dir/slurm.conf" sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    echo "$dir/slurm.conf"
    exit 0
  fi
  sleep 1
done
echo "slurm did not come up; see $dir/log" >&2
exit 1
