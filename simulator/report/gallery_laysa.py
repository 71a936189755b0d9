"""Gallery entry 5, LaySA : data-parallel ResNet-1001 on 8 GTX 1080 Ti over 10 GbE
with memory reuse, top-k sparse communication, and both (with the mirror weight update), with
and without activation offload: peak memory and throughput at the scenario's batch and across
per-GPU batches (what fits), and one GPU alone (benchmarks/bench_laysa.py shows the same four)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from simulator.report import gallery_plots
from simulator.report.document import Figure, Section, Table, figure_png
from simulator.report.gallery_claims import (Claim, GalleryEntry, Paper, claims_section, gallery_report, gib, ms,
                                             paper_section, pct, reasons_section, reproduce_section,
                                             scenario_sections)
from simulator.scenario import load_scenario
from simulator.simulate import simulate

PAPER = Paper("laysa", "LaySA: memory reuse with sparse communication",
              "Zhao et al., \"Bridging Gap Between Memory and Communication Efficiency on Distributed Deep Learning "
              "Systems\" (LaySA), IEEE Access 2021", "002_22ff02483e97ff7e.txt")
SCENARIO = "scenarios/laysa_resnet_10gbe.yaml"
VARIANTS = {
    "baseline": [],
    "reuse": ["training.memory_policy=reuse"],
    "sparse": ["strategy.gradient_compression=topk"],
    "laysa": ["training.memory_policy=laysa"],
    "reuse+offload": ["training.memory_policy=reuse", "training.offload_activations=true"],
    "laysa+offload": ["training.memory_policy=laysa", "training.offload_activations=true"],
}
BATCHES, QUICK_BATCHES = (16, 32, 64, 128, 256, 512), (16, 64)
PAPER_MEMORY, PAPER_THROUGHPUT, PAPER_ONE_GPU = -0.805, 1.50, -0.1225


def _point(root: Path, variant: str, extra: list[str]) -> dict:
    summary = simulate(load_scenario(root / SCENARIO, [*VARIANTS[variant], *extra])).summary
    return {"variant": variant, "num_gpus": summary["num_gpus"],
            "batch_per_gpu": summary["global_batch_size"] // summary["num_gpus"],
            "step_time_s": summary["step_time_s"], "throughput_samples_per_s": summary["throughput_samples_per_s"],
            "peak_memory_bytes": summary["memory"]["peak_memory_bytes"],
            "fits_in_memory": bool(summary["fits_in_memory"]),
            "offload_exposed_s": summary["memory"]["offload_exposed_s"],
            "capacity_bytes": summary["memory"]["capacity_bytes"],
            "activations_bytes": max(d["memory_breakdown_bytes"]["activations"] for d in summary["devices"]),
            "residual_bytes": max(d["memory_breakdown_bytes"]["residual"] for d in summary["devices"])}


def batch_frame(root: Path, batches: tuple[int, ...]) -> pd.DataFrame:
    """Every variant at every per-GPU batch on the scenario's 8 GPUs."""
    scenario = load_scenario(root / SCENARIO)
    gpus = scenario.num_gpus
    return pd.DataFrame([_point(root, variant, [f"training.global_batch_size={b * gpus}"])
                         for variant in VARIANTS for b in batches])


def one_gpu_frame(root: Path, batch_per_gpu: int) -> pd.DataFrame:
    """Every variant on one GPU (no communication), at the scenario's per-GPU batch."""
    return pd.DataFrame([_point(root, variant, ["cluster.num_nodes=1", f"training.global_batch_size={batch_per_gpu}"])
                         for variant in VARIANTS])


def largest_fitting(frame: pd.DataFrame) -> pd.DataFrame:
    """Per variant: the largest per-GPU batch of the grid that fits, with its throughput."""
    fits = frame[frame["fits_in_memory"]].sort_values(["variant", "batch_per_gpu"], kind="stable")
    last = fits.groupby("variant", sort=False).tail(1).set_index("variant")
    return pd.DataFrame({"variant": list(VARIANTS),
                         "largest_batch_per_gpu": [int(last.loc[v, "batch_per_gpu"]) if v in last.index else 0
                                                   for v in VARIANTS],
                         "throughput_samples_per_s": [float(last.loc[v, "throughput_samples_per_s"])
                                                      if v in last.index else 0.0 for v in VARIANTS]})


