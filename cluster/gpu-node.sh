#!/usr/bin/env bash
# One GPU node: a scheduler plus one dask-cuda worker per visible GPU.
#
#   cluster/gpu-node.sh [extra `dask cuda worker` options...]
#
# Needs the [cuda] extra (pip install "qgpu-dask[cuda]"): dask-cuda, CuPy.
# CUDA_VISIBLE_DEVICES picks the GPUs (default: all). Spilling device memory
# to host is turned off (--device-memory-limit 0): the service budgets GPU
# memory itself and refuses loads that do not fit. Extra options go to
# `dask cuda worker` (e.g. --nthreads 2, --interface ib0).
# Scheduler file: $QGPU_SCHEDULER_FILE (default ./scheduler.json); logs in
# $QGPU_LOG_DIR (default ./qgpu-logs). Ctrl-C stops everything.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

need dask 'install qgpu-dask into this environment'
dask cuda --help >/dev/null 2>&1 \
    || { echo 'error: `dask cuda` unavailable; pip install "qgpu-dask[cuda]"' >&2; exit 1; }

# How many workers to expect: one per GPU that dask-cuda will see.
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    IFS=, read -ra gpus <<<"$CUDA_VISIBLE_DEVICES"
    n_gpus=${#gpus[@]}
else
    n_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
(( n_gpus > 0 )) || { echo "error: no GPU found (nvidia-smi -L); use cluster/cpu-node.sh" >&2; exit 1; }

start_scheduler
start cuda-workers dask cuda worker --scheduler-file "$SCHEDULER_FILE" \
    --device-memory-limit 0 "$@"
wait_for_workers "$n_gpus"
print_connect
hold
