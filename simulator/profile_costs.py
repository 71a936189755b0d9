"""The cost model of a calibration profile (`ProfileCosts`, the `simulator.costs.CostModel`
protocol) for the workload it was calibrated on. Nothing here imports torch."""

from __future__ import annotations

import math

from simulator.costs import OPTIMIZER_BYTES_PER_PARAM, WEIGHT_PASS_WORDS
from simulator.errors import ScenarioError
from simulator.profile import KernelProfile, Profile, load_profile
from simulator.workload import Workload

FSDP_COPY_PREFIX = "fsdp_copy"
"""The phases of FSDP2's copy passes (`simulator.strategies.zero`), one beside each collective."""


def profile_costs(path, workload: Workload, optimizer: str | None = None) -> "ProfileCosts":
    """The cost model of the calibration profile at `path` for `workload`; `optimizer`, when
    given, must be the one profiled."""
    profile = load_profile(path)
    if isinstance(profile, KernelProfile):
        raise ScenarioError(f"{path}: kind: a kernel profile (`ghpsim fit`, `calibrate --kernels`) needs the "
                            "scenario's GPU; use it with `ghpsim simulate` or `compare`")
    return ProfileCosts(profile, workload, optimizer=optimizer)


def check_measured_collectives(scenario, path) -> None:
    """ScenarioError unless the scenario's data-parallel collectives are what a calibration profile
    measured: its fits time the backend's own allreduce (gloo's, NCCL's), so a parameter server or a
    chosen ring or tree algorithm would be priced as that allreduce, silently."""
    strategy = scenario.strategy
    if strategy.dp_sync == "parameter_server":
        raise ScenarioError(f"strategy.dp_sync: parameter_server cannot be priced from the calibration profile "
                            f"{path} (it measured the backend's allreduce); simulate it without --profile")
    if strategy.collective != "auto":
        raise ScenarioError(f"strategy.collective: {strategy.collective} cannot be priced from the calibration profile "
                            f"{path} (it measured the backend's own allreduce); drop the setting or the profile")


def check_profiled_cluster(scenario, path) -> None:
    """ScenarioError, naming the scenario's file, for what a calibration profile cannot price: a
    degraded link (its communication fits time the links as they were measured, standing in for the
    flow model, so the link would be priced at full rate) and GPUs named per node (its compute fits
    are one device type's). The profile's compute fits stand for `cluster.gpu` by design."""
    cluster = scenario.cluster
    for field, given in (("degraded_links", cluster.degraded_links), ("node_gpus", cluster.node_gpus)):
        if given:
            raise ScenarioError(f"{scenario.source}: cluster.{field}: cannot be priced from the calibration profile "
                                f"{path} (its fits time the {'links' if field == 'degraded_links' else 'device type'} "
                                "as measured); drop the setting or the profile")


def scenario_profile_costs(path, scenario, workload: Workload):
    """The cost model of any profile for `scenario`: a calibration profile (`ProfileCosts`) or a
    kernel profile from `ghpsim fit` or `ghpsim calibrate --kernels` (the kernel model with its
    parameters, `kernel_profile_parameters`)."""
    from simulator.kernel_costs import KernelCosts
    profile = load_profile(path)
    if not isinstance(profile, KernelProfile):
        check_measured_collectives(scenario, path)
        check_profiled_cluster(scenario, path)
        return ProfileCosts(profile, workload, optimizer=scenario.training.optimizer)
    return KernelCosts.for_scenario(scenario, workload, kernel_profile_parameters(path, scenario, profile))


