"""What-ifs on the pipeline model since the fifteenth session (2026-11-24): each variant patches the
model in this process and re-predicts the committed CPU pipeline runs, each from its own profiles
(nothing fitted to the measurements). Prints, per run, the MAPE / worst over its cases, per depth,
with each profile's level removed (`validator.report.calibration_level_summary`), and the
asynchronous-minus-synchronous mean error per profile. Writes nothing. The variants, what each
patches and where it was scored: `VARIANTS.md` beside this script.

Run: python reports/diagnostics/ws4_async_gap/whatif_variants.py VARIANT [RUN,RUN,...]
     RUN: a key of RUNS (default: all); s26_intel to s32_fresh ran on the Intel Xeon host, the rest on AMD EPYC
"""

import copy
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import pandas as pd  # noqa: E402

import simulator.engine as engine  # noqa: E402
import simulator.profile as simulator_profile  # noqa: E402
import simulator.profile_costs as profile_costs  # noqa: E402
import simulator.profile_host as profile_host  # noqa: E402

sys.path.insert(0, str(ROOT / "reports" / "diagnostics" / "burst_jitter"))
from burst_patch import patch_burst_jitter  # noqa: E402

sys.path.insert(0, str(ROOT / "reports" / "diagnostics" / "module_age"))
from module_age_patch import patch_module_age  # noqa: E402

sys.path.insert(0, str(ROOT / "reports" / "diagnostics" / "inflight_probe"))
from message_rule_patch import patch_message_rule  # noqa: E402

sys.path.insert(0, str(ROOT / "reports" / "diagnostics" / "runtime_pass_gap"))
from stash_order_patch import patch_stash_order  # noqa: E402

sys.path.insert(0, str(ROOT / "reports" / "diagnostics" / "busy_neighbour"))
from neighbour_patch import patch_busy_neighbour  # noqa: E402
sys.path.insert(0, str(ROOT / "reports" / "diagnostics" / "stage_loops"))
from stage_loop_patch import patch_stage_loops, patch_without_stage_loops  # noqa: E402

VARIANTS = ("none", "prefix_sets", "before_s22", "alone_passes", "cycle_messages", "pass_fits", "before_s21", "concurrent_passes", "concurrent_runtime", "oversubscribed_rate", "min_rate", "runtime_messages", "runtime_only", "cycle_rate", "cycle_pool", "efficiency_only", "pool_curve", "pool_curve_all", "before_s26", "copy_backward", "copy_backward_probe", "before_s27", "singles", "size_curve", "nnls_passes", "alone_growth", "memory_contention", "before_s28", "copy_age", "before_s29", "copy_age_probe", "copy_growth", "copy_growth_probe", "before_s30", "busy_tails", "step_tail", "rate_step_tail", "burst_jitter", "module_age", "gpipe_cycle_messages", "chain_synchronous", "before_s34", "busy_neighbour", "stage_loops", "stage_loops_all", "before_s36")
STEP_TAIL_FACTOR = 0.6
PASSES_TOGETHER_OVER_ALONE_WS2 = {  # benchmarks/bench_weight_pass_sharing.py --ranks 2, 2026-11-24 (s22), medians
    "mlp": {"stash": 1.56, "predict": 1.56, "repredict": 1.53, "accumulate": 1.43, "average": 1.42,
            "copy_forward": 1.02, "update": 1.28},
    "resnet20": {"stash": 1.01, "predict": 1.00, "repredict": 1.01, "accumulate": 1.02, "average": 1.03,
               "copy_forward": 0.94, "update": 0.99},
    "transformer": {"stash": 1.14, "predict": 1.12, "repredict": 1.14, "accumulate": 1.27, "average": 1.19,
                    "copy_forward": 1.0, "update": 1.0},
}
COPY_BACKWARD_PROBE = {  # validator.weight_pass_bench on one rank, micro-batch 16, Intel Xeon host,
    "mlp": 0.71, "resnet20": 0.99, "transformer": 0.99}  # 2026-11-24 (s27): median copy / module over the sets
COPY_AGE_PROBE_GROWTH = {  # ../copy_age/age_probe.log (s29, one process): the copy factor at ages 0-3 over
    "mlp": (1.0, 1.09, 1.21, 1.24),  # age 0's, the mean of its two rounds
    "resnet20": (1.0, 1.02, 1.03, 1.035), "transformer": (1.0, 1.055, 1.095, 1.115)}
