"""What-ifs `stage_loops` and `stage_loops_all` (thirty-sixth session): every committed profile read
with a `stage_loops` section (`simulator.stage_loop`) whose measuring half is the loops timed on
this host by `measure_loops.py` (`measured_loops.json`: per model and world size, the median over
its launches of each rank's figures) and whose model half is played on that profile itself
(`simulator.stage_loop.stage_loops_section`). `stage_loops`: only where each rank had a core of its
own (no `pass_jitter` level below the world size, `simulator.profile_host.ranks_have_own_cores`);
`stage_loops_all`: every profile. The loops were timed on the AMD EPYC host: score the AMD runs.
Patches this process only.
"""

import json
import statistics
from pathlib import Path

import simulator.profile as simulator_profile
from simulator.stage_loop import stage_loops_section

HERE = Path(__file__).resolve().parent
SCENARIOS = {"mlp": "mlp_cpu", "resnet20": "resnet_cpu", "transformer": "transformer_cpu"}


def _median_loops(launches: list[dict]) -> dict:
    """mode -> {"kind", "measured_s", "reference_s"}: each rank's median over the launches."""
    merged = {}
    for mode in launches[0]:
        entries = [launch[mode] for launch in launches if mode in launch]
        merged[mode] = {"kind": entries[0]["kind"],
                        **{key: [statistics.median(values) for values in zip(*(e[key] for e in entries))]
                           for key in ("measured_s", "reference_s")}}
    return merged


def patch_stage_loops(every_profile: bool) -> None:
    from measure_loops import workload_of
    from simulator.profile_host import ranks_have_own_cores

    measured = json.loads((HERE / "measured_loops.json").read_text())
    original = simulator_profile.profile_from_dict
    cache = {}

    def from_dict(document, *args, **kwargs):
        profile = original(document, *args, **kwargs)
        name = SCENARIOS.get(document.get("model", {}).get("name"))
        world = document.get("world_size")
        if document.get("stage_loops") or name is None or str(world) not in measured.get(name, {}):
            return profile
        if not (every_profile or ranks_have_own_cores(profile)):
            return profile
        key = (document.get("created_utc"), name, world)
        if cache.get(key, True) is None:  # being built: the section's model half reads the profile without it
            return profile
        if key not in cache:
            cache[key] = None
            cache[key] = stage_loops_section(document, workload_of(name, world),
                                             _median_loops(measured[name][str(world)]))
        return original({**document, "stage_loops": cache[key]}, *args, **kwargs)

    simulator_profile.profile_from_dict = from_dict


def patch_without_stage_loops() -> None:
    """What-if `before_s36`: every profile read without its `stage_loops` section (the model before it)."""
    original = simulator_profile.profile_from_dict
    simulator_profile.profile_from_dict = lambda document, *args, **kwargs: original(
        {key: value for key, value in document.items() if key != "stage_loops"}, *args, **kwargs)