def kernel_profile_parameters(path, scenario, profile=None, field: str = ""):
    """The kernel model's parameters for `scenario`'s GPU from the kernel profile at `path` (read
    unless `profile` is given): its fitted or measured parameters and measured tables
    (`simulator.kernel_tables.MeasuredTables`) over the catalogue's, for GPUs of the architecture it
    was fitted or measured on (the kernel model's family, or the catalogue's own `architecture`,
    e.g. "cpu"). A ScenarioError (prefixed with `field`, e.g. "costs.kernel_profile: ") otherwise."""
    from dataclasses import replace

    from simulator.kernel_catalogue import gpu_architecture
    from simulator.kernel_costs import device_for
    from simulator.kernel_tables import MeasuredTables
    training, gpu = scenario.training, scenario.cluster.gpu
    try:
        profile = profile or load_profile(path)
    except ScenarioError as error:
        raise ScenarioError(f"{field}{error}") from None
    if not isinstance(profile, KernelProfile):
        raise ScenarioError(f"{field}{path}: a calibration profile (one model at one world size), not a kernel "
                            "profile: give one from `ghpsim fit` or `ghpsim calibrate --kernels`")
    if profile.architecture not in (gpu_architecture(gpu), (gpu.architecture or "").lower()):
        how = "fitted" if profile.measured is None else "measured"
        raise ScenarioError(f"{field}{path}: architecture: {how} on {profile.architecture!r} GPUs, but cluster.gpu "
                            f"{gpu.name!r} is {gpu.architecture or gpu_architecture(gpu)!r}")
    measured = profile.measured and MeasuredTables.from_rows(
        [(row.dtype, row.m, row.n, row.k, row.tile_efficiency) for row in profile.measured.gemm],
        [(row.size_bytes, row.efficiency) for row in profile.measured.memory])
    return replace(device_for(gpu, training.dtype).parameters, **profile.parameters, measured=measured)