COPY_GROWTH_PROBE = {  # ../copy_age/growth_probe.log (s29, one process, three rounds, means): the copy's growth
    "mlp": (1.0, 1.026, 1.08, 1.09),  # with age over the modules' backward's, ages 0-3
    "resnet20": (1.0, 1.003, 1.015, 1.007), "transformer": (1.0, 1.011, 1.012, 1.009)}
RUN_FOLDERS = {  # each run's folder: its validation_pipelines_cpu.csv and profiles/
    "latest": "reports",
    "second_run": "reports/diagnostics/sync_cycle_messages/second_run",
    "first_run": "reports/diagnostics/sync_cycle_messages/first_run",
    "noisy": "reports/diagnostics/weight_pass_layers",
    "cc_second": "reports/diagnostics/cycle_compute/second_run",
    "cc_first": "reports/diagnostics/cycle_compute/first_run",
    "s18_first": "reports/diagnostics/cycle_steps/first_run",
    "s19_fifth": "reports/diagnostics/exposed_latency/fifth_run",
    "s20_fresh": "reports/diagnostics/runtime_messages/fresh_run",
    "s21_fresh": "reports/diagnostics/oversubscribed_rate/fresh_run",
    "s22_fresh": "reports/diagnostics/concurrent_passes/fresh_run",
    "s22_second": "reports/diagnostics/concurrent_passes/second_run",
    "s23_fresh": "reports/diagnostics/stage_ranges/fresh_run",
    "s26_intel": "reports/diagnostics/calibration_launches/intel_run",
    "s26_fresh": "reports/diagnostics/pool_curve/fresh_run",
    "s27_fresh": "reports/diagnostics/copy_backward/fresh_run",
    "s27_second": "reports/diagnostics/size_curve/fresh_run",
    "s28_fresh": "reports/diagnostics/memory_contention/fresh_run",
    "s28_second": "reports/diagnostics/memory_contention/second_run",
    "s29_fresh": "reports/diagnostics/copy_age/fresh_run",
    "s29_growth": "reports/diagnostics/copy_age/fresh_run_growth",
    "s30_fresh": "reports/diagnostics/cycle_efficiency/fresh_run",
    "s30_second": "reports/diagnostics/cycle_efficiency/second_run",
    "s31_fresh": "reports/diagnostics/confirmation_runs/s31_fresh",
    "s32_fresh": "reports/diagnostics/confirmation_runs/s32_fresh",
    "s33_amd": "reports/diagnostics/confirmation_runs/s33_amd",
    "s33_second": "reports/diagnostics/confirmation_runs/s33_second",
    "s33_third": "reports/diagnostics/confirmation_runs/s33_third",
    "s34_fresh": "reports/diagnostics/runtime_pass_gap/fresh_run",
    "s34_second": "reports/diagnostics/confirmation_runs/s34_second",
    "s35_fresh": "reports/diagnostics/confirmation_runs/s35_fresh",
    "s35_second": "reports/diagnostics/confirmation_runs/s35_second",
    "stage_loops_fresh": "reports/diagnostics/stage_loops/fresh_run",
    "s36_second": "reports/diagnostics/confirmation_runs/s36_second",
}
RUNS = {name: (f"{folder}/validation_pipelines_cpu.csv", f"{folder}/profiles") for name, folder in RUN_FOLDERS.items()}


def _alone_passes(document):
    """The profile document with every weight-pass fit (and the update in cycle) timed with all ranks
    at once replaced by its `alone` timing (rank 0 alone), as calibrations before the
    twenty-second session recorded them."""
    document = copy.deepcopy(document)
    entries = list((document.get("weight_passes") or {}).values())
    in_cycle = (document.get("optimizer") or {}).get("in_cycle")
    if isinstance(in_cycle, dict):
        entries.append(in_cycle)
    for entry in entries:
        alone = entry.pop("alone", None) if isinstance(entry, dict) else None
        if alone:
            entry.update(alone)
    return document


def _prefix_sets(document):
    """The profile document with each pass's timed ranges cut to the singles and prefixes the
    calibration timed before the twenty-third session, in that rule's order, `layer_ranges` dropped."""
    from simulator.weight_pass_layers import calibration_layer_sets

    document = copy.deepcopy(document)
    entries = list((document.get("weight_passes") or {}).values())
    in_cycle = (document.get("optimizer") or {}).get("in_cycle")
    if isinstance(in_cycle, dict):
        entries.append(in_cycle)
    for entry in entries:
        ranges = entry.pop("layer_ranges", None) if isinstance(entry, dict) else None
        if not ranges:
            continue
        params = [0] * (max(last for _, last in ranges) + 1)
        for (first, last), count in zip(ranges, entry["num_params"]):
            if first == last:
                params[first] = count
        weighted = [tuple(layer for layer in range(first, last + 1) if params[layer] > 0) for first, last in ranges]
        keep = [weighted.index(layers) for layers in calibration_layer_sets(params)]
        for key in ("num_params", "medians_s"):
            entry[key] = [entry[key][i] for i in keep]
        if isinstance(entry.get("alone"), dict) and "medians_s" in entry["alone"]:
            entry["alone"]["medians_s"] = [entry["alone"]["medians_s"][i] for i in keep]
    return document


