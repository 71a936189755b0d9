#!/usr/bin/env bash
# The pipeline schedules calibrated and validated on one GPU: bench_pipeline_validation.py with
# --device cuda. One GPU holds all the stages, so the backend is gloo (nccl refuses two ranks on one
# device); activations and gradients between stages are staged through the host
# (validator/comm_device.py) and the profile's microbenchmarks time that path.
#
#   STAGES=2,4 MODELS=mlp_cpu,resnet_cpu LAUNCHES=3 bash benchmarks/gpu_pipeline_validation.sh
#   EXTRA_ARGS=--reuse-profiles ...   (validate with the profiles already under $OUT)
#
# First, here: bash benchmarks/gpu_wheels.sh, and carry [".whl"] in the device call.
#
# Time: on an H100 (2026-11-27) one model's 2-stage calibration plus its five cases x 3 launches took
# about 3 minutes, so a 15-minute lease (machine start included) holds the 2-stage half of the three
# models, not both depths; a model cut off after its calibration can finish with --reuse-profiles
# (reports/gpu/h100_p2/README.md). On an H200 (2026-11-28) the 4-stage half of the MLP and ResNet-20
# fit one 550 s call (the transformer, third, was cut off), the transformer's a second of 200 s
# (reports/gpu/h200_p4/README.md).
#
# Writes under $OUT (default reports/gpu): the profiles (<model>_ws<p>_momentum_cuda.json), the CSV
# validation_pipelines_cuda_<models>.csv and the benchmark's log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-reports/gpu}
STAGES=${STAGES:-2,4}
MODELS=${MODELS:-mlp_cpu,resnet_cpu,transformer_cpu}
LAUNCHES=${LAUNCHES:-4}
STEPS=${STEPS:-12}
LIMIT_S=${LIMIT_S:-540}
EXTRA_ARGS=${EXTRA_ARGS:-}
mkdir -p "$OUT"
tag=${MODELS//,/_}
log="$OUT/bench_pipelines_cuda_$tag.log"
source benchmarks/gpu_env.sh
gpu_preamble "$log" || exit 1
timeout "$LIMIT_S" python3 benchmarks/bench_pipeline_validation.py --device cuda --backend gloo --stages "$STAGES" \
  --models "$MODELS" --launches "$LAUNCHES" --steps "$STEPS" --calibration-attempts 1 \
  --profiles "$OUT" --profile-suffix _cuda --out "$OUT/validation_pipelines_cuda_$tag.csv" $EXTRA_ARGS 2>&1 | tee -a "$log"
