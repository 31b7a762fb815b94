# Shared by the Slurm recipes (recipes/<domain>/<model>.sh): sourced, never run by itself.
#
# A recipe sources recipes/prologue.sh (RECIPE, MARTI_IBRL, RAY, PYTHON) and this file, checks its variables with
# ibrl_require, fills TRAIN_FLAGS (what `marti-ibrl train` gets) and calls ibrl_main "$@". Its allocation is written
# once, in its #SBATCH header (--nodes, --gres=gpu:N or --gpus-per-node): this file reads it (IBRL_NODES,
# IBRL_GPUS_PER_NODE); in a job, Slurm's variables (what `sbatch -N 2 --gres=gpu:4 RECIPE` asked for) win.
#
#   sbatch RECIPE.sh [--section.key VALUE ...]   preflight `marti-ibrl plan --strict` (fails before anything
#                                                starts when the job does not fit), Ray head on the first node and
#                                                a worker on every other node (srun), wait until Ray has every GPU
#                                                of the allocation, then `ray job submit -- marti-ibrl train
#                                                TRAIN_FLAGS --ray.address auto`; the job's exit code is train's.
#                                                Each Ray node is named after its Slurm node (--node-name) and
#                                                listens on the address Slurm has for it (NodeAddr).
#                                                Preemption and the time limit: SIGTERM to the batch shell
#                                                (#SBATCH --signal=B:TERM@300) requeues the job (--requeue); a
#                                                requeued job (SLURM_RESTART_COUNT > 0) resumes by itself from its
#                                                RUN_DIR's last committed iteration (--ckpt.load_enable true).
#                                                A lost node ends the job with train's error naming the node.
#   bash RECIPE.sh --plan [flags]                the placement and memory per GPU, anywhere (no GPU, no Ray);
#                                                checkpoint paths that do not exist here are sized by name
#                                                (Qwen3.5-4B/9B) or with --model-config. The header's allocation
#                                                comes first, so --nodes/--gpus-per-node/--gpu-memory given here win.
#   bash RECIPE.sh --print-flags [flags]         TRAIN_FLAGS, one per line (tests/cluster/test_plan.py parses them).
#
# Site settings: partition, account, QoS, constraint, time limit are sbatch options, which override the recipe's
# #SBATCH lines: `sbatch -p gpu -A myproject --qos normal -C a100 -t 2-00:00:00 RECIPE.sh`. Every srun inside the job
# runs in that allocation: nothing more to set.
#
# Containers (off by default): every command the job runs on a node (`ray start` on each, the shared-file-system
# check, the preflight plan, the wait for the cluster, `ray job submit`) runs in the image:
#   IBRL_CONTAINER_IMAGE=IMAGE   pyxis/enroot: srun --container-image=IMAGE --container-mounts=MOUNTS
#                                --container-workdir=IBRL_ROOT
#   IBRL_APPTAINER_IMAGE=F.sif   Apptainer/Singularity: srun ... ${IBRL_APPTAINER:-apptainer} exec --nv --bind MOUNTS
#                                F.sif COMMAND (IBRL_APPTAINER=singularity for Singularity)
# MOUNTS: the repository and RUN_DIR's parent (same paths inside), then IBRL_CONTAINER_MOUNTS (SRC:DST,...: models,
# data, caches). The image holds the environment (marti-ibrl installed, ray and python on PATH, or MARTI_IBRL/RAY/
# PYTHON set to their paths inside it). IBRL_SRUN: the srun to call (default srun).
#
# Before Ray starts, the job checks that the repository and RUN_DIR are the same on every node (a file written
# on the first node is read on each, in the container when one is set): the actors write checkpoint shards and read
# pool snapshots there, so both must be on a file system every node mounts; else one line names the nodes.
#
# Environment (all optional): MARTI_IBRL (the marti-ibrl executable; default: on PATH, else .venv/bin),
# RAY / PYTHON (default: beside MARTI_IBRL), RUN_DIR (default: runs/<job name>-<job id> in the repository),
# GPU_MEMORY_GIB (per GPU; default: in a job, nvidia-smi's answer on the first node, else an error; with --plan,
# 80), RAY_PORT (6379), RAY_DASHBOARD_PORT (8265), RAY_CLIENT_PORT (10001),
# RAY_AGENT_PORT (the head's dashboard agent, 52365; `ray job submit` goes through it), RAY_WORKER_AGENT_PORT (the
# other nodes' agents, default RAY_AGENT_PORT: Ray nodes sharing one machine, as on the local Slurm of
# recipes/local-slurm.sh, need distinct ones, since every agent also listens on 127.0.0.1), RAY_RUNTIME_ENV_AGENT_PORT
# (the head's runtime-env agent, 52366: see below), RAY_WAIT_TIMEOUT (seconds to wait for the cluster, default 600). sbatch passes the submitting shell's environment on (--export=ALL, the
# default): activate the environment where marti-ibrl is installed (pip install -e ".[gpu]") and export the
# variables (model paths, API keys) before sbatch; the Ray processes and the training job inherit them.

