"""The cost model of a calibration profile (`ProfileCosts`, the `simulator.costs.CostModel`
protocol) for the workload it was calibrated on; the profile itself is read by `simulator.profile`.
Nothing here imports torch."""

from __future__ import annotations

import math

from simulator.cold_start import update_state_share
from simulator.cycle_compute import asynchronous_compute_factor
from simulator.costs import COPY_FORWARD, OPTIMIZER_BYTES_PER_PARAM, WEIGHT_PASS_WORDS
from simulator.errors import ScenarioError
from simulator.host_sharing import PoolCurve
from simulator.plan import OPTIMIZER
from simulator.profile import Profile, load_profile
from simulator.profile_host import (MessageCosts, message_costs, pool_curve, ranks_have_own_cores,
                                    ranks_outnumber_cores, streamed_allreduce_factor, tail_over_median_s)
from simulator.weight_pass_layers import UPDATE, LayerPassCosts, PassSets
from simulator.workload import Workload


def profile_costs(path, workload: Workload, optimizer: str | None = None) -> "ProfileCosts":
    """The cost model of the calibration profile at `path` for `workload` (a CPU profile plays
    its ranks on the host's shared cores); `optimizer`, when given, must be the one profiled."""
    profile = load_profile(path)
    return ProfileCosts(profile, workload, optimizer=optimizer, shared_host=profile.device_kind == "cpu")


