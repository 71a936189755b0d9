"""What an asynchronous stage's own loop costs over what the model charges for it (the profile's
`stage_loops` section, thirty-sixth session).

The engine charges an asynchronous pipeline's passes from fits timed one pass at a time: the
per-layer forward and backward in the layer sweeps, the weight passes in the calibration's micro-
batch cycle (`validator.weight_pass_bench`). In the runtime (`validator.pipeline_runtime`) a stage
runs its own loop of them back to back, with several micro-batches in flight and the next stage
doing the same at once. On the AMD EPYC host a one-process probe of the MLP's first 2-stage
SpecTrain stage (`reports/diagnostics/busy_neighbour/results.md`) ran its weight passes at
1.05-1.39x the calibration's cycle with the other core idle and 1.10-1.49x beside the other stage's
loop; the validated run measured 1.15-1.46x. Over the committed runs the asynchronous cases of a
profile sat below its synchronous ones in most (the MLP's at 4 stages by 4-21 points).

So the calibration times that loop itself (`validator.stage_loop_bench`): every rank runs its stage
of the steady-state plan of each asynchronous kind (`stage_loop_plan`) through the pipeline runtime
with the messages taken out, all ranks at once; `measured_s` is each rank's median step. In turns
with it, step by step, the same ranks run 1F1B's loop of the same shape (`reference_s`): the
machine's speed moves by 2x between launches on this project's VMs and by tens of percent within
one (the same loop measured 60-220 ms a step over eight launches, 2026-11-28), and a ratio of loops
timed in turns cancels what both meet. The same plans without their messages (`without_messages`)
are played by the engine on the profile as it stands without this section: `modelled_s` and
`modelled_reference_s`, each rank's compute end. Per weight mode (stash: pipedream; predict:
spectrain; newest: delayed_gradient and pipedream without stashing)

    factor = (sum measured / sum reference) / (sum modelled / sum modelled reference),

sums over the ranks: how much more the asynchronous loop costs against the synchronous one than the
model says. The engine multiplies every compute job of an asynchronous plan by its mode's factor
(`ProfileCosts.stage_loops`) where the calibration's ranks each had a core of their own on a shared
CPU host; 1 without the section. Where ranks outnumber cores a loop without messages keeps every
rank computing, which no pipeline with waits does (the probe's factors at 4 ranks on 2 cores went
the other way from the runs' gaps), and no GPU profile has been scored with it: there the section
is recorded, not played. Synchronous plans keep the fits as timed, so
the profile's level stays where the layer sweeps put it.

The factor is relative to the model the calibration ran with: a later change to how asynchronous
compute is charged makes it stale (recompute `modelled_s` and `modelled_reference_s` with
`modelled_loop_s`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from simulator.plan import Compute, Plan, Recv, Send
from simulator.schedules.ir import ASYNCHRONOUS_KINDS

LOOP_KINDS = {"pipedream": "stash", "spectrain": "predict", "delayed_gradient": "newest"}
"""The kind each weight mode's loop is timed with."""
REFERENCE_KIND = "1f1b"
"""The synchronous loop timed in turns with the asynchronous ones."""
LOOP_MICROBATCHES = 4
LOOP_SAMPLES_PER_STAGE = 16
"""The loops' pipeline shape: m = 4 micro-batches of 16 samples per stage each step (the shape of
the CPU pipeline validation benchmark; a micro-batch of 4 p samples)."""
FACTOR_RANGE = (0.5, 2.0)
"""What the loader accepts: outside it the measurement broke (a rank stalled, a clock jumped)."""


@dataclass(frozen=True)
class StageLoop:
    measured_s: tuple[float, ...]
    modelled_s: tuple[float, ...]
    factor: float
    reference_s: tuple[float, ...] = ()
    modelled_reference_s: tuple[float, ...] = ()


def loop_mode(plan: Plan) -> str | None:
    """The weight mode of an asynchronous plan (stash | predict | newest), None for a synchronous
    one; the validator's runtime keys its weight handling on it (`validator.pipeline_plan.weight_mode`)."""
    if plan.strategy not in ASYNCHRONOUS_KINDS:
        return None
    if plan.strategy == "spectrain":
        return "predict"
    if plan.strategy == "pipedream" and plan.meta.get("weight_stashing", True):
        return "stash"
    return "newest"


def stage_loop_scenario(world_size: int, kind: str, device_kind: str = "cpu"):
    """The scenario of the loop of `kind` over `world_size` stages on one host. Its model entry is a
    placeholder: the plan is compiled for the calibrated workload (`stage_loop_plan`)."""
    from simulator.compare import with_strategy
    from simulator.scenario import scenario_from_dict

    scenario = scenario_from_dict({
        "name": f"stage_loop_{kind}",
        "cluster": {"num_nodes": 1, "gpus_per_node": world_size, "gpu": "cpu" if device_kind == "cpu" else "H100-SXM",
                    "intra_node_link": "loopback", "inter_node_link": "loopback"},
        "model": {"name": "mlp", "params": {}},
        "strategy": {"kind": kind, "num_groups": 1, "num_microbatches": LOOP_MICROBATCHES},
        "training": {"global_batch_size": LOOP_SAMPLES_PER_STAGE * world_size, "optimizer": "momentum"},
    }, origin=f"<stage_loop {kind}>")
    return with_strategy(scenario, f"{kind}:{LOOP_MICROBATCHES}", None)