RUN_DIR=${RUN_DIR:-$IBRL_ROOT/runs/${SLURM_JOB_NAME:-$IBRL_NAME}-${SLURM_JOB_ID:-local}}

ibrl_die() {
    echo "$IBRL_NAME: error: $*" >&2
    exit 2
}

ibrl_log() {
    echo "[$IBRL_NAME $(date +%H:%M:%S)] $*"
}

# ibrl_require VAR "what it is": a clear error when a variable the recipe needs is unset.
ibrl_require() {
    [[ -n "${!1:-}" ]] || ibrl_die "set $1 ($2), e.g. $1=/path/to/checkpoint sbatch $RECIPE"
}

# ibrl_abspath PATH: absolute (the training job does not run in the submit directory).
ibrl_abspath() {
    if [[ "$1" = /* ]]; then echo "$1"; else echo "${SLURM_SUBMIT_DIR:-$PWD}/$1"; fi
}

# ibrl_sbatch_header: IBRL_NODES and IBRL_GPUS_PER_NODE from RECIPE's #SBATCH lines, the one place they are written
# (read where they are needed: --plan, and a job whose Slurm variables do not say).
ibrl_sbatch_header() {
    local sbatch='^#SBATCH[[:space:]]\{1,\}'
    IBRL_NODES=$(sed -n "s/${sbatch}--nodes[= ]\([0-9]\{1,\}\)[[:space:]]*\(#.*\)\{0,1\}$/\1/p" "$RECIPE" | head -n 1)
    IBRL_GPUS_PER_NODE=$(sed -n -e "s/${sbatch}--gres[= ]gpu:\([A-Za-z0-9_.-]*:\)\{0,1\}\([0-9]\{1,\}\).*/\2/p" \
        -e "s/${sbatch}--gpus-per-node[= ]\([A-Za-z0-9_.-]*:\)\{0,1\}\([0-9]\{1,\}\).*/\2/p" "$RECIPE" | head -n 1)
    [[ -n $IBRL_NODES ]] || ibrl_die "$RECIPE has no '#SBATCH --nodes=N' line (the recipe's allocation)"
    [[ -n $IBRL_GPUS_PER_NODE ]] || ibrl_die "$RECIPE has no '#SBATCH --gres=gpu:N' (or --gpus-per-node=N) line"
}

# ibrl_srun [srun options] -- COMMAND...: srun, in the container when one is set (header: Containers).
ibrl_srun() {
    local opts=() mounts
    while (($#)) && [[ $1 != -- ]]; do opts+=("$1") && shift; done
    shift
    mounts="$IBRL_ROOT:$IBRL_ROOT,$(dirname "$RUN_DIR"):$(dirname "$RUN_DIR")${IBRL_CONTAINER_MOUNTS:+,$IBRL_CONTAINER_MOUNTS}"
    if [[ -n ${IBRL_CONTAINER_IMAGE:-} ]]; then
        opts+=(--container-image="$IBRL_CONTAINER_IMAGE" --container-mounts="$mounts" --container-workdir="$IBRL_ROOT")
    elif [[ -n ${IBRL_APPTAINER_IMAGE:-} ]]; then
        set -- "${IBRL_APPTAINER:-apptainer}" exec --nv --bind "$mounts" "$IBRL_APPTAINER_IMAGE" "$@"
    fi
    "${IBRL_SRUN:-srun}" "${opts[@]}" "$@"
}

# ibrl_here COMMAND...: a command of the job script itself (the preflight plan, the wait for the cluster, `ray job
# submit`): in the container on the first node when one is set, as one more step of the job; else (or outside a
# job: --plan) right here.
ibrl_here() {
    if [[ -n ${IBRL_HEAD:-} && -n ${IBRL_CONTAINER_IMAGE:-}${IBRL_APPTAINER_IMAGE:-} ]]; then
        ibrl_srun --overlap --nodes=1 --ntasks=1 -w "$IBRL_HEAD" -- "$@"
    else
        "$@"
    fi
}

# ibrl_check_shared NODES: the repository and RUN_DIR are the same on every node of the job (a file written here is
# read there); else one line naming the nodes that do not see them.
ibrl_check_shared() {
    local mark="$RUN_DIR/.ibrl-shared-${SLURM_JOB_ID:-0}" missing
    mkdir -p "$RUN_DIR" && echo "$SLURM_JOB_ID" >"$mark"
    missing=$(ibrl_srun --overlap --nodes="$1" --ntasks-per-node=1 -- bash -c \
        '[[ -f $1/recipes/slurm-ray.sh && $(cat "$2" 2>/dev/null) == "$3" ]] || hostname' _ \
        "$IBRL_ROOT" "$mark" "$SLURM_JOB_ID" | sort -u | paste -sd ' ')
    rm -f "$mark"
    [[ -z $missing ]] || ibrl_die "not visible on $missing: the repository ($IBRL_ROOT) or RUN_DIR ($RUN_DIR);" \
        "both must be on a file system every node mounts (RUN_DIR=/shared/path sbatch ...)"
}

ibrl_plan() {  # ibrl_plan NODES GPUS_PER_NODE [plan options]: the allocation first, so flags in TRAIN_FLAGS win
    local nodes=$1 gpn=$2 memory
    shift 2
    memory=$(ibrl_gpu_memory) || exit 2
    ibrl_here "$MARTI_IBRL" plan --nodes "$nodes" --gpus-per-node "$gpn" --gpu-memory "$memory" "${TRAIN_FLAGS[@]}" "$@"
}

# ibrl_gpu_memory: GiB per GPU for the plan. GPU_MEMORY_GIB when set. In a job, else, the node's own: the smallest
# GPU of the first node as `nvidia-smi` there reports it (in the container when one is set), and without nvidia-smi
# one line asking for GPU_MEMORY_GIB (a preflight that guessed 80 GiB passed jobs that ran out of memory on 40 GiB
# GPUs). Outside a job (--plan): 80, the GPUs the recipes are written for (--gpu-memory after the recipe wins).
ibrl_gpu_memory() {
    if [[ -n ${GPU_MEMORY_GIB:-} ]]; then
        echo "$GPU_MEMORY_GIB"
    elif [[ -z ${IBRL_HEAD:-} ]]; then
        echo 80
    else
        local mib
        mib=$(ibrl_here nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | sort -n | head -n 1)
        [[ $mib =~ ^[0-9]+$ ]] || ibrl_die "cannot tell the memory of this job's GPUs (no nvidia-smi answer on" \
            "$IBRL_HEAD): set GPU_MEMORY_GIB, GiB per GPU, e.g. GPU_MEMORY_GIB=40 sbatch $RECIPE"
        local tenths=$((mib * 10 / 1024))  # MiB to GiB, rounded down to a tenth: never more than the GPU has
        echo "$((tenths / 10)).$((tenths % 10))"
    fi
}

# ibrl_worker_start RAY_START_COMMAND...: a worker node's `ray start --block`, run in its srun step and started again
# there (twice at most) when it exits with Ray's "The current node timed out during startup": `ray start` gives its
# raylet a fixed 30 s to register with the head (Ray's node.py; no setting), which a busy node can outlast (seen on 2
# shared cores). What the failed try left running (its raylet, daemonized) is ended first: the processes of this
# step, by SLURM_JOB_ID and SLURM_STEP_ID in their environment, but this shell. Any other exit is the node's own.
ibrl_worker_start() {
    local try out rc environ pid env mine
    out=$(mktemp)
    mine=$'\n'"SLURM_JOB_ID=$SLURM_JOB_ID"$'\n'
    for try in 1 2 3; do
        "$@" 2>&1 | tee "$out"
        rc=${PIPESTATUS[0]}
        ((rc != 0 && try < 3)) && grep -q "The current node timed out during startup" "$out" || break
        echo "$(hostname): \`ray start\` timed out registering with the head; starting it again ($((try + 1)) of 3)" >&2
        for environ in /proc/[0-9]*/environ; do
            pid=${environ#/proc/} pid=${pid%/environ}
            [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
            env=$'\n'$( { tr '\0' '\n' <"$environ"; } 2>/dev/null)$'\n' || continue
            [[ $env == *"$mine"* && $env == *$'\n'"SLURM_STEP_ID=$SLURM_STEP_ID"$'\n'* ]] && kill -KILL "$pid" 2>/dev/null
        done
        sleep 2
    done
    rm -f "$out"
    return "$rc"
}

# ibrl_ray_alive: every `ray start` of this job (IBRL_RAY_PIDS, one srun each) still runs; else an error naming it.
IBRL_RAY_PIDS=() IBRL_RAY_HOSTS=()
ibrl_ray_alive() {
    local i
    for i in "${!IBRL_RAY_PIDS[@]}"; do
        kill -0 "${IBRL_RAY_PIDS[$i]}" 2>/dev/null ||
            ibrl_die "\`ray start\` on ${IBRL_RAY_HOSTS[$i]} exited before the cluster was up (its errors above)"
    done
}

# ibrl_wait_for_gpus ADDRESS N: until the Ray cluster at ADDRESS has N GPUs, at most RAY_WAIT_TIMEOUT seconds.
# One Python process connects and polls (a process per poll would import Ray each time, on the cores the nodes
# are starting with); the shell checks meanwhile that every `ray start` is still alive.
ibrl_wait_for_gpus() {
    local address=$1 want=$2 timeout=${RAY_WAIT_TIMEOUT:-600} out poller have start=$SECONDS
    out=$(mktemp)
    ibrl_here "$PYTHON" - "$address" "$want" "$timeout" >"$out" 2>/dev/null <<'PY' &
import sys, time, ray
address, want, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
start, have = time.monotonic(), 0
while time.monotonic() - start < timeout:
    try:
        if not ray.is_initialized():
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        have = int(ray.cluster_resources().get("GPU", 0))
    except Exception:  # the head's raylet is not up yet
        ray.shutdown()
    print(have, flush=True)
    if have >= want:
        break
    time.sleep(1)
PY
    poller=$!
    while kill -0 "$poller" 2>/dev/null; do
        ibrl_ray_alive
        ((SECONDS - start < timeout + 60)) || kill "$poller"  # (stuck in ray.init)
        sleep 1
    done
    wait "$poller" || true
    ibrl_ray_alive  # a `ray start` that exited names itself, not the GPU count
    have=$(tail -n 1 "$out")
    rm -f "$out"
    have=${have:-0}
    if ((have >= want)); then
        ibrl_log "Ray cluster at $address has $have GPUs"
        return 0
    fi
    ibrl_die "the Ray cluster at $address has $have of the $want GPUs after $((SECONDS - start))s" \
        "(RAY_WAIT_TIMEOUT=$timeout): a worker" \
        "node did not join; see this job's output for the \`ray start\` errors of the nodes"
}

# ibrl_node_ip HOST: the IPv4 address Slurm reaches HOST at (its NodeAddr, resolved), for Ray's --node-ip-address.
ibrl_node_ip() {
    local addr
    addr=$(scontrol show node "$1" 2>/dev/null | sed -n 's/^ *NodeAddr=\([^ ]*\).*/\1/p')
    addr=${addr:-$1}
    if [[ ! $addr =~ ^[0-9]+(\.[0-9]+){3}$ ]]; then
        addr=$(getent ahostsv4 "$addr" | awk 'NR == 1 {print $1}')
    fi
    [[ -n $addr ]] || ibrl_die "cannot resolve the address of node $1 (scontrol show node $1: NodeAddr)"
    echo "$addr"
}

# SIGTERM to the batch shell (preemption, or #SBATCH --signal=B:TERM@N before the time limit): requeue the job.
# Nothing is lost but the iteration in progress: the requeued job resumes from the last commit. `scancel JOB` sends
# SIGTERM too, to a job that is no longer RUNNING (COMPLETING), as does Slurm's own preemption-requeue: neither is
# requeued here.
ibrl_on_sigterm() {
    local state
    state=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *JobState=\([A-Z_]*\).*/\1/p')
    if [[ $state != RUNNING ]]; then
        ibrl_log "SIGTERM: job $SLURM_JOB_ID is ${state:-gone} (cancelled, or requeued by Slurm), not requeued here;" \
            "to resume by hand: RUN_DIR=$RUN_DIR sbatch $RECIPE --ckpt.load_enable true"
        exit 143
    fi
    ibrl_log "SIGTERM: requeueing job $SLURM_JOB_ID; it resumes from the last committed iteration in $RUN_DIR"
    scontrol requeue "$SLURM_JOB_ID" || ibrl_log "scontrol requeue failed (a job submitted with --no-requeue, or" \
        "one being requeued already); to resume by hand: RUN_DIR=$RUN_DIR sbatch $RECIPE --ckpt.load_enable true"
    exit 143
}

ibrl_run() {
    [[ -n "${SLURM_JOB_ID:-}" ]] || ibrl_die "not inside a Slurm job: submit with sbatch $RECIPE (or $RECIPE --plan)"
    command -v srun >/dev/null || ibrl_die "srun not found"
    if ((${SLURM_RESTART_COUNT:-0} > 0)); then
        ibrl_log "job $SLURM_JOB_ID restarted (requeue $SLURM_RESTART_COUNT): resuming from $RUN_DIR's last commit"
        TRAIN_FLAGS+=(--ckpt.load_enable true)
    fi
    trap ibrl_on_sigterm TERM
    local nodes=${SLURM_JOB_NUM_NODES:-} gpn=${SLURM_GPUS_ON_NODE:-}
    if [[ -z $nodes || -z $gpn ]]; then  # (a job without GRES: the header says)
        ibrl_sbatch_header
        nodes=${nodes:-$IBRL_NODES} gpn=${gpn:-$IBRL_GPUS_PER_NODE}
    fi
    local port=${RAY_PORT:-6379} dashboard=${RAY_DASHBOARD_PORT:-8265} cpus=${SLURM_CPUS_PER_TASK:-$((gpn * 4))}
    local client=${RAY_CLIENT_PORT:-10001} agent=${RAY_AGENT_PORT:-52365} envagent=${RAY_RUNTIME_ENV_AGENT_PORT:-52366}
    local hosts head head_ip
    mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
    head=${hosts[0]} IBRL_HEAD=${hosts[0]}
    if [[ -n ${IBRL_CONTAINER_IMAGE:-}${IBRL_APPTAINER_IMAGE:-} ]]; then
        ibrl_log "container: ${IBRL_CONTAINER_IMAGE:-${IBRL_APPTAINER_IMAGE} (${IBRL_APPTAINER:-apptainer})}"
    fi
    ibrl_check_shared "$nodes"
    ibrl_log "preflight: marti-ibrl plan --strict for $nodes nodes x $gpn GPUs"
    if ! ibrl_plan "$nodes" "$gpn" --strict; then
        ibrl_log "layouts of this job that fit the allocation (marti-ibrl plan --fit):"
        ibrl_plan "$nodes" "$gpn" --fit || true
        ibrl_die "the job does not fit this allocation (plan above; layouts that do, if any, with the flags to add" \
            "after the recipe); nothing started"
    fi

    head_ip=$(ibrl_node_ip "$head")
    ibrl_log "Ray head on $head ($head_ip:$port), workers on: ${hosts[*]:1}"
    # On a busy node the head's start-up outlasts three of Ray's deadlines. The dashboard (it serves `ray job
    # submit`) gets 60 s to start and its modules 30 s: both 180 s here. And `ray start --head` starts the raylet only
    # once the dashboard is up, while its Ray client server, started before the dashboard, waits 30 s for the raylet
    # to report a self-assigned runtime-env agent port, then exits, and `--block` takes the head down with it (seen
    # with the dashboard at 54-63 s on 2 shared cores): a fixed port (--runtime-env-agent-port) skips that wait.
    RAY_DASHBOARD_STARTUP_TIMEOUT_S=${RAY_DASHBOARD_STARTUP_TIMEOUT_S:-180} \
        RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT=${RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT:-180} \
        ibrl_srun --nodes=1 --ntasks=1 --overlap -w "$head" -- \
        "$RAY" start --head --block --node-ip-address="$head_ip" --node-name="$head" --port="$port" \
        --dashboard-host="$head_ip" --dashboard-port="$dashboard" --ray-client-server-port="$client" \
        --dashboard-agent-listen-port="$agent" --runtime-env-agent-port="$envagent" \
        --num-cpus="$cpus" --num-gpus="$gpn" &
    IBRL_RAY_PIDS+=($!) IBRL_RAY_HOSTS+=("$head")
    # the head is up when its dashboard listens (its raylet starts next). Polled with bash's /dev/tcp: a `ray
    # status` per poll would import Ray each time, on the cores the head is starting with
    local start=$SECONDS
    until { : >"/dev/tcp/$head_ip/$dashboard"; } 2>/dev/null; do
        ibrl_ray_alive
        ((SECONDS - start < ${RAY_WAIT_TIMEOUT:-600})) || ibrl_die "the Ray head on $head did not start (output above)"
        sleep 1
    done
    local host
    for host in "${hosts[@]:1}"; do
        ibrl_srun --nodes=1 --ntasks=1 --overlap -w "$host" -- \
            bash -c "$(declare -f ibrl_worker_start); ibrl_worker_start \"\$@\"" ibrl_worker_start \
            "$RAY" start --block --address="$head_ip:$port" --node-ip-address="$(ibrl_node_ip "$host")" \
            --node-name="$host" --dashboard-agent-listen-port="${RAY_WORKER_AGENT_PORT:-$agent}" \
            --num-cpus="$cpus" --num-gpus="$gpn" &
        IBRL_RAY_PIDS+=($!) IBRL_RAY_HOSTS+=("$host")
    done
    ibrl_wait_for_gpus "$head_ip:$port" $((nodes * gpn))

    ibrl_log "submitting: marti-ibrl train ${TRAIN_FLAGS[*]} --ray.address auto"
    local rc submit tries=0 said="$RUN_DIR/.ray-submit-${SLURM_JOB_ID}.log"
    # A head that is up may not have registered its job agent yet: Ray refuses the submission with "No available
    # agent to submit job, please try again later" (seen on 2 loaded cores) and no job was made, so the same
    # submission id is tried again, every 5 s for a minute. Any other failure is the training job's own exit.
    while :; do
        rc=0  # (in the background: bash runs the SIGTERM trap only between commands, or in `wait`)
        ibrl_here "$RAY" job submit --address="http://$head_ip:$dashboard" \
            --submission-id="ibrl-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}" -- \
            "$MARTI_IBRL" train "${TRAIN_FLAGS[@]}" --ray.address auto > >(tee "$said") 2>&1 &
        submit=$!
        wait "$submit" || rc=$?
        ((rc != 0)) && sleep 1  # tee's last lines
        ((rc != 0 && tries++ < 12)) && grep -q "No available agent to submit job" "$said" || break
        ibrl_log "the head's job agent is not up yet; submitting again in 5 s ($tries of 12)"
        sleep 5
    done
    rm -f "$said"
    ibrl_log "training job ended (exit $rc); run directory: $RUN_DIR"
    exit "$rc"
}

ibrl_main() {
    local mode=run
    case "${1:-}" in
    --plan) mode=plan && shift ;;
    --print-flags) mode=print && shift ;;
    esac
    TRAIN_FLAGS+=("$@")
    case $mode in
    print) printf '%s\n' "${TRAIN_FLAGS[@]}" ;;
    plan) ibrl_sbatch_header && ibrl_plan "$IBRL_NODES" "$IBRL_GPUS_PER_NODE" ;;
    run) ibrl_run ;;
    esac
}
