#!/usr/bin/env bash
# The GPU checks in one call (about 7 minutes on an H200), each part under its own timeout and
# its results written as it goes, into $OUT (default: build/gpu):
#   1. parity.json: segpipe against SAM 2's predictor on CUDA, bit for bit (gpu_parity.py):
#      bfloat16 and float32, chunks 4 and 16, --keep masks, a kill -9 then resume;
#   2. runs_tiny.json, runs_large.json: `segpipe run --keep masks` (and --keep all for tiny)
#      beside the predictor with its frame loading, 300 frames at 1024 (bench_gpu.py);
#   3. host.txt: the host accounting (bench_host.py) on the device, tiny, small.
# On the GPU machine, from the project root:
#   source .gpu/setup.sh && bash benchmarks/gpu_check.sh
# Anywhere else, small: DEVICE=cpu SIZE=128 FRAMES=12 RUN_FRAMES=8 bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu}
DEVICE=${DEVICE:-cuda}
SIZE=${SIZE:-1024}
FRAMES=${FRAMES:-41}
RUN_FRAMES=${RUN_FRAMES:-300}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
LOG=gpu_check.log
source benchmarks/gpu_parts.sh

$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')" | tee -a "$OUT/gpu_check.log"
part parity 170 $PY benchmarks/gpu_parity.py --device "$DEVICE" --size "$SIZE" \
    --frames "$FRAMES" --json "$OUT/parity.json"
part runs_tiny 150 $PY benchmarks/bench_gpu.py --device "$DEVICE" --size "$SIZE" \
    --frames "$RUN_FRAMES" --models sam2.1_hiera_t --runs-only --runs masks,all \
    --json "$OUT/runs_tiny.json"
part runs_large 170 $PY benchmarks/bench_gpu.py --device "$DEVICE" --size "$SIZE" \
    --frames "$RUN_FRAMES" --models sam2.1_hiera_l --runs-only --runs masks \
    --json "$OUT/runs_large.json"
part host 70 $PY benchmarks/bench_host.py --device "$DEVICE" --size "$SIZE" --frames 8,24 \
    --chunk-size 8 --sides masks,official
log "done"