def _patch_singles() -> None:
    """`singles`: each layer's pass and in-cycle update cost is its single-layer set's median, a
    stage's the sum over its layers (the prefixes' growth left out)."""
    import simulator.weight_pass_layers as weight_pass_layers

    original_init = weight_pass_layers.LayerPassCosts.__init__

    def init(self, sets, layer_params):
        original_init(self, sets, layer_params)
        self.growth = {name: ((), ()) for name in self.growth}

    weight_pass_layers.LayerPassCosts.__init__ = init


def _patch_least_squares() -> None:
    """`nnls_passes`: the model before the twenty-seventh session's size curve: per-layer costs
    fitted by non-negative least squares to singles and prefixes together, a stage's the sum."""
    import simulator.weight_pass_layers as weight_pass_layers

    original_init = weight_pass_layers.LayerPassCosts.__init__

    def init(self, sets, layer_params):
        original_init(self, sets, layer_params)
        layer_sets = weight_pass_layers.calibration_layer_sets(layer_params)
        self.least_squares_s = {name: weight_pass_layers.per_layer_costs(layer_sets, medians, len(layer_params))
                                for name, medians in sets.medians_s.items() if len(medians) == len(layer_sets)}

    def over(self, name, layer_start, layer_end, num_params):
        costs = self.least_squares_s.get(name)
        if costs is None or not 0 <= layer_start < layer_end <= len(self.layer_params):
            return None
        if sum(self.layer_params[layer_start:layer_end]) != num_params:
            return None
        return float(costs[layer_start:layer_end].sum())

    weight_pass_layers.LayerPassCosts.__init__ = init
    weight_pass_layers.LayerPassCosts.over = over


def _patch_alone_growth() -> None:
    """`alone_growth` (twenty-eighth session): where a profile kept a pass's sets timed by rank 0
    alone beside those timed by all ranks at once (2-rank profiles since the twenty-second session),
    the prefixes' growth comes from the alone timings; the singles stay as played."""
    import simulator.weight_pass_layers as weight_pass_layers

    original_parse = simulator_profile.parse_pass_sets

    def parse(read, document):
        sets = original_parse(read, document)
        if sets is None:
            return None
        entries = {name: entry for name, entry in (document.get("weight_passes") or {}).items()
                   if isinstance(entry, dict)}
        in_cycle = (document.get("optimizer") or {}).get("in_cycle")
        if isinstance(in_cycle, dict):
            entries[weight_pass_layers.UPDATE] = in_cycle
        alone = {name: tuple(entry["alone"]["medians_s"]) for name, entry in entries.items()
                 if isinstance(entry.get("alone"), dict) and entry["alone"].get("medians_s")
                 and len(entry["alone"]["medians_s"]) == len(sets.medians_s.get(name, ()))}
        object.__setattr__(sets, "alone_medians_s", alone)
        return sets

    original_init = weight_pass_layers.LayerPassCosts.__init__

    def init(self, sets, layer_params):
        original_init(self, sets, layer_params)
        layer_sets = weight_pass_layers.calibration_layer_sets(layer_params)
        for name, medians in getattr(sets, "alone_medians_s", {}).items():
            if name in self.growth and len(medians) == len(layer_sets):
                self.growth[name] = weight_pass_layers._singles_and_growth(layer_sets, medians, self.layer_params)[1]

    simulator_profile.parse_pass_sets = parse
    weight_pass_layers.LayerPassCosts.__init__ = init


