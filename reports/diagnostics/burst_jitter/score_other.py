"""The `burst_jitter` what-if (`../ws4_async_gap/whatif_variants.py`) on the committed runs that are
not CPU pipeline runs: the DP / MP / GHP CPU run, the H200 runs and the H100 pipeline run, each
re-predicted from its own profiles by `benchmarks/repredict.py` with the patch applied: `new_pct` is
the what-if, `old_pct` the CSV's own predictions. Those are the current model's for the GPU CSVs
(`tests/test_gpu_report.py` reproduces them); `reports/validation_cpu.csv` keeps the predictions it
was run with (the current model re-predicts it at 7.1 / 20.05 %). Writes nothing.

Run: python reports/diagnostics/burst_jitter/score_other.py
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import repredict  # noqa: E402
from burst_patch import patch_burst_jitter  # noqa: E402

RUNS = (("reports/validation_cpu.csv", "reports/profiles"),
        ("reports/validation_cuda.csv", "reports/profiles"),
        ("reports/validation_pipelines_cuda.csv", "reports/profiles"),
        ("reports/gpu/h100_p2/validation_pipelines_h100_ws2_cuda.csv", "reports/gpu/h100_p2"))


def main() -> int:
    patch_burst_jitter()
    for csv, profiles in RUNS:
        print(f"== {csv}", flush=True)
        sys.argv = ["repredict.py", str(ROOT / csv), "--profiles", str(ROOT / profiles)]
        repredict.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
