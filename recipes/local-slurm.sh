#!/usr/bin/env bash
# A real two-node Slurm cluster on this one machine, to try the recipes with sbatch (and to test them in CI).
#
#   bash recipes/local-slurm.sh up       start munged, slurmctld and two slurmd nodes: n1 (127.0.0.2), n2 (127.0.0.3)
#   bash recipes/local-slurm.sh status   what runs, and the `export SLURM_CONF=...` line to use it
#   bash recipes/local-slurm.sh down     stop them (the scratch directory stays: logs, job output)
#
# Then:  export SLURM_CONF=$IBRL_SLURM_DIR/slurm.conf   and   sbatch -N2 recipes/dond/tiny-cluster-cpu.sh
#
# Needs root and Debian's Slurm (`apt-get install --no-install-recommends slurmctld slurmd slurm-client munge`;
# `make slurm` installs them). Everything lives in IBRL_SLURM_DIR (default /tmp/ibrl-slurm): its own munge key
# and socket, slurm.conf, gres.conf, state, spool and logs, so nothing of the system's configuration is touched.
# `up` is idempotent: a cluster that answers is left as it is. No cgroups (proctrack/linuxproc, task/none).
#
# Variables: IBRL_SLURM_DIR; IBRL_SLURM_CPUS (CPUs each node declares, default 16: more than the machine has is
# allowed, SlurmdParameters=config_overrides), IBRL_SLURM_GPUS (fake GPUs per node, default 8, as an 8-GPU node: device files made
# with mknod, so jobs get CUDA_VISIBLE_DEVICES and SLURM_GPUS_ON_NODE as on a GPU cluster), IBRL_SLURM_PORT
# (slurmctld's port, default 6817; the nodes use the next two).
set -euo pipefail

DIR=${IBRL_SLURM_DIR:-/tmp/ibrl-slurm}
CPUS=${IBRL_SLURM_CPUS:-16}
GPUS=${IBRL_SLURM_GPUS:-8}
PORT=${IBRL_SLURM_PORT:-6817}
NODES=(n1 n2)
export SLURM_CONF=$DIR/slurm.conf

die() {
    echo "local-slurm: error: $*" >&2
    exit 2
}

log() {
    echo "[local-slurm] $*"
}

