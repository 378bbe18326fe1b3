#!/usr/bin/env bash
# N workers sharing one GPU, to exercise multi-GPU code (placement, series
# spread across shards, cross-worker queries) on a single card.
#
#   cluster/shared-gpu.sh N [extra `dask worker` options...]
#
# dask-cuda refuses CUDA_VISIBLE_DEVICES=0,0, so these are N plain
# `dask worker` processes, each started with CUDA_VISIBLE_DEVICES=0 (set
# QGPU_GPU to use another card) and one thread; each gets 1/N of host memory.
# They share the card's memory: size test acquisitions accordingly.
# Scheduler file: $QGPU_SCHEDULER_FILE (default ./scheduler.json); logs in
# $QGPU_LOG_DIR (default ./qgpu-logs). Ctrl-C stops everything.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

n="${1:-}"
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 N [dask worker options...]" >&2; exit 2; }
shift
need dask 'install qgpu-dask into this environment'

memory_share=$(awk -v n="$n" 'BEGIN { printf "%.4f", 1 / n }')
start_scheduler
for (( i = 0; i < n; i++ )); do
    CUDA_VISIBLE_DEVICES="${QGPU_GPU:-0}" start "worker-$i" \
        dask worker --scheduler-file "$SCHEDULER_FILE" --nthreads 1 \
        --memory-limit "$memory_share" --name "$HOST-gpu${QGPU_GPU:-0}-$i" "$@"
done
wait_for_workers "$n"
print_connect
hold
