"""The stash in the runtime's order over the stash as the calibration timed it before, per model.

For each validation model (MLP, narrow ResNet-20, small transformer) at the 2-stage micro-batch,
`validator.weight_pass_bench.time_weight_passes` over the calibration's layer sets, one process,
one thread, alone: per set the stash right after an update (`_stash_cycle`, "stash_s") over the
stash after the cycle's forward and backward through the modules ("stash_after_plain_s"); prints
each model's median ratio over its sets and over three rounds. Writes nothing.

    python reports/diagnostics/runtime_pass_gap/ratio_probe.py

Used for the what-if `stash_order_probe` (`../ws4_async_gap/whatif_variants.py`) on runs whose
profiles were calibrated before the stash was timed in the runtime's order.
"""

import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from simulator.scenario import load_scenario  # noqa: E402
from simulator.model_source import resolve_workload  # noqa: E402
from validator.calibration_phases import _layer_sets  # noqa: E402
from validator.models import build_modules, make_batch  # noqa: E402
from validator.weight_pass_bench import time_weight_passes  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    for name in ("mlp_cpu", "resnet_cpu", "transformer_cpu"):
        scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{name}.yaml",
                                 ["cluster.gpus_per_node=2", "training.optimizer=momentum",
                                  "training.global_batch_size=32"])
        workload = resolve_workload(scenario.model, scenario.base_dir)
        modules = build_modules(workload, seed=0)
        batch, _ = make_batch(workload, 16, seed=0)
        rounds = []
        for _ in range(3):
            entries = time_weight_passes(modules, _layer_sets(modules), batch, repeats=7)
            ratios = [e["stash_s"] / e["stash_after_plain_s"] for e in entries if e["stash_after_plain_s"] > 0]
            rounds.append(statistics.median(ratios))
        print(f"{name:16s} stash after an update / after the modules' passes: median over sets "
              + " ".join(f"{r:.3f}" for r in rounds) + f"  -> {statistics.median(rounds):.3f}", flush=True)


if __name__ == "__main__":
    main()