def patch(variant: str) -> None:
    original_init = profile_costs.ProfileCosts.__init__
    if variant == "burst_jitter":
        patch_burst_jitter()
    if variant == "module_age":
        patch_module_age()
    if variant == "before_s34":
        patch_stash_order()
    if variant == "busy_neighbour":
        patch_busy_neighbour()
    if variant in ("stage_loops", "stage_loops_all", "before_s36"):
        patch_stage_loops(every_profile=variant == "stage_loops_all")
    if variant == "before_s36":
        patch_without_stage_loops()
    if variant in ("gpipe_cycle_messages", "chain_synchronous"):
        patch_message_rule(variant)
    if variant == "singles":
        _patch_singles()
    if variant == "alone_growth":
        _patch_alone_growth()
    if variant in ("nnls_passes", "before_s27", "before_s26"):
        _patch_least_squares()
    if variant == "prefix_sets":
        original_from_dict = simulator_profile.profile_from_dict
        simulator_profile.profile_from_dict = lambda document, *args, **kwargs: original_from_dict(
            _prefix_sets(document), *args, **kwargs)
    if variant in ("before_s22", "before_s21", "alone_passes"):
        original_from_dict = simulator_profile.profile_from_dict
        simulator_profile.profile_from_dict = lambda document, *args, **kwargs: original_from_dict(
            _alone_passes(document), *args, **kwargs)

    def init(self, profile, workload, **options):
        original_init(self, profile, workload, **options)
        if variant in ("before_s27", "before_s26"):  # the backward on a weight copy as timed through the modules
            self.asynchronous_backward_factor = 1.0
        if variant == "before_s28":  # every update and weight pass at its at-once timing throughout
            self._alone_layer_passes = None
        section = self.copy_backward
        if section is not None and variant in ("before_s29", "copy_age", "copy_age_probe", "copy_growth_probe"):
            # the engine charges `copy_age_factors` by the copy's age (`CopyBackward.at_age`); () plays the age-0 factor
            played = {"before_s29": (), "copy_growth_probe": section.copy_age_factors}.get(variant, section.age_factors)
            growth = {"copy_age_probe": COPY_AGE_PROBE_GROWTH,
                      "copy_growth_probe": COPY_GROWTH_PROBE}.get(variant, {}).get(profile.model_name)
            if not played and growth:  # a profile that did not time the ages: the probes' growth per model
                played = tuple(section.factor * g for g in growth)
            self.copy_backward = dataclasses.replace(section, copy_age_factors=played)
        if variant == "copy_backward_probe":
            self.asynchronous_backward_factor = COPY_BACKWARD_PROBE[profile.model_name]
        if variant == "pass_fits":
            self._layer_passes = None  # every pass and the update in cycle from its fit over num_params
        if variant in ("before_s22", "before_s21", "cycle_messages", "concurrent_passes"):
            self.runtime_messages = None  # the cycle's message figures, as before the twenty-second session
        if variant in ("runtime_messages", "runtime_only") and self.asynchronous_messages is not None \
                and profile.handoff.runtime is not None:
            idle_s = profile.p2p.time_s(profile.handoff.size_bytes)
            self.runtime_messages = profile_host.message_costs(profile.handoff.runtime, idle_s)
        if variant in ("step_tail", "rate_step_tail") and self.asynchronous_messages is not None:
            messages = self.asynchronous_messages
            self.asynchronous_messages = dataclasses.replace(
                messages, ready_receive_tail_s=messages.ready_receive_tail_s * STEP_TAIL_FACTOR)
        if variant in ("concurrent_passes", "concurrent_runtime") and profile.world_size == 2 \
                and set(profile.weight_pass_ranks_at_once.values()) == {1}:  # timed alone (older profiles)
            ratios = PASSES_TOGETHER_OVER_ALONE_WS2[profile.model_name]
            self._weight_pass_scale = {name: ratios[name] for name in self._weight_pass_scale}
            if self.update_timed_in_cycle:
                self._in_cycle_scale = ratios["update"]
        cycle = profile.cycle_compute
        if variant == "before_s30" and self.host_parallelism is not None and cycle is not None:
            self.asynchronous_compute_factor = 1.0 / cycle.efficiency  # with a core per rank too
        if self.host_parallelism is None or cycle is None or not cycle.host_parallelism:
            return
        if variant == "before_s21":  # the model before the twenty-first session: 1 / efficiency everywhere
            self.asynchronous_compute_factor = 1.0 / cycle.efficiency
        elif variant in ("cycle_rate", "rate_step_tail", "runtime_messages"):  # the rounds' rate on every shared host
            self.asynchronous_compute_factor = profile_costs.asynchronous_compute_factor(
                cycle, self.host_parallelism, oversubscribed=True)
        elif variant == "min_rate":
            rounds = min(cycle.host_parallelism, self.host_parallelism)
            self.asynchronous_compute_factor = self.host_parallelism / (rounds * cycle.efficiency)
        elif variant == "before_s26":  # the rounds' rate as a constant factor on asynchronous compute
            self.pool_curve = None
            if profile_host.ranks_outnumber_cores(profile):
                self.asynchronous_compute_factor = self.host_parallelism / (cycle.host_parallelism * cycle.efficiency)
        elif variant == "efficiency_only":  # the twenty-first session's rounds' rate left out everywhere
            self.asynchronous_compute_factor = 1.0 / cycle.efficiency
            self.pool_curve = None
        elif variant == "cycle_pool":
            self.host_parallelism = cycle.host_parallelism

    profile_costs.ProfileCosts.__init__ = init
    if variant == "pool_curve":
        _patch_asynchronous_curve_only()
    if variant != "busy_tails":
        return

    def message_work(self, rank, messages, work_s, tail_s):
        yield from self._rank_work(rank, messages * work_s)
        if tail_s <= 0:
            return
        share = 1.0
        if self.hosts is not None:
            node = self.topology.node_of(self.plan.rank_to_device[rank])
            peers = sum(1 for other in range(self.plan.num_ranks)
                        if self.topology.node_of(self.plan.rank_to_device[other]) == node) - 1
            if peers > 0:
                share = min(1.0, self.hosts.active_threads(node, engine.COMPUTE) / peers)
        if share > 0:
            yield self.env.timeout(messages * tail_s * share)

    engine.Engine._message_work = message_work


