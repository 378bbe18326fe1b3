# Shared pieces of the cluster recipes; sourced by them, not run on its own.
#
# Environment (all optional):
#   QGPU_SCHEDULER_FILE   scheduler file shared by scheduler, workers, clients
#                         (default ./scheduler.json)
#   QGPU_LOG_DIR          where each process writes its log (default ./qgpu-logs)
#   QGPU_SCHEDULER_ARGS   extra words for `dask scheduler` (e.g. "--port 0")
#   QGPU_PYTHON           the Python that has distributed, used to wait for
#                         workers (default: python)
#   QGPU_WAIT_S           seconds to wait for the scheduler / workers (default 120)

SCHEDULER_FILE="${QGPU_SCHEDULER_FILE:-./scheduler.json}"
LOG_DIR="${QGPU_LOG_DIR:-./qgpu-logs}"
PYTHON="${QGPU_PYTHON:-python}"
WAIT_S="${QGPU_WAIT_S:-120}"
HOST="$(hostname)"
PIDS=()
SCHEDULER_PID=""

# Stop what this script started: the workers first, so they close while the
# scheduler can still hear them, then the scheduler. SIGTERM lets dask shut
# down cleanly; SIGKILL whatever is left after 20 s.
stop_all() {
    local code=$?
    trap - INT TERM EXIT
    local pid workers=()
    for pid in "${PIDS[@]}"; do
        [[ "$pid" == "$SCHEDULER_PID" ]] || workers+=("$pid")
    done
    for pid in "${workers[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait_gone 20 "${workers[@]}"
    if [[ -n "$SCHEDULER_PID" ]]; then
        kill -TERM "$SCHEDULER_PID" 2>/dev/null || true
        wait_gone 10 "$SCHEDULER_PID"
    fi
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    (( ${#PIDS[@]} == 0 )) || echo "stopped (logs in $LOG_DIR)" >&2
    exit "$code"
}

# wait_gone SECONDS PID...: until none of the PIDs runs, or SECONDS pass.
wait_gone() {
    local limit=$(( $1 * 4 )) t pid alive
    shift
    for (( t = 0; t < limit; t++ )); do
        alive=0
        for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        (( alive )) || return 0
        sleep 0.25
    done
}

trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
trap stop_all EXIT

need() {
    command -v "$1" >/dev/null 2>&1 || { echo "error: '$1' not found on PATH; $2" >&2; exit 1; }
}

# start NAME CMD...: run CMD in the background, output to $LOG_DIR/$HOST-NAME.log.
# It runs in its own session (setsid), so a Ctrl-C in the terminal reaches
# only this script, which then stops the processes in order (stop_all).
start() {
    local name="$1"; shift
    mkdir -p "$LOG_DIR"
    if command -v setsid >/dev/null 2>&1; then
        setsid "$@" >"$LOG_DIR/$HOST-$name.log" 2>&1 </dev/null &
    else
        "$@" >"$LOG_DIR/$HOST-$name.log" 2>&1 </dev/null &
    fi
    PIDS+=($!)
    echo "started $name (pid $!): $*" >&2
}

# wait_for_file PID: until the scheduler file exists; fail if PID (when given) dies first.
wait_for_file() {
    local pid="${1:-}" t=0
    until [[ -s "$SCHEDULER_FILE" ]]; do
        if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
            echo "error: scheduler exited; see $LOG_DIR/$HOST-scheduler.log" >&2; exit 1
        fi
        (( t++ < WAIT_S * 2 )) || { echo "error: no $SCHEDULER_FILE after ${WAIT_S}s" >&2; exit 1; }
        sleep 0.5
    done
}

# start_scheduler [OPTS...]: a fresh scheduler writing $SCHEDULER_FILE (a stale file is removed first),
# with OPTS, then $QGPU_SCHEDULER_ARGS (whose options win).
start_scheduler() {
    mkdir -p "$(dirname "$SCHEDULER_FILE")"
    rm -f "$SCHEDULER_FILE"
    # shellcheck disable=SC2086  # QGPU_SCHEDULER_ARGS is meant to split into words
    start scheduler dask scheduler --scheduler-file "$SCHEDULER_FILE" "$@" ${QGPU_SCHEDULER_ARGS:-}
    SCHEDULER_PID="${PIDS[-1]}"
    wait_for_file "$SCHEDULER_PID"
}

# wait_for_workers N: until N workers have registered with the scheduler.
wait_for_workers() {
    "$PYTHON" - "$SCHEDULER_FILE" "$1" "$WAIT_S" <<'EOF'
import sys
from distributed import Client
path, n, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with Client(scheduler_file=path, timeout=timeout) as client:
    client.wait_for_workers(n, timeout=timeout)
    print(f"{len(client.nthreads())} workers connected to {client.scheduler.address}")
EOF
}

print_connect() {
    local path
    path="$(realpath "$SCHEDULER_FILE")"
    cat <<EOF

Cluster up. Connect from Python:
    import qgpu_dask as qd
    svc = qd.Service.connect(scheduler_file="$path")
or plain Dask:  distributed.Client(scheduler_file="$path")
Logs: $LOG_DIR    Stop: Ctrl-C (stops everything this script started)
EOF
}

# hold: keep running until Ctrl-C or until any started process exits.
hold() {
    local code=0
    wait -n || code=$?
    echo "a cluster process exited (status $code); stopping the rest; see $LOG_DIR" >&2
    exit 1
}