class ProfileCosts:
    """Measured costs: compute_s = intercept + per_sample x batch of that layer and pass;
    optimizer_s, weight_pass_s, topk_s from their fits; p2p and collectives from alpha-beta fits
    per group size (these already hold the contention of the machine they were measured on, so
    the engine uses them in place of its flow model: `communication` is this object).

    Every compute fit was timed with `world_size` ranks at once. Where the ranks share a host's
    processors (`shared_processors`), the fits are rescaled to one rank alone and the engine
    plays them on the host's processor pool, which adds the sharing back; elsewhere they are
    rescaled to `concurrent_ranks` ranks at once (default: as calibrated) by
    compute_slowdown[k] / compute_slowdown[world_size].
    """

    def __init__(self, profile: Profile, workload: Workload, *, optimizer: str | None = None,
                 concurrent_ranks: int | None = None):
        self.profile = profile
        self.workload = workload
        self.shared_processors = profile.shared_processors
        self.communication = self
        p2p = profile.p2p
        self.message_overheads_s = (p2p.send_overhead_s, p2p.receive_overhead_s) if p2p is not None else (0.0, 0.0)
        """LogP's o_s and o_r per message, on the sending and receiving rank's thread."""
        _check_model(profile, workload)
        if optimizer is not None and optimizer != profile.optimizer.name:
            raise ScenarioError(
                f"{profile.source}: optimizer.name: the profile timed {profile.optimizer.name!r} but the "
                f"scenario trains with {optimizer!r}; recalibrate with optimizer={optimizer!r}")
        ranks_at_once = 1 if self.shared_processors is not None else (concurrent_ranks or profile.world_size)
        self.scale = self.slowdown(ranks_at_once) / self.slowdown(profile.world_size)

    def slowdown(self, num_ranks: int) -> float:
        """compute_slowdown[num_ranks] of the profile; ScenarioError naming the levels measured."""
        table = self.profile.compute_slowdown
        if num_ranks == 1:
            return table.get(1, 1.0)
        if num_ranks not in table:
            raise ScenarioError(
                f"{self.profile.source}: compute_slowdown: no factor for {num_ranks} ranks computing at once; "
                f"measured: {', '.join(str(k) for k in sorted(table))}")
        return table[num_ranks]

    def compute_s(self, layer_index: int, phase: str, batch: float) -> float:
        layer = self.profile.layers[layer_index]
        if phase == "F":
            return self.scale * layer.forward.at(batch)
        if phase == "B":
            return self.scale * layer.backward.at(batch)
        raise ValueError(f"unknown phase {phase!r} (expected 'F' or 'B')")

    def optimizer_s(self, num_params: int, layers: tuple[int, int] | None = None) -> float:
        return self.scale * self.profile.optimizer.at(num_params) if num_params > 0 else 0.0

    def weight_pass_s(self, name: str, num_params: int, layers: tuple[int, int] | None = None) -> float:
        """The profile's fit for pass `name`; a profile without it scales the update's fit by the
        fp32 words each moves (`WEIGHT_PASS_WORDS`, `OPTIMIZER_BYTES_PER_PARAM`); "repredict"
        without its own fit costs a "predict". FSDP2's copy passes ("fsdp_copy_*") add its host work
        per collective (the profile's `fsdp`), one copy pass going with each collective."""
        if num_params <= 0:
            return 0.0
        host_s = self.profile.fsdp.host_s(layers) if self.profile.fsdp and name.startswith(FSDP_COPY_PREFIX) else 0.0
        return host_s + self._pass_s(name, num_params)

    def _pass_s(self, name: str, num_params: int) -> float:
        fit = self.profile.weight_passes.get(name)
        if fit is None and name == "repredict":
            fit = self.profile.weight_passes.get("predict")
        if fit is not None:
            return self.scale * fit.at(num_params)
        update = self.profile.optimizer
        words_ratio = 4 * WEIGHT_PASS_WORDS[name] / OPTIMIZER_BYTES_PER_PARAM[update.name]
        return self.scale * (update.intercept_s + update.per_param_s * num_params * words_ratio)

    def topk_s(self, num_elements: float, density: float | None = None) -> float:
        """Top-k selection at `density` from the profile's fit at that density."""
        if num_elements <= 0:
            return 0.0
        fits = self.profile.topk
        fit = next((f for d, f in fits.items() if density is None or math.isclose(d, density, rel_tol=1e-9)), None)
        if fit is None:
            measured = ", ".join(f"{d:g}" for d in fits) or "none"
            raise ScenarioError(
                f"{self.profile.source}: topk: no top-k selection fit at strategy.compression_density "
                f"{density}; profiled densities: {measured}; recalibrate with that density")
        return self.scale * fit.at(num_elements)

    # ------------------------------------------------------------------ communication
    def p2p_s(self, size_bytes: float) -> float:
        """One-way point-to-point time of `size_bytes` (alpha + S / beta)."""
        if size_bytes <= 0:
            return 0.0
        if self.profile.p2p is None:
            raise ScenarioError(f"{self.profile.source}: p2p: not profiled (world_size 1); "
                                "recalibrate with world_size >= 2")
        return self.profile.p2p.time_s(size_bytes)

    def collective_s(self, op: str, size_bytes: float, num_ranks: int) -> float:
        """An allreduce of a `size_bytes` buffer, or an allgather in which every rank contributes
        `size_bytes`, among `num_ranks` ranks, from the fit for that group size."""
        if num_ranks <= 1 or size_bytes <= 0:
            return 0.0
        fits = self.profile.allgather if op == "allgather" else self.profile.allreduce
        fit = fits.get(num_ranks)
        if fit is None:
            name = "allgather" if op == "allgather" else "allreduce"
            sizes = ", ".join(str(g) for g in sorted(fits)) or "none"
            world = self.profile.world_size
            raise ScenarioError(f"{self.profile.source}: {name}: no fit for a group of {num_ranks} ranks "
                                f"(profiled group sizes: {sizes}; world size {world}): calibrate at world size "
                                f"{num_ranks}, or shrink the scenario to the profile's (e.g. --set "
                                f"cluster.num_nodes=1 --set cluster.gpus_per_node={world})")
        return fit.time_s(size_bytes)


def _check_model(profile: Profile, workload: Workload) -> None:
    """Same name, layer count and layer names; same parameter count and forward FLOPs if recorded."""
    names = tuple(layer.name for layer in workload.layers)
    model = profile.model
    differences = []
    if model.name.lower() != workload.name.lower():
        differences.append(f"{model.name!r} vs {workload.name!r}")
    if profile.num_layers != workload.num_layers:
        differences.append(f"{profile.num_layers} vs {workload.num_layers} layers")
    elif model.layer_names != names:
        differences.append("other layer names")
    if model.num_params is not None and model.num_params != workload.num_params:
        differences.append(f"{model.num_params:,} vs {workload.num_params:,} parameters")
    flops = model.forward_flops_per_sample
    if flops is not None and not math.isclose(flops, workload.forward_flops_per_sample, rel_tol=1e-6):
        differences.append(f"{flops:.4g} vs {workload.forward_flops_per_sample:.4g} forward FLOPs per sample")
    if differences:
        raise ScenarioError(f"{profile.source}: model: the profile's model is not this scenario's (profile vs "
                            f"scenario: {'; '.join(differences)}): calibrate with this scenario's model")
