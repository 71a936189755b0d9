#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with the wheels the GPU machine lacks, for its Python 3.12: the device
# machine reaches no registry, so they travel with the working tree (run's carry: [".whl"]) and
# benchmarks/gpu_env.sh installs them into /tmp/site. Torch and numpy are the machine's own; matplotlib
# is left out (about 25 MB with its dependencies, and validating writes no plot).
#
#   bash benchmarks/gpu_wheels.sh          # about 20 MB; the working tree that travels is limited to 64 MiB
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d .whl simpy networkx pydantic pyyaml rich jinja2
python3 -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 -d .whl \
  "pandas==$(python3 -c 'import pandas; print(pandas.__version__)')" python-dateutil tzdata
du -sh .whl