def build(root: Path, quick: bool = False) -> GalleryEntry:
    scenario = load_scenario(root / SCENARIO)
    base_batch = scenario.training.global_batch_size // scenario.num_gpus
    grid = batch_frame(root, QUICK_BATCHES if quick else BATCHES)
    setting = grid[grid["batch_per_gpu"] == base_batch].reset_index(drop=True) if base_batch in set(
        grid["batch_per_gpu"]) else batch_frame(root, (base_batch,))
    one_gpu = one_gpu_frame(root, base_batch)
    largest = largest_fitting(grid)
    data = {"setting": setting, "batches": grid, "one_gpu": one_gpu, "largest_fitting": largest}
    claims = _claims(setting, grid, one_gpu, largest, base_batch)
    capacity = float(setting["capacity_bytes"].iloc[0])
    throughput = Figure("fig-laysa-throughput", "Throughput vs per-GPU batch on 8 GPUs; hollow markers do not fit "
                        f"in the {capacity / 2**30:g} GiB of a GTX 1080 Ti",
                        figure_png(lambda axis: _plot_throughput(grid, axis)))
    memory = Figure("fig-laysa-memory", "Peak memory per GPU vs per-GPU batch, against the device capacity",
                    figure_png(lambda axis: _plot_memory(grid, axis, capacity)))
    workload = simulate(scenario).workload
    sections = [
        paper_section(PAPER, _setting(base_batch)), claims_section(claims, throughput), reasons_section(claims),
        Section("setting", f"The four optimisations at {base_batch} samples per GPU", paragraphs=[
            "reuse: layer-centric reuse (buffers released as backward passes them, gradient maps in activation "
            "buffers); sparse: top-k gradients (density 0.01) with an error-feedback residual; laysa: both, with "
            "the mirror weight update; +offload: activations to host memory over PCIe 3 after their forward and "
            "back for their backward (transfers not hidden by compute are added to the step)."],
            tables=[Table("setting-table", _display(setting), caption="8 GPUs"),
                    Table("one-gpu-table", _display(one_gpu), caption="one GPU (no communication)")]),
        Section("batches", "Across per-GPU batches: what fits, and how fast", paragraphs=[
            "The paper's throughput gain comes from larger batches that only fit with its memory savings; here "
            "each variant runs at every per-GPU batch of the grid, and the table under the figure gives the "
            "largest that fits."],
            tables=[Table("largest-table", pd.DataFrame({
                "variant": largest["variant"], "largest fitting batch per GPU": largest["largest_batch_per_gpu"].astype(str),
                "samples/s there": largest["throughput_samples_per_s"].map(lambda v: f"{v:.1f}")}),
                caption="largest fitting batch"),
                Table("batches-table", _display(grid), caption="every point")],
            figures=[memory]),
        *scenario_sections([(scenario, workload.num_params, workload.num_layers)]),
        reproduce_section(["python benchmarks/bench_laysa.py",
                           f"ghpsim simulate {SCENARIO} --set training.memory_policy=laysa"]),
    ]
    report = gallery_report(PAPER, sections, {}, data, [SCENARIO])
    s = setting.set_index("variant")
    memory, offload = (pct(_ratio(s, v, "sparse", "peak_memory_bytes")) for v in ("laysa", "laysa+offload"))
    headline = (f"ResNet-1001 DP on 8 x 1080 Ti, 10 GbE: LaySA vs sparse alone {memory} memory (paper up to "
                f"{pct(PAPER_MEMORY)}; {offload} with offload, at {_times_slower(s, 'laysa+offload', 'laysa')} the "
                f"step time), vs reuse alone {pct(_ratio(s, 'laysa', 'reuse', 'throughput_samples_per_s'))} "
                f"throughput (paper > {pct(PAPER_THROUGHPUT)})")
    return GalleryEntry(PAPER, report, headline, throughput.id, data, claims)


def _ratio(frame: pd.DataFrame, a: str, b: str, column: str) -> float:
    """Relative change of `column` from variant b to variant a: a / b - 1."""
    return float(frame.loc[a, column]) / float(frame.loc[b, column]) - 1


def _display(frame: pd.DataFrame) -> pd.DataFrame:
    """Display rows; memory vs the baseline at the same GPUs and batch per GPU."""
    base = frame[frame["variant"] == "baseline"].set_index(["num_gpus", "batch_per_gpu"])["peak_memory_bytes"]
    base_of = [float(base[(n, b)]) for n, b in zip(frame["num_gpus"], frame["batch_per_gpu"])]
    return pd.DataFrame({
        "variant": frame["variant"], "GPUs": frame["num_gpus"].astype(str),
        "batch per GPU": frame["batch_per_gpu"].astype(str), "step (ms)": frame["step_time_s"].map(ms),
        "samples/s": frame["throughput_samples_per_s"].map(lambda v: f"{v:.1f}"),
        "peak memory (GiB)": frame["peak_memory_bytes"].map(gib),
        "memory vs baseline": (frame["peak_memory_bytes"] / base_of - 1).map(pct),
        "fits": frame["fits_in_memory"].map(lambda v: "yes" if v else "no"),
        "offload exposed (ms)": frame["offload_exposed_s"].map(ms)})


def _plot_throughput(grid: pd.DataFrame, axis) -> None:
    gallery_plots.plot_lines(grid, axis, "batch_per_gpu", "throughput_samples_per_s", "variant",
                             xlabel="batch per GPU (samples)", ylabel="throughput, 8 GPUs (samples/s)",
                             log2_x=True, hollow="fits_in_memory")
    gallery_plots.log_axis(axis.yaxis)


def _plot_memory(grid: pd.DataFrame, axis, capacity_bytes: float) -> None:
    gallery_plots.plot_lines(grid.assign(peak_gib=grid["peak_memory_bytes"] / 2**30), axis, "batch_per_gpu",
                             "peak_gib", "variant", xlabel="batch per GPU (samples)", ylabel="peak memory per GPU (GiB)",
                             log2_x=True, hline=(capacity_bytes / 2**30, f"capacity {capacity_bytes / 2**30:g} GiB"))
    gallery_plots.log_axis(axis.yaxis)


