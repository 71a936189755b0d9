"""Human-readable tables of simulation results (rich), and the compare table as a DataFrame."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from simulator.simulate import SimulationResult
from simulator.units import (format_bytes, format_count, format_flops_per_s, format_number, format_seconds,
                             plural, time_unit)


class PipeConsole(Console):
    """A rich Console whose closed output pipe raises BrokenPipeError, as a plain `print` does: the
    CLI then exits with code 141 and nothing on stderr (rich's own `on_broken_pipe` exits with 1,
    the code of a bug)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more is written (rich's own handler does the same)
        raise BrokenPipeError


def make_console() -> Console:
    """A console that does not squeeze tables to 80 columns when output is piped, and raises
    BrokenPipeError when the reader goes away (`PipeConsole`)."""
    console = PipeConsole()
    return console if console.is_terminal else PipeConsole(width=160)


def comparison_frame(results: list[SimulationResult]) -> pd.DataFrame:
    """One row per strategy: grid, step time, throughput, speedup, mean compute/comm/idle split."""
    rows = []
    for result in results:
        summary = result.summary
        devices = pd.DataFrame(summary["devices"])
        rows.append({
            "strategy": strategy_label(summary),
            "placement": _placement_label(summary),
            "step_time_s": summary["step_time_s"],
            "throughput_samples_per_s": summary["throughput_samples_per_s"],
            "speedup": summary["speedup"],
            "compute_s": devices["compute_s"].mean(),
            "comm_s": devices["comm_s"].mean(),
            "idle_s": devices["idle_s"].mean(),
            "inter_node_bytes": summary["bytes_per_tier"]["inter"],
            "mfu": summary.get("mfu", float("nan")),
            "peak_memory_bytes": summary["memory"]["peak_memory_bytes"],
            "fits_in_memory": summary["fits_in_memory"],
        })
    return pd.DataFrame(rows)


def has_no_placement(summary: dict) -> bool:
    """A grid of one group or one worker a group has no choice of placement (shown as "-")."""
    return 1 in (summary.get("num_groups"), summary.get("workers_per_group"))


def _placement_label(summary: dict) -> str:
    if has_no_placement(summary):
        return "-"
    return summary["placement"] if isinstance(summary["placement"], str) else "explicit"


def strategy_label(summary: dict) -> str:
    """"ghp (G=4 x M=2)", "1f1b (G=1 x M=4) m=8"; a megatron run by its degrees, as `ghpsim rank` labels it: "megatron
    (t=8 x c=2 x p=16 x d=64)" (+ " ep=E" with expert parallelism)."""
    tensor, pipeline = summary.get("tensor"), summary.get("pipeline")
    if summary["strategy"] != "megatron" or not tensor:
        microbatches = f" m={pipeline['num_microbatches']}" if pipeline else ""  # as `ghpsim rank` labels it
        return f"{summary['strategy']} (G={summary['num_groups']} x M={summary['workers_per_group']}){microbatches}"
    context = f" x c={tensor['cp_degree']}" if tensor.get("cp_degree", 1) > 1 else ""
    experts = f" ep={tensor['ep_degree']}" if tensor.get("ep_degree", 1) > 1 else ""
    return (f"megatron (t={tensor['tp_degree']}{context} x p={tensor['pp_degree']} x d={tensor['dp_degree']})"
            + experts)


def print_comparison(results: list[SimulationResult], title: str, console: Console | None = None,
                     caption: str | None = None) -> None:
    console = console or make_console()
    frame = comparison_frame(results)
    table = Table(title=title, caption=caption)
    for column in ("#", "strategy", "placement", "step (ms)", "samples/s", "speedup",
                   "compute (ms)", "comm (ms)", "idle (ms)", "inter-node MB", "peak mem (GiB)"):
        table.add_column(column, justify="left" if column in ("strategy", "placement") else "right")
    for position, row in enumerate(frame.itertuples(index=False), start=1):  # `compare.ranked`: those that fit first
        table.add_row(str(position) if row.fits_in_memory else "-", row.strategy, row.placement, f"{row.step_time_s * 1e3:.2f}",
                      f"{row.throughput_samples_per_s:,.0f}", f"{row.speedup:.2f}x",
                      f"{row.compute_s * 1e3:.2f}", f"{row.comm_s * 1e3:.2f}", f"{row.idle_s * 1e3:.2f}",
                      f"{row.inter_node_bytes / 1e6:,.1f}",
                      f"{row.peak_memory_bytes / 2**30:,.2f}" + ("" if row.fits_in_memory else " infeasible"))
    console.print(table)


def _fsdp_note(tensor: dict) -> str:
    """" (FSDP2 full_shard)": the FSDP version and strategy of a plan that gathers per unit (version 1
    without a strategy name: DeepSpeed-style flat buffers), else the strategy name alone."""
    version, sharding = tensor.get("fsdp_version"), tensor.get("fsdp_sharding")
    if version is None:
        return f" (FSDP {sharding})" if sharding else ""
    return f" (FSDP{version} {sharding})" if sharding else (" (FSDP2)" if version == 2 else " (flat buffers)")


def device_noun(cluster) -> str:
    """"GPU", "CPU" where every device is a CPU (`architecture: cpu`), "device" for a mix of both."""
    kinds = {gpu.architecture == "cpu" for gpu in (cluster.gpu, *cluster.node_gpus.values())}
    return "device" if len(kinds) > 1 else "CPU" if kinds == {True} else "GPU"


def fabric_label(cluster) -> str:
    """The links a run uses: a graph file's own, else the two tiers and the fabric between nodes."""
    if cluster.topology == "graph_file":
        return f"links from the graph file {Path(cluster.topology_file).name}"
    fabric = "" if cluster.topology == "two_tier" else f" ({cluster.topology.replace('_', ' ')})"
    return f"intra {cluster.intra_node_link.name}, inter {cluster.inter_node_link.name}{fabric}"


def print_summary(result: SimulationResult, console: Console | None = None) -> None:
    console = console or make_console()
    summary, scenario = result.summary, result.scenario
    cluster = scenario.cluster
    step_s, noun = summary["step_time_s"], device_noun(cluster)
    size = f"{format_count(result.workload.num_params)} params, {plural(result.workload.num_layers, 'layer')}"
    seq_len = next((layer.spec["seq_len"] for layer in result.workload.layers if "seq_len" in layer.spec), None)
    tokens = f" x {seq_len:,} tokens" if seq_len else ""  # a transformer's sequence (hf_config: its longest)
    console.print(f"[bold]{summary['scenario']}[/bold]: {summary['model']} ({size}), "
                  f"batch {summary['global_batch_size']}{tokens} {scenario.training.dtype}"
                  + (f" + fp8 ({scenario.training.fp8_recipe} scaling)" if scenario.training.fp8_recipe else ""))
    console.print(f"cluster: {plural(cluster.num_nodes, 'node')} x {cluster.gpus_per_node} {cluster.gpu.name}; "
                  + fabric_label(cluster))
    console.print(f"strategy: {strategy_label(summary)}, placement {summary['placement']}, "
                  f"partition {summary['partition']}")
    if summary.get("partition_note"):  # memory kept the balanced partition from its fastest split
        console.print(f"partition: {summary['partition_note']}", highlight=False)
    console.print(f"step time {format_seconds(step_s)} | "
                  f"{format_number(summary['throughput_samples_per_s'], 3, 1)} samples/s | "
                  f"speedup {format_number(summary['speedup'], 3, 2)}x over one device | "
                  f"intra {format_bytes(summary['bytes_per_tier']['intra'])}, "
                  f"inter {format_bytes(summary['bytes_per_tier']['inter'])}")
    console.print(f"model FLOPs {summary['model_flops_per_step']:.3g} per step | "
                  f"{format_flops_per_s(summary['achieved_tflops_per_gpu'] * 1e12)} per {noun} | "
                  f"MFU {format_number(summary['mfu'] * 100, 3, 1)}%"
                  + (" (over 100 %: Winograd, causal flash kernels or dropped MoE tokens skip counted FLOPs)" if 1 < summary["mfu"] < math.inf else ""))
    if not summary["single_device_baseline"].startswith(("simulated", "this run")):
        console.print(f"speedup baseline: {summary['single_device_baseline']}", highlight=False)
    if "compute_model" in summary:
        console.print(f"compute model: {summary['compute_model']['model']} ({summary['compute_model']['note']})",
                      highlight=False)
    if "tensor" in summary:  # megatron (simulator/strategies/tensor.py)
        tensor = summary["tensor"]
        console.print(f"3D: tp {tensor['tp_degree']} x pp {tensor['pp_degree']} x dp {tensor['dp_degree']}"
                      f"{' x cp ' + str(tensor['cp_degree']) if tensor.get('cp_degree', 1) > 1 else ''}"
                      f"{' (ep ' + str(tensor['ep_degree']) + ')' if tensor.get('ep_degree', 1) > 1 else ''}, "
                      f"{tensor['schedule']}, micro-batch {tensor['microbatch_size']:g}, sequence parallel "
                      f"{'on' if tensor['sequence_parallel'] else 'off'}, ZeRO-{tensor['zero_stage']}"
                      f"{_fsdp_note(tensor)}; "
                      f"{'symmetric' if tensor['symmetry']['used'] else 'full'} simulation: "
                      f"{tensor['symmetry']['reason']}")
    if "symmetry" in summary:  # replicas of dp / mp / ghp / pipeline runs (simulator/grid_symmetry.py)
        console.print(f"{'symmetric' if summary['symmetry']['used'] else 'full'} simulation: "
                      f"{summary['symmetry']['reason']}")
    devices = pd.DataFrame(summary["devices"])
    unit, scale = time_unit(step_s)
    table = Table(title=f"per device ({unit})")
    for column in ("rank", "device", "node", "group", "stage", "layers", "compute", "comm", "idle", "peak mem (GiB)"):
        table.add_column(column, justify="right")
    shown = devices if len(devices) <= 16 else pd.concat([devices.head(8), devices.tail(8)])
    for row in shown.itertuples(index=False):
        table.add_row(str(row.rank), str(row.device), str(row.node), str(row.group), str(row.stage),
                      f"{row.layers[0]}-{row.layers[1] - 1}", f"{row.compute_s / scale:,.3f}",
                      f"{row.comm_s / scale:,.3f}", f"{row.idle_s / scale:,.3f}",
                      f"{row.peak_memory_bytes / 2**30:,.2f}" + ("" if row.fits_in_memory else " (does not fit)"))
    console.print(table)
    if len(devices) > 16:
        console.print(f"({len(devices) - 16} of {len(devices)} devices not shown; --json lists all)")
    offload_s = summary["memory"].get("offload_exposed_s", 0.0)
    if offload_s > 0:  # added to the step and to each row's comm after the engine's run (simulator/simulate.py)
        console.print(f"offload: {format_seconds(offload_s)} of host transfers not hidden by compute (added to "
                      f"the step, and to each device's comm above)", highlight=False)
    if "pipeline" in summary:
        print_pipeline(summary["pipeline"], console, (summary.get("tensor") or {}).get("cp_degree", 1))
    if "steady_state" in summary:
        console.print(f"steady state: {summary['steady_state']}")
    if "kernel_passes" in summary:
        console.print(kernel_pass_line(summary["kernel_passes"]), highlight=False)


def kernel_pass_line(report: dict) -> str:
    """One line of `summary["kernel_passes"]` (`simulator.kernel_report`): each pass's time, its
    GEMM, memory-bound and launch shares (ms), and the wait for the host."""
    parts = []
    for name in ("forward", "backward"):
        if name not in report:
            continue
        figures = report[name]
        gpu = figures["gpu_s"]
        tiled = gpu.get("gemm", 0.0) + gpu.get("flash_attention", 0.0)
        counted = gpu.get("generic", 0.0)  # one kernel per layer from a layer table's own counts
        memory = sum(seconds for kind, seconds in gpu.items()
                     if kind not in ("gemm", "flash_attention", "launch", "generic"))
        parts.append(f"{name} {figures['total_s'] * 1e3:,.3f} ms (GEMM {tiled * 1e3:,.3f}, "
                     + (f"layers priced from their counts {counted * 1e3:,.3f}, " if counted else "")
                     + f"memory-bound {memory * 1e3:,.3f}, launches {gpu.get('launch', 0.0) * 1e3:,.3f}, "
                     f"waiting on the host {figures['host_wait_s'] * 1e3:,.3f})")
    batch = report["batch"]  # under context parallelism a rank's share of a sample: its part of the sequence
    samples = plural(batch, "sample") if batch >= 1 else f"1 sample, {batch:g} of its sequence"
    return (f"kernels of rank 0's first micro-batch ({plural(report['num_layers'], 'layer')}, "
            f"{samples}): " + "; ".join(parts)
            + f"; host {format_seconds(report['host_overhead_s'], 3)} a kernel")


def print_pipeline(pipeline: dict, console: Console, cp_degree: int = 1) -> None:
    """Per-stage figures of a pipeline schedule (simulator/schedules/steady_state.py)."""
    split = f", each split over CP {cp_degree} by sequence" if cp_degree > 1 else ""
    console.print(f"pipeline {pipeline['schedule']}: m={pipeline['num_microbatches']} "
                  f"{'micro-batch' if pipeline['num_microbatches'] == 1 else 'micro-batches'} of "
                  f"{pipeline['microbatch_size']:g}{split}, v={pipeline['num_virtual_stages']}; step time = "
                  f"{pipeline['step_time_definition']}")
    stages = pipeline["stages"]
    chunks = any(row["chunk_passes_in_flight"] != row["microbatches_in_flight"] for row in stages)
    table = Table(title="per stage (bubble: idle waiting for work; exposed comm: communicating, not computing)")
    for column in ("stage", "micro-batches in flight", *(("chunk passes in flight",) if chunks else ()),
                   "stashed versions", "extra copies", "staleness", "bubble", "exposed comm"):
        table.add_column(column, justify="right")
    for row in stages:
        table.add_row(str(row["stage"]), str(row["microbatches_in_flight"]),
                      *((str(row["chunk_passes_in_flight"]),) if chunks else ()), str(row["stashed_weight_versions"]),
                      str(row["extra_weight_copies"]), str(row["weight_staleness"]), f"{row['bubble_fraction']:.1%}",
                      f"{row['exposed_comm_fraction']:.1%}")
    console.print(table)