def stage_loop_plan(workload, world_size: int, kind: str, device_kind: str = "cpu") -> Plan:
    """The steady-state plan (`simulator.schedules.steady_state`) of `kind` for `workload` over
    `world_size` stages, partitioned by the analytic costs: the same for the ranks that time it and
    the engine that models it."""
    from simulator.schedules.steady_state import steady_state_plan
    from simulator.simulate import analytic_costs
    from simulator.topology import build_topology

    scenario = stage_loop_scenario(world_size, kind, device_kind)
    return steady_state_plan(scenario, workload, build_topology(scenario.cluster), analytic_costs(scenario, workload))


def without_messages(plan: Plan) -> Plan:
    """`plan` with its sends and receives taken out (and every dependency on them): each rank runs
    its compute back to back, as the loop the calibration times."""
    actions = []
    for rank_actions in plan.actions:
        dropped = {action.id for action in rank_actions if isinstance(action, (Send, Recv))}
        actions.append(tuple(replace(action, deps=tuple(dep for dep in action.deps if dep not in dropped))
                             for action in rank_actions if not isinstance(action, (Send, Recv))))
    return replace(plan, actions=tuple(actions))


def modelled_loop_s(plan: Plan, costs, device_kind: str = "cpu") -> list[float]:
    """Each rank's compute end when the engine plays `plan` without its messages on `costs`."""
    from simulator.engine import Engine
    from simulator.simulate import engine_costs
    from simulator.topology import build_topology

    stripped = without_messages(plan)
    scenario = stage_loop_scenario(plan.num_ranks, plan.strategy, device_kind)
    spans = Engine(stripped, build_topology(scenario.cluster), engine_costs(stripped, costs)).run().spans
    ends = [0.0] * plan.num_ranks
    for rank, stream, _name, _kind, _start, end, _size, _microbatch in spans:
        if stream == "compute":
            ends[rank] = max(ends[rank], end)
    return ends


def loop_factor(measured_s, reference_s, modelled_s, modelled_reference_s) -> float:
    """(sum measured / sum reference) / (sum modelled / sum modelled reference), sums over the ranks
    (module docstring)."""
    return (sum(measured_s) / sum(reference_s)) / (sum(modelled_s) / sum(modelled_reference_s))


def loop_entry(measured_s, reference_s, modelled_s, modelled_reference_s) -> dict:
    """The section's entry of one weight mode."""
    listed = lambda values: [float(t) for t in values]  # noqa: E731
    return {"measured_s": listed(measured_s), "reference_s": listed(reference_s), "modelled_s": listed(modelled_s),
            "modelled_reference_s": listed(modelled_reference_s),
            "factor": loop_factor(measured_s, reference_s, modelled_s, modelled_reference_s)}


def stage_loops_section(document: Mapping, workload, measured: Mapping[str, Mapping]) -> dict:
    """The `stage_loops` section: each mode's `measured_s` (`validator.stage_loop_bench`) with the
    engine's `modelled_s` for the same loop on the profile `document` (read without the section)."""
    from simulator.profile import profile_from_dict
    from simulator.profile_costs import ProfileCosts

    profile = profile_from_dict({key: value for key, value in document.items() if key != "stage_loops"})
    costs = ProfileCosts(profile, workload, shared_host=profile.device_kind == "cpu")

    def modelled(kind: str) -> list[float]:
        plan = stage_loop_plan(workload, profile.world_size, kind, profile.device_kind)
        return modelled_loop_s(plan, costs, profile.device_kind)

    reference = modelled(REFERENCE_KIND)
    return {mode: {"kind": entry["kind"], **loop_entry(entry["measured_s"], entry["reference_s"],
                                                       modelled(entry["kind"]), reference)}
            for mode, entry in measured.items()}


def parse_stage_loops(read, document: Mapping) -> dict[str, StageLoop]:
    """The optional `stage_loops` section, mode -> `StageLoop` (`read`: the profile's reader, which
    names the field of any error); empty when absent."""
    section = read.mapping(document, "stage_loops", "stage_loops", optional=True)
    loops = {}
    for mode, entry in (section or {}).items():
        field = f"stage_loops.{mode}"
        if mode not in LOOP_KINDS.values():
            raise read.fail(field, f"expected one of {sorted(LOOP_KINDS.values())}, got {mode!r}")
        if not isinstance(entry, Mapping):
            raise read.fail(field, f"expected a mapping, got {entry!r}")
        factor = read.number(entry, "factor", f"{field}.factor", positive=True)
        low, high = FACTOR_RANGE
        if not (math.isfinite(factor) and low <= factor <= high):
            raise read.fail(f"{field}.factor", f"expected a ratio between {low} and {high}, got {factor!r}")
        times = {key: tuple(read.number_list(entry, key, f"{field}.{key}", positive=True, optional=True))
                 for key in ("measured_s", "modelled_s", "reference_s", "modelled_reference_s")}
        loops[mode] = StageLoop(factor=factor, **times)
    return loops


def stage_loop_factor(plan: Plan, loops: Mapping[str, StageLoop]) -> float:
    """What the engine multiplies `plan`'s compute by: its weight mode's factor, 1 for synchronous
    plans and modes the profile did not time."""
    mode = loop_mode(plan)
    return loops[mode].factor if mode in loops else 1.0


__all__ = ["LOOP_KINDS", "REFERENCE_KIND", "StageLoop", "loop_entry", "loop_mode", "modelled_loop_s", "parse_stage_loops",
           "stage_loop_factor", "stage_loop_plan", "stage_loops_section", "without_messages"]