def _setting(base_batch: int) -> list[str]:
    return [f"Setting: data-parallel pre-activation ResNet-1001 (335 layers, 10.3 M parameters), {base_batch} samples "
            "per GPU, fp32, momentum SGD, on 8 nodes of one GTX 1080 Ti (11 GiB) joined by 10 GbE, 25 MiB gradient "
            "buckets. The abstract names neither model nor cluster; a deep CNN on a slow network is where memory and "
            "bandwidth both bind. Our reading of the mirror weight update (the abstract does not define it): "
            "a layer's weight gradient is folded into the residual right after its backward, so one layer's "
            "buffer is live at a time."]


def _claims(setting: pd.DataFrame, grid: pd.DataFrame, one_gpu: pd.DataFrame, largest: pd.DataFrame,
            base_batch: int) -> list[Claim]:
    s, one = setting.set_index("variant"), one_gpu.set_index("variant")
    gains = grid.pivot_table(index="batch_per_gpu", columns="variant", values="throughput_samples_per_s")
    gain = (gains["laysa"] / gains["reuse"] - 1)
    best_batch = int(gain.idxmax())
    fit = largest.set_index("variant")["largest_batch_per_gpu"]
    return [
        Claim("Compared with a system using only one of the two optimisations, LaySA uses much less memory",
              f"up to {pct(PAPER_MEMORY)}",
              f"laysa vs sparse alone {pct(_ratio(s, 'laysa', 'sparse', 'peak_memory_bytes'))}, vs reuse alone "
              f"{pct(_ratio(s, 'laysa', 'reuse', 'peak_memory_bytes'))}; with offload "
              f"{pct(_ratio(s, 'laysa+offload', 'sparse', 'peak_memory_bytes'))} vs sparse alone, at "
              f"{_times_slower(s, 'laysa+offload', 'sparse')} the step time", "partly agrees",
              "Without offload, reuse cannot free the feature maps that backward needs, and those dominate "
              f"ResNet-1001's memory ({gib(s.loc['baseline', 'activations_bytes'])} of "
              f"{gib(s.loc['baseline', 'peak_memory_bytes'])} GiB); our reuse only frees gradient maps early. Memory "
              "drops this far only when activations go to host memory, and then this model is bound by PCIe 3: its "
              "convolutions have too few FLOPs per activation byte to hide the transfers."),
        Claim("Sparse communication balloons memory, so a naive combination with reuse fails",
              "memory ballooning (no figure)",
              f"sparse vs baseline {pct(_ratio(s, 'sparse', 'baseline', 'peak_memory_bytes'))} memory",
              "disagrees",
              f"The top-k residual is one gradient-sized buffer ({s.loc['sparse', 'residual_bytes'] / 1e6:.0f} MB) "
              f"next to {gib(s.loc['sparse', 'activations_bytes'])} GiB of activations; ballooning matters for "
              "weight-heavy models, not for a deep, narrow ResNet."),
        Claim("LaySA's throughput exceeds that of a single optimisation by more than 150 %",
              f"> {pct(PAPER_THROUGHPUT)}",
              f"laysa vs reuse alone {pct(_ratio(s, 'laysa', 'reuse', 'throughput_samples_per_s'))} at "
              f"{base_batch} per GPU, up to {pct(gain.max())} at {best_batch} per GPU; vs sparse alone "
              f"{pct(_ratio(s, 'laysa', 'sparse', 'throughput_samples_per_s'))}",
              "partly agrees" if gain.max() >= PAPER_THROUGHPUT else "disagrees",
              "All of our gain is top-k replacing the dense allreduce over 10 GbE, largest at small batches where "
              "communication dominates; against sparse communication alone LaySA gains nothing, because the "
              "memory it saves does not allow a larger batch here (next claim)."),
        Claim("LaySA scales the batch size up by a large factor", "extremely large factor (no figure)",
              "largest fitting batch per GPU: " + ", ".join(f"{v} {int(fit[v])}" for v in VARIANTS),
              "partly agrees",
              f"Only offloading raises the largest batch (to the grid's end), with a step "
              f"{_times_slower(s, 'laysa+offload', 'laysa')} as long; reuse and the mirror update alone leave "
              "the activations in place."),
        Claim("On a single GPU, LaySA trains about 12 % faster", f"{pct(PAPER_ONE_GPU)} time",
              f"laysa vs baseline on one GPU {pct(_ratio(one, 'laysa', 'baseline', 'step_time_s'))} time",
              "not modelled",
              "Our memory policies change where buffers live, not how fast kernels run; the paper's saving probably "
              "comes from fewer allocations and better cache use, which the roofline cost model does not see."),
    ]


def _times_slower(frame: pd.DataFrame, a: str, b: str) -> str:
    return f"{float(frame.loc[a, 'step_time_s']) / float(frame.loc[b, 'step_time_s']):.1f}x"