class ProfileCosts:
    """The `CostModel` of a calibration profile, for the workload it was calibrated on.

    compute_s = intercept + per_sample x batch of that layer and phase, plus the profile's
    single-pass time of that layer and phase (`simulator.cold_start`; 0 without one), times the
    layer's sweep ratio at that batch size (`simulator.layer_sweep`; 1 without one); optimizer_s =
    intercept + per_param x num_params; weight_pass_s and topk_s from their fits. All of them were
    timed with `profile.world_size` ranks at once (the weight passes of profiles since 2026-11:
    rank 0 alone, `Profile.weight_pass_ranks_at_once`); pass `concurrent_ranks=k` to rescale every
    one by compute_slowdown[k] / compute_slowdown[ranks it was timed with] to k ranks at once. On a shared host
    (`shared_host=True`) they are all rescaled to one rank alone (k = 1), the work the engine plays
    on the host's processor-sharing pool, which adds the sharing back. (Until 2026-11 the update and
    the weight passes were not rescaled, so on a shared host their sharing was counted twice:
    measured inside 4-rank pipelines on 2 cores, an MLP stage's update, stash and accumulate took
    0.42-0.54x the CPU time predicted, about 1 / compute_slowdown[4] = 0.48.) `optimizer`
    (optional) must match the profile's optimizer.
    """

    def __init__(self, profile: Profile, workload: Workload, *, optimizer: str | None = None,
                 concurrent_ranks: int | None = None, shared_host: bool = False):
        self.profile = profile
        self.workload = workload
        self.host_parallelism = None
        self.interference = None
        self.handoff_s = 0.0
        """Added to every point-to-point arrival whose receive is posted on demand (the `handoff`
        section; shared CPU hosts and GPU profiles)."""
        self.handoff_preposted_s = 0.0
        """The same for receives posted one ahead (plans with `meta["receives"] == "preposted"`)."""
        self.send_post_s = 0.0
        """Rank time per message sent by a runtime that posts receives one ahead (the pipeline
        runtime): its `isend` call, on the rank's thread after the pass that made the message."""
        self.ready_receive_s = 0.0
        """That runtime's rank time per message that had arrived before it was waited for (the wait
        and posting the next receive), before the pass that needs it. A message waited for costs
        its handoff instead, which includes both."""
        self.send_post_tail_s = 0.0
        self.ready_receive_tail_s = 0.0
        """The mean over the median of those two (profiles that record the mean; else 0): on a shared
        host the call or the wait sometimes lasts a scheduler slice, the thread waiting for a core
        while the others compute. What adds up along a rank's path is the mean (as for the handoff
        delay); the engine plays the median as the thread's work on the host's cores and the rest
        as a delay that uses no core."""
        self.streamed_allreduce_factor = 1.0
        """An allreduce queued behind another on its rank takes its fit times this (shared hosts)."""
        self.asynchronous_messages: MessageCosts | None = None
        """What a message costs in asynchronous pipelines (`handoff.cycle`), in place of the five
        figures above, and on a shared host in 1F1B and interleaved 1F1B too (`Engine.
        _messages_as_in_cycle`); None: the chain's figures for every plan."""
        self.runtime_messages: MessageCosts | None = None
        """What a message costs asynchronous pipelines on a shared CPU host with a core for each rank:
        the figures timed in the pipeline runtime itself (`handoff.runtime`,
        `validator.runtime_messages_bench`), in place of the cycle's. At 2 ranks on the 2-core host
        the cycle's figures were about twice the runtime's (isend 0.34-0.49 against 0.19-0.28 ms,
        wait on an arrived message 0.86-1.16 against 0.27-0.59 ms: `reports/diagnostics/
        runtime_messages/`). Where ranks outnumber cores the runtime's were 0.6-0.8 of the cycle's, and
        played there they took the ResNet's 4-stage PipeDream from -9.6 to -15.7 % (mean over two
        runs, `reports/diagnostics/ws4_async_gap/whatif_variants.py runtime_only`), so the cycle's
        are kept. None elsewhere, and for profiles without the section (before 2026-11-24).
        Played with the weight passes timed by all ranks at once (`validator.calibration_phases.
        weight_pass_ranks_at_once`): kept after a fresh run, `reports/diagnostics/concurrent_passes/`."""
        self.asynchronous_compute_factor = 1.0
        """Compute work of asynchronous pipelines times this on a shared host whose ranks outnumbered
        its cores: 1 / the profile's `cycle_compute.efficiency` (`simulator.cycle_compute`); 1 without
        the section, and 1 with a core per rank (since the thirtieth session)."""
        self.asynchronous_backward_factor = profile.copy_backward.factor if profile.copy_backward else 1.0
        """The backward of asynchronous pipelines times this: they run it on a weight copy whose
        gradients are written, not added: the profile's `copy_backward.factor`
        (`simulator.copy_backward`), 1 without the section (before the twenty-seventh session).
        Kept after its fresh run: `reports/diagnostics/copy_backward/`."""
        self.copy_backward = profile.copy_backward
        """The whole section, for the factor at a copy's age (`CopyBackward.at_age`); None without it."""
        self.stage_loops = profile.stage_loops if shared_host and ranks_have_own_cores(profile) else {}
        """Per weight mode, the stage's own loop over the model's charge for it: the engine multiplies
        an asynchronous plan's compute by its mode's factor (`simulator.stage_loop`). Played only on a
        shared CPU host where each rank had a core: where ranks outnumber cores a loop without
        messages keeps every rank computing, which no pipeline with waits does, and no GPU profile
        has been scored with it. Empty elsewhere and without the section (profiles before the
        thirty-sixth session)."""
        self.pool_curve: PoolCurve | None = None
        """Where the calibration's ranks outnumbered its host's cores and the cycle's rounds measured
        their own parallelism: the pool's P for compute as a curve of the threads open
        (`simulator.host_sharing.PoolCurve`), for every plan; None elsewhere."""
        if shared_host:
            # Ranks share the host's cores: the engine plays every compute and communication job
            # on a processor-sharing pool of parallelism P = W / slowdown(W) (W ranks computing at
            # once each ran slowdown(W) times slower than alone); compute fits become alone times.
            concurrent_ranks = 1
            world = profile.world_size
            self.host_parallelism = world / self.slowdown(world) if world > 1 else 1.0
            self.interference = profile.overlap
            self.streamed_allreduce_factor = streamed_allreduce_factor(profile)
            if profile.cycle_compute is not None:
                self.asynchronous_compute_factor = asynchronous_compute_factor(profile.cycle_compute,
                                                                               ranks_have_own_cores(profile))
                self.pool_curve = pool_curve(profile, self.host_parallelism)
        if (shared_host or profile.device_kind != "cpu") and profile.handoff is not None and profile.p2p is not None:
            # a GPU's messages are staged through the host (gloo): the same handoff and per-message
            # work on the rank's thread, measured the same way (`validator.handoff_bench`)
            idle_s = profile.p2p.time_s(profile.handoff.size_bytes)
            self.handoff_s = max(0.0, profile.handoff.mean_delay_s - idle_s)
            self.send_post_s = profile.handoff.preposted_send_post_s or 0.0
            self.ready_receive_s = profile.handoff.preposted_ready_receive_s or 0.0
            self.send_post_tail_s = tail_over_median_s(profile.handoff.preposted_send_post_mean_s, self.send_post_s)
            preposted_s = profile.handoff.preposted_mean_delay_s
            # the chain's delay runs from the start of the isend call, which the engine plays before
            # the send (send_post_s + its tail): only the rest comes after the point-to-point time
            self.handoff_preposted_s = (self.handoff_s if preposted_s is None  # older profiles
                                        else max(0.0, preposted_s - idle_s - self.send_post_s - self.send_post_tail_s))
            self.ready_receive_tail_s = tail_over_median_s(profile.handoff.preposted_ready_receive_mean_s,
                                                           self.ready_receive_s)
            if profile.handoff.cycle is not None:
                # all stages cycling at once (asynchronous pipelines): the same three figures, taken
                # where every rank computes and messages at once, instead of along the chain
                self.asynchronous_messages = message_costs(profile.handoff.cycle, idle_s)
            if shared_host and profile.handoff.runtime is not None and not ranks_outnumber_cores(profile):
                self.runtime_messages = message_costs(profile.handoff.runtime, idle_s)
        _check_model(profile, workload)
        if optimizer is not None and optimizer != profile.optimizer_name:
            raise ScenarioError(
                f"{profile.source}: optimizer.name: the profile timed {profile.optimizer_name!r} but the "
                f"scenario trains with {optimizer!r}; recalibrate with optimizer={optimizer!r}")
        self.speed_factor = 1.0
        """Every compute cost (layers, update, weight passes) times this: the machine's speed at run
        time over its calibration's, when a speed anchor measured it (`validator.speed_anchor`)."""
        self.scale = 1.0
        if concurrent_ranks is not None:
            self.scale = self.slowdown(concurrent_ranks) / self.slowdown(profile.world_size)
        ranks_at_once = profile.world_size if concurrent_ranks is None else concurrent_ranks

        def rescaled_from(timed_at: int) -> float:  # a fit timed with `timed_at` ranks at once, to ranks_at_once
            return 1.0 if timed_at == ranks_at_once else self.slowdown(ranks_at_once) / self.slowdown(timed_at)

        self._weight_pass_scale = {name: rescaled_from(timed_at)
                                   for name, timed_at in profile.weight_pass_ranks_at_once.items()}
        self.update_timed_in_cycle = profile.optimizer_in_cycle is not None
        """The update's fit already holds what the rank's other passes cost it (caches, predictors),
        so `simulator.layer_ages` adds no cold-start factor to it."""
        self._in_cycle_scale = (rescaled_from(profile.optimizer_in_cycle_ranks_at_once)
                                if self.update_timed_in_cycle else 1.0)
        self._layer_passes = (LayerPassCosts(profile.pass_sets, [layer.num_params for layer in workload.layers])
                              if profile.pass_sets is not None else None)
        """Per-layer costs of the weight passes and the update in cycle (`simulator.weight_pass_layers`)."""
        self._alone_layer_passes = None
        """The same from the sets timed by rank 0 alone, on a shared host whose calibration timed them
        with all ranks at once too (`memory_contention`); None elsewhere."""
        self.memory_contention_ranks = 1
        """How many ranks ran those at-once timings (`simulator.host_sharing.HostPool`'s contention)."""
        if shared_host and profile.pass_sets is not None and profile.pass_sets.alone_medians_s:
            self._alone_layer_passes = LayerPassCosts(PassSets(profile.pass_sets.alone_medians_s),
                                                      [layer.num_params for layer in workload.layers])
            self.memory_contention_ranks = max([profile.weight_pass_ranks_at_once.get(name, 1)
                                                for name in profile.weight_passes]
                                               + [profile.optimizer_in_cycle_ranks_at_once])
        self._forward = [layer.forward for layer in profile.layers]
        self._backward = [layer.backward for layer in profile.layers]
        self.cold_start = profile.cold_start
        self.layer_sweep = profile.layer_sweep
        """A pass inside a sweep over back to back (`simulator.layer_sweep`); None: 1."""
        """Read by the engine, which knows how long each pass's operands sat untouched."""
        self.update_state_share = update_state_share(profile.optimizer_name)
        """The optimizer state's share of an update's bytes (its other operands age apart, `simulator.cold_start`)."""
        self.pass_jitter = profile.pass_jitter
        """Read by `simulator.pass_jitter.jittered_prediction` (the validator's prediction)."""

    def slowdown(self, num_ranks: int) -> float:
        """compute_slowdown[num_ranks] of the profile; ScenarioError naming the levels measured."""
        table = self.profile.compute_slowdown
        if num_ranks not in table:
            raise ScenarioError(
                f"{self.profile.source}: compute_slowdown: no factor for {num_ranks} ranks computing at once; "
                f"measured: {', '.join(str(k) for k in table)}")
        return table[num_ranks]

    def compute_s(self, layer_index: int, phase: str, batch: float) -> float:
        if phase == "F":
            fit = self._forward[layer_index]
        elif phase == "B":
            fit = self._backward[layer_index]
        else:
            raise ValueError(f"unknown phase {phase!r} (expected 'F' or 'B')")
        single_pass_s = self.cold_start.single_pass_s(phase, layer_index) if self.cold_start is not None else 0.0
        sweep = self.layer_sweep.ratio(phase, layer_index, batch) if self.layer_sweep is not None else 1.0
        return self.speed_factor * self.scale * (fit.at(batch) + single_pass_s) * sweep

    def optimizer_s(self, num_params: int, layers: tuple[int, int] | None = None) -> float:
        """One update over `num_params` weights (of layers [start, end) when given: then, where the
        profile kept the in-cycle timings' set medians, the sum of per-layer costs,
        `simulator.weight_pass_layers`). Profiles since 2026-11-23 time it inside a
        micro-batch cycle, rank 0 alone (`optimizer.in_cycle`; `update_timed_in_cycle`), rescaled
        like the weight passes; older ones: the back-to-back fit, to which the engine adds the
        cold-start factor. (Measured on this project's CPU host, one process: a stage's update right
        after its forward and backward took 2.2-2.7x its back-to-back time for ResNet stages and up
        to 2.4x for an MLP stage; the cold-start factor, timed after a pause, gave 1.3-1.6x.)"""
        if num_params <= 0:
            return 0.0
        if self.update_timed_in_cycle:
            per_layer_s = self._per_layer_s(UPDATE, num_params, layers)
            fitted_s = self.profile.optimizer_in_cycle.at(num_params) if per_layer_s is None else per_layer_s
            return self.speed_factor * self._in_cycle_scale * fitted_s
        return self.speed_factor * self.scale * self.profile.optimizer.at(num_params)

    def weight_pass_s(self, name: str, num_params: int, layers: tuple[int, int] | None = None) -> float:
        """A stash / predict / accumulate pass over `num_params` weights (of layers [start, end) when
        given): the profile's `weight_passes` per-layer costs over those layers where it kept the
        sets' medians (`simulator.weight_pass_layers`), else its fit; rescaled from the ranks at once
        it was timed with (rank 0 alone since 2026-11: `validator.calibration_phases`) by
        compute_slowdown. Profiles from before the re-prediction was timed (2026-11-23) cost a
        "repredict" as their "predict" fit, as the model did then (no ratio is assumed: on this
        project's CPU host it took 1.1-1.5x the prediction, and on a GPU it is launch-bound);
        profiles without weight passes: scaled from the update by the fp32 words moved,
        intercept_s + per_param_s x num_params x 4 WEIGHT_PASS_WORDS[name] / OPTIMIZER_BYTES_PER_PARAM."""
        if num_params <= 0:
            return 0.0
        measured_s = self._measured_pass_s(name, num_params, layers)
        if measured_s is not None:
            return measured_s
        if name == "repredict" and "predict" in self.profile.weight_passes:
            return self.weight_pass_s("predict", num_params, layers)
        update = self.profile.optimizer
        update_bytes_per_param = OPTIMIZER_BYTES_PER_PARAM[self.profile.optimizer_name]
        return self.speed_factor * self.scale * (update.intercept_s + update.per_unit_s * num_params * 4
                                                 * WEIGHT_PASS_WORDS[name] / update_bytes_per_param)

    def copy_forward_s(self, num_params: int, layers: tuple[int, int] | None = None) -> float:
        """What a forward over `num_params` weights costs more on a copy of them than through the
        module (asynchronous pipelines, `simulator.costs.COPY_FORWARD`): the profile's fit, rescaled
        as the weight passes; 0 for profiles that did not time it (before 2026-11-23)."""
        if num_params <= 0:
            return 0.0
        return self._measured_pass_s(COPY_FORWARD, num_params, layers) or 0.0

    def _measured_pass_s(self, name: str, num_params: int, layers: tuple[int, int] | None = None) -> float | None:
        """The profile's `weight_passes[name]` at `num_params` (per layer over `layers` where it can,
        else the fit), rescaled from the ranks at once it was timed with; None when the profile has
        no such pass."""
        fit = self.profile.weight_passes.get(name)
        if fit is None:
            return None
        per_layer_s = self._per_layer_s(name, num_params, layers)
        return (self.speed_factor * self._weight_pass_scale.get(name, 1.0)
                * (fit.at(num_params) if per_layer_s is None else per_layer_s))

    def memory_contention(self, phase: str, num_params: int, layers: tuple[int, int] | None) -> float:
        """How much slower the update (`phase` OPTIMIZER) or weight pass `phase` over `layers` runs while
        the host's other ranks run theirs: the cost played (timed with all ranks at once) over the
        same sets timed by rank 0 alone, at least 1; 1 where the profile kept no alone timing or the
        stage has no per-layer costs. The engine plays the alone cost and slows it by this only
        while another rank's update or weight pass runs (`simulator.host_sharing.HostPool`)."""
        if self._alone_layer_passes is None or layers is None or num_params <= 0:
            return 1.0
        name = UPDATE if phase == OPTIMIZER else phase
        alone_s = self._alone_layer_passes.over(name, *layers, num_params)
        if not alone_s:
            return 1.0
        played_s = (self.optimizer_s(num_params, layers) if name == UPDATE
                    else self._measured_pass_s(name, num_params, layers))
        return max(1.0, played_s / (self.speed_factor * alone_s)) if played_s else 1.0

    def _per_layer_s(self, name: str, num_params: int, layers: tuple[int, int] | None) -> float | None:
        """Pass `name` over `layers` from the per-layer costs, unscaled; None without them."""
        if layers is None or self._layer_passes is None:
            return None
        return self._layer_passes.over(name, *layers, num_params)

    def p2p_s(self, size_bytes: float) -> float:
        """One-way point-to-point time of `size_bytes` (alpha + S / beta)."""
        if size_bytes <= 0:
            return 0.0
        if self.profile.p2p is None:
            raise ScenarioError(f"{self.profile.source}: p2p: not profiled (world_size 1); "
                                "recalibrate with world_size >= 2")
        return self.profile.p2p.time_s(size_bytes)

    def _group_fit(self, fits: dict, collective: str, num_ranks: int, missing: str, hint: str, advice: str = ""):
        """The `collective`'s alpha-beta fit for a group of `num_ranks`; ScenarioError naming the
        group sizes profiled (`missing` when there are none) otherwise."""
        fit = fits.get(num_ranks)
        if fit is None:
            sizes = ", ".join(str(g) for g in fits) or missing
            raise ScenarioError(f"{self.profile.source}: {collective}: no fit for a group of {num_ranks} ranks"
                                f"{hint}; profiled group sizes: {sizes}{advice}")
        return fit

    def allreduce_s(self, size_bytes: float, num_ranks: int) -> float:
        """Allreduce of a `size_bytes` buffer among `num_ranks` ranks, from the fit for that group size."""
        if num_ranks <= 1 or size_bytes <= 0:
            return 0.0
        return self._group_fit(self.profile.allreduce, "allreduce", num_ranks, "none", "").time_s(size_bytes)

    def allgather_s(self, size_bytes: float, num_ranks: int) -> float:
        """Allgather among `num_ranks` ranks, each contributing `size_bytes` (alpha + S / beta of the
        fit for that group size); ScenarioError if the profile has none (older profiles)."""
        if num_ranks <= 1 or size_bytes <= 0:
            return 0.0
        fit = self._group_fit(self.profile.allgather, "allgather", num_ranks,
                              "none (calibrated before top-k support)", " (top-k compression needs one)",
                              "; recalibrate with `ghpsim calibrate`")
        return fit.time_s(size_bytes)

    def topk_s(self, num_elements: float, density: float | None = None) -> float:
        """Top-k selection over `num_elements` at `density`, from the profile's fit at that density
        (rescaled like the layer fits); ScenarioError naming the densities profiled if none."""
        if num_elements <= 0:
            return 0.0
        fits = self.profile.topk
        fit = next((f for d, f in fits.items() if density is None or math.isclose(d, density, rel_tol=1e-9)), None)
        if fit is None:
            measured = ", ".join(f"{d:g}" for d in fits) or "none (calibrated before top-k support)"
            raise ScenarioError(
                f"{self.profile.source}: topk: no top-k selection fit at strategy.compression_density "
                f"{density}; profiled densities: {measured}; recalibrate with that density")
        return self.scale * fit.at(num_elements)


