#!/usr/bin/env bash
# One node without a GPU: a scheduler plus N plain `dask worker` processes
# (default 2) computing with NumPy / Numba.
#
#   cluster/cpu-node.sh [N] [extra `dask worker` options...]
#
# DASK_QGPU__CPU=True keeps the workers on the CPU even where CuPy would find a
# GPU. The cores are split evenly between the workers (threads per worker =
# cores / N), and so is host memory.
# Scheduler file: $QGPU_SCHEDULER_FILE (default ./scheduler.json); logs in
# $QGPU_LOG_DIR (default ./qgpu-logs). Ctrl-C stops everything.
#
# Scheduler, workers and dashboards listen on $QGPU_BIND_HOST, default
# 127.0.0.1: Dask's connections carry no authentication, and anyone who reaches
# a scheduler can run code on its workers. To serve other machines, set it to
# an address of this machine and secure the cluster (cluster/README.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

n=2
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then n="$1"; shift; fi
(( n >= 1 )) || { echo "usage: $0 [N >= 1] [dask worker options...]" >&2; exit 2; }
need dask 'install qgpu-dask into this environment'

cores=$(nproc)
threads=$(( cores / n > 0 ? cores / n : 1 ))
memory_share=$(awk -v n="$n" 'BEGIN { printf "%.4f", 1 / n }')
bind="${QGPU_BIND_HOST:-127.0.0.1}"
start_scheduler --host "$bind" --dashboard-address "$bind:8787"
for (( i = 0; i < n; i++ )); do
    DASK_QGPU__CPU=True start "worker-$i" \
        dask worker --scheduler-file "$SCHEDULER_FILE" --nthreads "$threads" \
        --memory-limit "$memory_share" --name "$HOST-cpu-$i" \
        --host "$bind" --dashboard-address "$bind:0" "$@"
done
wait_for_workers "$n"
print_connect
hold