check() {
    ((EUID == 0)) || die "must run as root (slurmd starts job steps as the submitting user; munged runs with --force)"
    local missing=() tool
    for tool in munged mungekey slurmctld slurmd sbatch scontrol sinfo; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    ((${#missing[@]} == 0)) || die "missing ${missing[*]}: apt-get install --no-install-recommends slurmctld slurmd" \
        "slurm-client munge (or: make slurm)"
}

answering() {  # the controller answers and every node is up (idle, mixed or allocated)
    [[ -f "$SLURM_CONF" ]] || return 1
    local states
    states=$(sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
    local node
    for node in "${NODES[@]}"; do
        grep -Eq "^$node (idle|mixed|allocated|completing)" <<<"$states" || return 1
    done
}

write_config() {
    local host
    host=$(hostname -s)
    mkdir -p "$DIR"/{munge,state,log,dev,run} "${NODES[@]/#/$DIR/spool/}"
    chmod 755 "$DIR/munge"
    local gres_lines="" node i
    for node in "${NODES[@]}"; do
        for ((i = 0; i < GPUS; i++)); do
            [[ -e "$DIR/dev/$node-nvidia$i" ]] || mknod "$DIR/dev/$node-nvidia$i" c 1 3  # like /dev/null
            gres_lines+="NodeName=$node Name=gpu File=$DIR/dev/$node-nvidia$i"$'\n'
        done
    done
    # No cgroups here (proctrack/linuxproc): a job's processes that were re-parented to init (vLLM's engine cores
    # when their actor died, Ray's daemons) would outlive it. As a cgroup would, the epilog kills whatever still
    # carries the job's id in its environment, on every node at the job's end (a requeue included). The two nodes'
    # epilogs run at once on this one machine: each spares the other (Slurm marks them SLURM_SCRIPT_CONTEXT).
    cat >"$DIR/epilog.sh" <<'EPILOG'
#!/bin/bash
[[ -n ${SLURM_JOB_ID:-} ]] || exit 0
for environ in /proc/[0-9]*/environ; do
    pid=${environ#/proc/}
    pid=${pid%/environ}
    [[ $pid == "$$" ]] && continue
    env=$'\n'$(tr '\0' '\n' <"$environ" 2>/dev/null)$'\n' || continue
    [[ $env == *$'\n'"SLURM_JOB_ID=$SLURM_JOB_ID"$'\n'* ]] || continue
    # not the other node's epilog (both slurmds run on this machine, one epilog each) nor its children
    [[ $env == *$'\n'SLURM_SCRIPT_CONTEXT=* ]] && continue
    kill -9 "$pid" 2>/dev/null
done
exit 0
EPILOG
    chmod 755 "$DIR/epilog.sh"
    {
        echo "AutoDetect=off"
        printf '%s' "$gres_lines"
    } >"$DIR/gres.conf"
    cat >"$SLURM_CONF" <<EOF
# written by recipes/local-slurm.sh: two nodes on one machine ($host): n1 at 127.0.0.2, n2 at 127.0.0.3 (loopback:
# each Ray node gets an address of its own; Ray would replace 127.0.0.1 by the machine's public address)
ClusterName=ibrl-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket.2
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
ReturnToService=2
SlurmdTimeout=30
MinJobAge=300
JobRequeue=1
MpiDefault=none
Epilog=$DIR/epilog.sh
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.2 Port=$((PORT + 1)) CPUs=$CPUS Gres=gpu:$GPUS State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.3 Port=$((PORT + 2)) CPUs=$CPUS Gres=gpu:$GPUS State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
EOF
    # gres.conf is read from beside slurm.conf
}

start_munge() {
    if [[ -S "$DIR/munge/munge.socket.2" ]] && munge -n -S "$DIR/munge/munge.socket.2" >/dev/null 2>&1; then
        return 0
    fi
    [[ -f "$DIR/munge/munge.key" ]] || mungekey --create --keyfile="$DIR/munge/munge.key" >/dev/null
    chmod 600 "$DIR/munge/munge.key"
    munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket.2" \
        --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" ||
        die "munged did not start (see $DIR/log/munged.log)"
}

up() {
    check
    if answering; then
        log "already up: $(sinfo -h -o '%D nodes %t' | tr '\n' ' ')(SLURM_CONF=$SLURM_CONF)"
        return 0
    fi
    down quiet
    write_config
    start_munge
    slurmctld -f "$SLURM_CONF" || die "slurmctld did not start (see $DIR/log/slurmctld.log)"
    local node
    for node in "${NODES[@]}"; do
        slurmd -f "$SLURM_CONF" -N "$node" || die "slurmd -N $node did not start (see $DIR/log/slurmd-$node.log)"
    done
    local start=$SECONDS
    until answering; do
        ((SECONDS - start < 60)) || die "the nodes did not come up in 60 s: $(sinfo -h -N -o '%N %T' 2>&1 | tr '\n' ' ')" \
            "(logs in $DIR/log)"
        sleep 1
    done
    log "up in $((SECONDS - start)) s: nodes ${NODES[*]}, $CPUS CPUs and $GPUS GPUs each"
    log "use it with: export SLURM_CONF=$SLURM_CONF"
}

down() {
    local pidfile pid jobs
    # jobs first: stopping slurmd under a running job would leave the job's processes behind (no epilog)
    if [[ -f "$SLURM_CONF" ]] && jobs=$(squeue -h -o %i 2>/dev/null) && [[ -n $jobs ]]; then
        # shellcheck disable=SC2086
        scancel --full $jobs 2>/dev/null || true
        for _ in $(seq 60); do [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break; sleep 1; done
    fi
    for pidfile in "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid" "$DIR/run/munged.pid"; do
        [[ -f "$pidfile" ]] || continue
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$pidfile"
    done
    [[ "${1:-}" == quiet ]] || log "down (logs and job output stay in $DIR)"
}

status() {
    if answering; then
        sinfo -N -o '%N %T %C %G'
        echo "export SLURM_CONF=$SLURM_CONF"
    else
        log "not up (bash recipes/local-slurm.sh up)"
        return 1
    fi
}

case "${1:-}" in
up) up ;;
down) down ;;
status) status ;;
*)
    echo "usage: bash recipes/local-slurm.sh up|down|status" >&2
    exit 2
    ;;
esac
