#!/bin/sh
# Install and start a single-node Slurm on this machine (as root; Debian 12: Slurm 22.05):
# munge, slurmctld and slurmd with a slurm.conf for this host's CPUs and memory, one
# partition "debug". The daemons' PIDs go to $KD_SLURM_DIR/pids (slurm-down.sh stops them
# by PID). Used by validation/slurm/run.sh; doc/user-guide.md, "Batch jobs".
#   KD_SLURM_DIR  state, logs, job completion file (default /tmp/kd-slurm)
set -eu
[ "$(id -u)" = 0 ] || { echo "slurm-up.sh: run as root (it installs packages and starts daemons)" >&2; exit 2; }
D=${KD_SLURM_DIR:-/tmp/kd-slurm}
if ! command -v slurmctld > /dev/null || ! command -v slurmd > /dev/null || ! command -v munged > /dev/null \
   || ! command -v sbatch > /dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge > /dev/null
fi
host=$(hostname -s)
cpus=$(nproc)
mem=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)
mkdir -p "$D" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /etc/slurm
chown slurm:slurm /var/spool/slurmctld /var/log/slurm 2> /dev/null || true
chown munge:munge /run/munge
chmod 0755 /run/munge
[ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none;
  chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key; }
cat > /etc/slurm/slurm.conf << EOF
ClusterName=kdtest
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd.log
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$D/jobcomp.txt
JobAcctGatherType=jobacct_gather/none
MinJobAge=7200
KillWait=10
InactiveLimit=0
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
: > "$D/jobcomp.txt"
pgrep -x munged > /dev/null || runuser -u munge -- /usr/sbin/munged
pgrep -x slurmctld > /dev/null || slurmctld -c # -c: no saved jobs from an earlier run
pgrep -x slurmd > /dev/null || slurmd
i=0
until sinfo -h -o %t 2> /dev/null | grep -q idle; do
  i=$((i + 1)); [ $i -lt 60 ] || { echo "slurm-up.sh: the node did not become idle" >&2; sinfo >&2; exit 3; }
  scontrol update nodename="$host" state=resume > /dev/null 2>&1 || true
  sleep 1
done
{ pgrep -x munged; pgrep -x slurmctld; pgrep -x slurmd; } > "$D/pids"
echo "slurm-up.sh: Slurm $(sinfo -V | cut -d' ' -f2) on $host ($cpus CPUs, $mem MB): $(sinfo -h -o '%P %a %D %t')"