def _patch_asynchronous_curve_only() -> None:
    """`pool_curve`: the host's parallelism curve (`simulator.host_sharing.PoolCurve`) for
    asynchronous plans only; synchronous ones on the pool's constant P, as before the session."""
    original_engine_init = engine.Engine.__init__

    def engine_init(self, plan, topology, costs, *args, **kwargs):
        original_engine_init(self, plan, topology, costs, *args, **kwargs)
        if self.hosts is not None and not plan.meta.get("asynchronous"):
            self.hosts.curve = None

    engine.Engine.__init__ = engine_init


def case_errors(name: str, model: str | None = None, world_size: int | None = None) -> pd.DataFrame:
    """Run `name`'s cases (only `model`'s and `world_size`'s, if given) re-predicted with the (patched) model from
    their own profiles: model, world_size, kind, predicted_jitter_s, measured_s, jitter_error_pct."""
    from repredict import cases, error_pct
    from validator.measure import RunOptions
    from validator.validate import predictions

    csv, profiles = RUNS[name]
    frame = pd.read_csv(ROOT / csv)
    rows = []
    if model is not None:
        frame = frame[frame["model"] == model]
    if world_size is not None:
        frame = frame[frame["world_size"] == world_size]
    for scenario, profile, specs, group in cases(frame, True, "", ROOT / profiles):
        figures = predictions(scenario, str(profile), specs, RunOptions(optimizer=scenario.training.optimizer))
        for row in group.itertuples():
            predicted_s = figures[row.strategy]["predicted_jitter_s"]
            rows.append({"model": row.model, "world_size": row.world_size, "kind": row.kind,
                         "predicted_jitter_s": predicted_s, "measured_s": row.measured_s,
                         "jitter_error_pct": error_pct(predicted_s, row)})
    return pd.DataFrame(rows)


def score(name: str, variant: str) -> None:
    from validator.report import calibration_level_summary

    table = case_errors(name)
    errors = table["jitter_error_pct"]
    table["asynchronous"] = table["kind"].str.startswith(("pipedream", "spectrain"))
    by_depth = " ".join(f"ws{ranks} {part.abs().mean():4.1f}/{part.abs().max():4.1f}"
                        for ranks, part in errors.groupby(table["world_size"]))
    print(f"{variant:10s} {name:10s} MAPE {errors.abs().mean():4.1f} worst {errors.abs().max():4.1f} | {by_depth}")
    print(f"    {calibration_level_summary(table)}")
    means = errors.groupby([table["model"], table["world_size"], table["asynchronous"]]).mean().unstack()
    gaps = {f"{model.split('_')[0]}{ranks}": round(value, 1)
            for (model, ranks), value in (means[True] - means[False]).items()}
    print(f"    asynchronous minus synchronous: {gaps}")


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in VARIANTS:
        print(f"usage: whatif_variants.py {{{'|'.join(VARIANTS)}}} [RUN,...]", file=sys.stderr)
        return 2
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else list(RUNS)
    unknown = [name for name in names if name not in RUNS]
    if unknown:
        print(f"RUN: unknown {unknown[0]!r}; one of {', '.join(RUNS)}", file=sys.stderr)
        return 2
    patch(sys.argv[1])
    for name in names:
        score(name, sys.argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
