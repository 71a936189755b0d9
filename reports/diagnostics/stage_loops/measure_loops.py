"""Time the stage loops of `validator.stage_loop_bench` for the three validation models at 2 and 4
ranks on this host, several launches each, and write them to `measured_loops.json` (model ->
world size -> one entry per launch: weight mode -> {"kind", "measured_s", "reference_s"}), for the
what-if `stage_loop_patch.py`. Thirty-sixth session; nothing else should run meanwhile.

    python reports/diagnostics/stage_loops/measure_loops.py [LAUNCHES]
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MODELS = ("mlp_cpu", "resnet_cpu", "transformer_cpu")


def workload_of(name: str, world_size: int):
    from simulator.model_source import resolve_workload
    from simulator.scenario import load_scenario
    scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{name}.yaml", [f"cluster.gpus_per_node={world_size}"])
    return resolve_workload(scenario.model, scenario.base_dir)


def rank_main(rank: int, name: str, world_size: int):
    import torch
    torch.set_num_threads(1)
    from validator.stage_loop_bench import measure_stage_loops
    return measure_stage_loops(workload_of(name, world_size), "momentum", "cpu")


def main() -> None:
    from validator.launch import LaunchConfig, spawn
    launches = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    out = {}
    for launch in range(launches):
        for name in MODELS:
            for world_size in (2, 4):
                loops = spawn(rank_main, (name, world_size), LaunchConfig(world_size=world_size))[0]
                out.setdefault(name, {}).setdefault(str(world_size), []).append(loops)
                ratios = {mode: sum(e["measured_s"]) / sum(e["reference_s"]) for mode, e in loops.items()}
                print(f"launch {launch} {name} ws{world_size} measured / reference: "
                      + " ".join(f"{mode} {ratio:.3f}" for mode, ratio in ratios.items()), flush=True)
    (Path(__file__).parent / "measured_loops.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
