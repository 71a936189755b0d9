#!/usr/bin/env bash
# Calibrate and validate on one GPU: bench_validation.py with --device cuda. One GPU holds all the
# ranks, so the backend is gloo (nccl refuses two ranks on one device); point-to-point messages are
# staged through the host (validator/comm_device.py) and the profile's microbenchmarks time that path.
#
#   WORLD_SIZES=2 MODELS=mlp_cpu,resnet_cpu,transformer_cpu LAUNCHES=4 bash benchmarks/gpu_validation.sh
#
# Writes under $OUT (default reports/gpu): the profiles (<model>_ws<N>_cuda.json), the CSV
# validation_cuda_ws<sizes>.csv and the benchmark's log. Python packages missing on the GPU machine
# travel as wheels in .whl/ (bash benchmarks/gpu_wheels.sh; installed into /tmp/site first).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-reports/gpu}
WORLD_SIZES=${WORLD_SIZES:-2}
MODELS=${MODELS:-mlp_cpu,resnet_cpu,transformer_cpu}
LAUNCHES=${LAUNCHES:-4}
STEPS=${STEPS:-20}
LIMIT_S=${LIMIT_S:-540}
mkdir -p "$OUT"
tag=${WORLD_SIZES//,/_}
log="$OUT/bench_cuda_ws$tag.log"
source benchmarks/gpu_env.sh
gpu_preamble "$log" || exit 1
timeout "$LIMIT_S" python3 benchmarks/bench_validation.py --device cuda --backend gloo --world-sizes "$WORLD_SIZES" \
  --models "$MODELS" --launches "$LAUNCHES" --steps "$STEPS" --calibration-attempts 1 \
  --profiles "$OUT" --profile-suffix _cuda --out "$OUT/validation_cuda_ws$tag.csv" 2>&1 | tee -a "$log"
