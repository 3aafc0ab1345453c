#!/usr/bin/env bash
# Local single-host Slurm (slurmctld + four slurmd + munge) on loopback, for the drain adapter's tests
# and the demo. Slurm 22.05 from Debian packages (docs/contract.md, "Slurm").
#   slurm.sh start    generate slurm.conf, start munged (if not up), slurmctld and the slurmd's; no-op if up
#   slurm.sh stop     stop the daemons started here (by pid; munged is left to whoever else uses it)
#   slurm.sh status   exit 0 if slurmctld answers (scontrol ping)
#   slurm.sh env      print the SLURM_CONF=... line clients need
# Environment: FLEETWATCH_HOME (default <repo>/.fleetwatch), SLURM_CTLD_PORT (16817),
#              SLURM_NODES (4; nodes gpu-node-01.. with slurmd ports 16821..).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
home="${FLEETWATCH_HOME:-$repo/.fleetwatch}"
ctld_port="${SLURM_CTLD_PORT:-16817}"
nnodes="${SLURM_NODES:-4}"
state="$home/slurm-$ctld_port"
conf="$state/slurm.conf"
host="$(hostname -s)"

log() { echo "slurm.sh: $*" >&2; }
# shellcheck source=../lib.sh
source "$here/../lib.sh"

ctld_pid() { svc_running_pid "$state/slurmctld.pid" slurmctld; }
slurmd_pid() { svc_running_pid "$state/slurmd-$1.pid" slurmd; }

node_name() { printf 'gpu-node-%02d' "$1"; }

ping_ctld() { SLURM_CONF="$conf" scontrol ping 2>/dev/null | grep -q "is UP"; }

write_conf() {
  mkdir -p "$state/ctld" "$state/spool"
  local last_port=$((16820 + nnodes))
  # Written on every start: the host name may differ between machines that share the checkout.
  cat > "$conf" <<CONF
ClusterName=fleetwatch
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
# Every ended job is also written here, one line each: the slurm-jobs publisher reads it for the ends
# of jobs that left slurmctld's memory (MinJobAge) while the publisher was down.
JobCompType=jobcomp/filetxt
JobCompLoc=$state/jobcomp.log
MinJobAge=300
# Jobs share nodes: a job gets 250 MB a CPU unless it asks, not the whole node.
DefMemPerCPU=250
GresTypes=gpu
# The nodes' CPUs and GPUs are what this file says, not what the (2-core, GPU-less) host has.
SlurmdParameters=config_overrides
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
ReturnToService=2
# A slurmd that stops answering is DOWN (and its jobs NODE_FAIL) after 15 s, not the default 300 s.
SlurmdTimeout=15
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool/slurmd-%n
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd-%n.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=gpu-node-[01-$(printf '%02d' "$nnodes")] NodeHostname=$host NodeAddr=127.0.0.1 Port=[16821-$last_port] CPUs=4 RealMemory=4000 Gres=gpu:8 State=UNKNOWN
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  # Eight GPUs per node as a gres, so jobs ask for and are given GPUs as on a real cluster and several
  # jobs can share a node (4 CPUs, 8 GPUs each). Slurm drops a GPU gres without device files, and
  # there is no GPU here: plain files stand in for /dev/nvidia0..7 (TaskPlugin=task/none confines
  # nothing, so no job opens them).
  mkdir -p "$state/dev"
  touch "$state"/dev/nvidia{0..7}
  cat > "$state/gres.conf" <<GRES
NodeName=gpu-node-[01-$(printf '%02d' "$nnodes")] Name=gpu File=$state/dev/nvidia[0-7]
GRES
}

start_munge() {
  if [[ -S /run/munge/munge.socket.2 ]] && munge -n </dev/null >/dev/null 2>&1; then return 0; fi
  command -v munged >/dev/null || { log "munged not found (apt-get install munge)"; exit 1; }
  install -d -o munge -g munge -m 0755 /run/munge
  [[ -f /etc/munge/munge.key ]] || { log "/etc/munge/munge.key is missing (reinstall munge)"; exit 1; }
  if [[ $(id -u) -eq 0 ]]; then
    runuser -u munge -- munged
  else
    munged
  fi
  for _ in $(seq 1 50); do munge -n </dev/null >/dev/null 2>&1 && return 0; sleep 0.1; done
  log "munged did not come up"; exit 1
}

start() {
  command -v slurmctld >/dev/null || { log "slurmctld not found (apt-get install slurmctld slurmd slurm-client munge)"; exit 1; }
  local before=""
  [[ -f "$conf" ]] && before="$(cat "$conf" "$state/gres.conf" 2>/dev/null || true)"
  write_conf
  if [[ -n "$before" && "$before" != "$(cat "$conf" "$state/gres.conf")" ]] && ctld_pid >/dev/null; then
    # daemons started with an older configuration would keep it (and warn of a conf mismatch)
    log "slurm.conf changed: restarting the daemons"
    stop
  fi
  start_munge
  if ! ctld_pid >/dev/null || ! ping_ctld; then
    log "starting slurmctld on 127.0.0.1:$ctld_port (state in $state)"
    # -D foreground (setsid detaches it from this shell), -i ignore saved state errors.
    SLURM_CONF="$conf" setsid slurmctld -D -i -f "$conf" >"$state/slurmctld.out" 2>&1 </dev/null &
    echo $! > "$state/slurmctld.pid"
  fi
  for i in $(seq 1 "$nnodes"); do
    local n; n="$(node_name "$i")"
    if slurmd_pid "$n" >/dev/null; then continue; fi
    mkdir -p "$state/spool/slurmd-$n"
    SLURM_CONF="$conf" setsid slurmd -D -N "$n" -f "$conf" >"$state/slurmd-$n.out" 2>&1 </dev/null &
    echo $! > "$state/slurmd-$n.pid"
  done
  for _ in $(seq 1 100); do
    if ping_ctld && [[ "$(SLURM_CONF="$conf" sinfo -h -N -o '%N %T' 2>/dev/null | grep -cvE 'unknown|down|not_responding')" -ge "$nnodes" ]]; then
      log "ready: $nnodes nodes; export SLURM_CONF=$conf"; return 0
    fi
    if ! ctld_pid >/dev/null; then
      log "slurmctld exited during start; see $state/slurmctld.log"; tail -20 "$state/slurmctld.out" "$state/slurmctld.log" >&2 || true
      exit 1
    fi
    sleep 0.1
  done
  log "nodes did not come up within 10 s:"; SLURM_CONF="$conf" sinfo -N >&2 || true
  tail -5 "$state"/slurmd-*.log >&2 || true
  exit 1
}

stop() {
  local f
  for f in "$state"/slurmd-*.pid; do [[ -e "$f" ]] && svc_stop slurmd "$f" slurmd 5; done
  svc_stop slurmctld "$state/slurmctld.pid" slurmctld 5
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) ping_ctld ;;
  env) echo "SLURM_CONF=$conf" ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
