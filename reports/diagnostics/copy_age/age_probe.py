"""The calibration's copy-age timing (`validator.weight_pass_bench`, `max_copy_age=3`) on each
validation model's 4-stage layer sets, one process, one thread, micro-batch 16: prints the copy
factor at ages 0-3 (`simulator.copy_backward.copy_backward_section`) and each age over age 0, and
(since the session's second candidate) the copy's growth with age over the modules' backward's
(`copy_age_factors` over the age-0 factor). Writes nothing.

    python reports/diagnostics/copy_age/age_probe.py [mlp_cpu,resnet_cpu,transformer_cpu]

Why (twenty-ninth session): the what-if `copy_age_probe` needs each model's growth with the copy's
age on profiles that did not time it (`../ws4_async_gap/whatif_variants.py`).
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from simulator.copy_backward import copy_backward_section  # noqa: E402
from simulator.model_source import resolve_workload  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from validator.calibration_phases import _layer_sets  # noqa: E402
from validator.microbench import load_models_module  # noqa: E402
from validator.weight_pass_bench import time_weight_passes  # noqa: E402


def timed_sets(name: str, max_copy_age: int = 3) -> list[dict]:
    """`validator.weight_pass_bench.time_weight_passes` on `name`'s 4-stage layer sets at micro-batch
    16, ages up to `max_copy_age`, as a 4-rank calibration times them (one process here)."""
    scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{name}.yaml",
                             ["cluster.gpus_per_node=4", "training.optimizer=momentum", "training.global_batch_size=64"])
    workload = resolve_workload(scenario.model, scenario.base_dir)
    models = load_models_module()
    modules = models.build_modules(workload, seed=0)
    batch, _targets = models.make_batch(workload, 16, seed=0)
    return time_weight_passes(modules, _layer_sets(modules), batch, max_copy_age=max_copy_age)


def main() -> None:
    torch.set_num_threads(1)
    names = sys.argv[1] if len(sys.argv) > 1 else "mlp_cpu,resnet_cpu,transformer_cpu"
    for name in names.split(","):
        section = copy_backward_section(timed_sets(name))
        factors = section["age_factors"]
        line = f"{name}: factors {[round(f, 3) for f in factors]}, over age 0 {[round(f / factors[0], 2) for f in factors]}"
        if "copy_age_factors" in section:  # since the second candidate: the copy's growth over the modules'
            line += f", copy growth over the modules' {[round(f / factors[0], 3) for f in section['copy_age_factors']]}"
        print(line)


if __name__ == "__main__":
    main()
