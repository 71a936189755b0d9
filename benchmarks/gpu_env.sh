# Sourced by the GPU benchmark wrappers (gpu_validation.sh, gpu_pipeline_validation.sh): installs the
# Python packages that travelled as wheels in .whl/ (benchmarks/gpu_wheels.sh fills it; the GPU
# machine reaches no registry), puts the repository on PYTHONPATH and prints the machine
# and a gloo-on-CUDA communication check into $1.
gpu_preamble() {
  local log=$1
  if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
    export PYTHONPATH=/tmp/site
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
    python3 -m validator.comm_device_check
  } 2>&1 | tee "$log"
}
