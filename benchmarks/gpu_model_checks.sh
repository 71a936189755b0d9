#!/usr/bin/env bash
# The kernel and memory models against one GPU: gpu_memory_check.py (peak memory of small GPT and
# LLaMA training in Megatron's mixed precision, issue 74) first, as it is the shorter, then
# gpu_kernel_check.py (`ghpsim calibrate --kernels` and whole-model single-GPU training steps, issue 72).
#
#   bash benchmarks/gpu_wheels.sh        # on the build host: the packages the GPU machine lacks, into .whl/
#   OUT=reports/gpu/h200_kernels bash benchmarks/gpu_model_checks.sh
#   KERNEL_PROFILE=reports/gpu/h200_kernels/kernel_profile.json bash benchmarks/gpu_model_checks.sh  # no calibration
#   CHECKS=kernel bash benchmarks/gpu_model_checks.sh   # one of the two (default: memory,kernel)
#
# Writes under $OUT: memory_check/{memory.csv,summary.json}, kernel_check/{kernel_profile.json (unless
# KERNEL_PROFILE names one), steps.csv,kernels.csv,summary.json} and checks.log (the machine, then both scripts' console output).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-reports/gpu/h200_kernels}
mkdir -p "$OUT/memory_check" "$OUT/kernel_check"
log="$OUT/checks.log"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
} 2>&1 | tee "$log"
if [[ ",${CHECKS:-memory,kernel}," == *,memory,* ]]; then
  timeout "${MEMORY_LIMIT_S:-150}" python3 benchmarks/gpu_memory_check.py --device cuda --out "$OUT/memory_check" 2>&1 | tee -a "$log"
fi
if [[ ",${CHECKS:-memory,kernel}," == *,kernel,* ]]; then
  timeout "${KERNEL_LIMIT_S:-400}" python3 benchmarks/gpu_kernel_check.py --device cuda --out "$OUT/kernel_check" \
    ${KERNEL_PROFILE:+--profile "$KERNEL_PROFILE"} 2>&1 | tee -a "$log"
fi
