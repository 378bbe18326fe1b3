#!/usr/bin/env bash
# Several GPU nodes: run this on every node; the first node also runs the
# scheduler, every node runs one dask-cuda worker per visible GPU.
#
#   cluster/multi-node.sh [scheduler|worker] [extra `dask cuda worker` options...]
#
# The role is the first argument, or else found from the environment: the
# node whose hostname is $QGPU_SCHEDULER_HOST, or SLURM node 0
# ($SLURM_NODEID), runs the scheduler. Example under Slurm, one task per node:
#   export QGPU_SCHEDULER_FILE=$HOME/qgpu-$SLURM_JOB_ID.json
#   srun --ntasks-per-node=1 cluster/multi-node.sh
# $QGPU_SCHEDULER_FILE must be on a filesystem all nodes share; use a new
# name per run (as above): a worker node that finds an old file would try
# that old scheduler, and gives up after 120 s (--death-timeout).
# Needs the [cuda] extra (pip install "qgpu-dask[cuda]"). Logs go to
# $QGPU_LOG_DIR/<hostname>-*.log. Ctrl-C (or scancel) stops this node's part.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

role=""
case "${1:-}" in
    scheduler|worker) role="$1"; shift ;;
esac
if [[ -z "$role" ]]; then
    if [[ -n "${QGPU_SCHEDULER_HOST:-}" ]]; then
        [[ "$HOST" == "$QGPU_SCHEDULER_HOST" || "$(hostname -s)" == "$QGPU_SCHEDULER_HOST" ]] \
            && role=scheduler || role=worker
    elif [[ -n "${SLURM_NODEID:-}" ]]; then
        [[ "$SLURM_NODEID" == 0 ]] && role=scheduler || role=worker
    else
        echo "error: say 'scheduler' (first node) or 'worker' (the others)," \
             "or set QGPU_SCHEDULER_HOST" >&2
        exit 2
    fi
fi

need dask 'install qgpu-dask into this environment'
dask cuda --help >/dev/null 2>&1 \
    || { echo 'error: `dask cuda` unavailable; pip install "qgpu-dask[cuda]"' >&2; exit 1; }

if [[ "$role" == scheduler ]]; then
    start_scheduler
else
    echo "waiting for $SCHEDULER_FILE from the scheduler node..." >&2
    wait_for_file
fi
start cuda-workers dask cuda worker --scheduler-file "$SCHEDULER_FILE" \
    --device-memory-limit 0 --death-timeout 120 "$@"
[[ "$role" == scheduler ]] && print_connect
hold