def _check_model(profile: Profile, workload: Workload) -> None:
    """Same name, layer count and layer names; same parameter count and forward FLOPs if recorded."""
    names = tuple(layer.name for layer in workload.layers)
    profiled = tuple(layer.name for layer in profile.layers)
    differences = []
    if profile.model_name.lower() != workload.name.lower():
        differences.append("model names differ")
    if profile.num_layers != workload.num_layers:
        differences.append("layer counts differ")
    elif profiled != names:
        differences.append("layer names differ")
    if profile.model_num_params is not None and profile.model_num_params != workload.num_params:
        differences.append(f"{profile.model_num_params} vs {workload.num_params} parameters")
    flops = profile.model_forward_flops_per_sample
    if flops is not None and not math.isclose(flops, workload.forward_flops_per_sample, rel_tol=1e-6):
        differences.append(f"{flops:.6g} vs {workload.forward_flops_per_sample:.6g} forward FLOPs per sample")
    if differences:
        params = f" {dict(profile.model_params)}" if profile.model_params else ""
        raise ScenarioError(
            f"{profile.source}: model: the profile was calibrated for {profile.model_name!r}{params} with "
            f"{profile.num_layers} layers, but the workload is {workload.name!r} with {workload.num_layers} "
            f"layers ({'; '.join(differences)})")
