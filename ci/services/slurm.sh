#!/usr/bin/env bash
# A single-node Slurm (munge + slurmctld + slurmd) for tests/integration/test_slurm_real.py.
# Sourced by ci/test.sh, or by hand: `source ci/services/slurm.sh`. Needs root (the daemons run as root).
#
# Idempotent: a controller that already answers with a usable node is reused. Every wait is bounded.
# On success it exports SLURM_CONF. On failure it exports SERVEMATRIX_SLURM_ERROR instead and returns 0,
# so the rest of the suite still runs and the Slurm test fails with the reason instead of skipping.

_servematrix_slurm_state() {
  # The node's state as sinfo prints it (idle, mixed, allocated, down*, ...), or nothing.
  timeout 10 sinfo -h -n localhost -o %T 2>/dev/null | head -n 1
}

_servematrix_slurm_usable() {
  case "$(_servematrix_slurm_state)" in
    idle | mixed | allocated | completing) return 0 ;;
    *) return 1 ;;
  esac
}

_servematrix_slurm_alive() {
  local dir=$1 name
  for name in slurmctld slurmd; do
    [ -f "$dir/$name.pid" ] && kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null || return 1
  done
}

_servematrix_slurm_stop() {
  # Only the daemons this script started, found by the pid files it configured.
  local dir=$1 name pid
  for name in slurmd slurmctld; do
    [ -f "$dir/$name.pid" ] || continue
    pid=$(cat "$dir/$name.pid")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$dir/$name.pid"
  done
}

_servematrix_slurm_start() {
  local dir=$1 conf=$1/slurm.conf started

  if [ "$(id -u)" -ne 0 ]; then
    echo "the test Slurm runs its daemons as root; run as root"
    return 1
  fi
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    echo "slurm: installing slurm-wlm munge"
    apt-get update -qq || return 1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null || return 1
  fi

  export SLURM_CONF=$conf
  # sinfo retries for seconds when no controller answers: ask only when ours is alive.
  if [ -f "$conf" ] && _servematrix_slurm_alive "$dir" && _servematrix_slurm_usable; then
    echo "slurm: reusing the running controller ($conf)"
    return 0
  fi
  _servematrix_slurm_stop "$dir"
  started=$(date +%s%N)

  # munge: the package creates the key; a minimal image may not have run its postinst.
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile /etc/munge/munge.key || return 1
    chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge && chown munge:munge /run/munge
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged || return 1
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  fi

  mkdir -p "$dir/state" "$dir/spool"
  cat >"$conf" <<EOF
# Written by ci/services/slurm.sh: one node, everything as root, no accounting.
ClusterName=servematrix
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=localhost CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF

  # -N: the machine's hostname is not "localhost".
  slurmctld -f "$conf" || return 1
  slurmd -f "$conf" -N localhost || return 1
  for _ in $(seq 300); do
    _servematrix_slurm_usable && break
    sleep 0.1
  done
  if ! _servematrix_slurm_usable; then
    echo "the node is not idle after 30 s (state: $(_servematrix_slurm_state))"
    tail -n 5 "$dir/slurmctld.log" "$dir/slurmd.log" 2>/dev/null
    return 1
  fi
  echo "slurm: node usable $(( ($(date +%s%N) - started) / 1000000 )) ms after start"
}

_servematrix_slurm() {
  local dir=${SERVEMATRIX_SLURM_DIR:-${TMPDIR:-/tmp}/servematrix-slurm} output
  mkdir -p "$dir"
  # The start runs in a subshell so that its failures are caught, never fatal to the sourcing script;
  # the daemons detach, and the exports are made here.
  if output=$(_servematrix_slurm_start "$dir" 2>&1); then
    export SLURM_CONF=$dir/slurm.conf
    unset SERVEMATRIX_SLURM_ERROR
    echo "$output"
    echo "slurm: exported SLURM_CONF=$SLURM_CONF"
  else
    unset SLURM_CONF
    export SERVEMATRIX_SLURM_ERROR="ci/services/slurm.sh: $output"
    echo "slurm: NOT started: $output" >&2
  fi
}

_servematrix_slurm
