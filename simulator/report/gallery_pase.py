"""Gallery entry 4, PaSE: AlexNet at batch 128 on p = 4 to 64 GTX 1080 Ti and RTX
2080 Ti: PaSE's searched strategy against data parallelism and the expert strategy ("one weird
trick"), by PaSE's own cost model and by the engine playing each strategy (`ghpsim search`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from simulator.pase.run import graph_for_scenario, search_point
from simulator.report import gallery_plots
from simulator.report.document import Figure, Section, Table, figure_png
from simulator.report.gallery_claims import (Claim, GalleryEntry, Paper, claims_section, gallery_report, ms,
                                             paper_section, reasons_section, reproduce_section, scenario_sections,
                                             times)
from simulator.scenario import load_scenario
from simulator.simulate import simulate

PAPER = Paper("pase", "PaSE: automatic parallelization strategies",
              "Elango, \"PaSE: Parallelization Strategies for Efficient DNN Training\", IPDPS 2021",
              "003_0851e5d501e5b32a.txt")
SCENARIOS = {"GTX 1080 Ti": "scenarios/pase_alexnet_1080ti.yaml", "RTX 2080 Ti": "scenarios/pase_alexnet_2080ti.yaml"}
GPUS, QUICK_GPUS = (4, 8, 16, 32, 64), (4, 8)
CONFIG_GPUS = 8
BRIEF_FIGURES = {"GTX 1080 Ti": 1.85, "RTX 2080 Ti": 4.0}
"""AlexNet speedups over DP quoted for the full paper; not in its abstract."""


def search_frame(root: Path, gpus: tuple[int, ...]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(every strategy per GPU type and p; the ratios per GPU type and p; the per-layer
    configurations at CONFIG_GPUS devices)."""
    rows, ratios, configs = [], [], []
    for gpu, path in SCENARIOS.items():
        scenario = load_scenario(root / path)
        graph = graph_for_scenario(scenario)
        for p in gpus:
            point = search_point(scenario, graph, p, simulate=True)
            by = {row["strategy"]: row for row in point["results"]}
            for row in point["results"]:
                rows.append({"gpu": gpu, "p": p, "link": point["link"], "strategy": row["strategy"],
                             "cost_flops": row["cost_flops"], "analytic_s": row["analytic_s"],
                             "simulated_step_s": row["simulated_step_s"]})
            ratios.append({"gpu": gpu, "p": p, "link": point["link"],
                           "max_dependent_set": point["max_dependent_set"],
                           "largest_table_entries": point["largest_table_entries"],
                           "pase_vs_dp_cost": by["dp"]["cost_flops"] / by["pase"]["cost_flops"],
                           "pase_vs_dp_simulated": by["dp"]["simulated_step_s"] / by["pase"]["simulated_step_s"],
                           "pase_vs_expert_cost": by["expert"]["cost_flops"] / by["pase"]["cost_flops"],
                           "pase_vs_expert_simulated": by["expert"]["simulated_step_s"] / by["pase"]["simulated_step_s"],
                           "expert_vs_dp_simulated": by["dp"]["simulated_step_s"] / by["expert"]["simulated_step_s"]})
            if p == CONFIG_GPUS:
                for layer in by["pase"]["configs"]:
                    configs.append({"gpu": gpu, "layer": layer,
                                    **{name: by[name]["configs"][layer] for name in ("pase", "expert", "dp")}})
    return pd.DataFrame(rows), pd.DataFrame(ratios), pd.DataFrame(configs)


def build(root: Path, quick: bool = False) -> GalleryEntry:
    frame, ratios, configs = search_frame(root, QUICK_GPUS if quick else GPUS)
    data = {"strategies": frame, "ratios": ratios, "configs": configs}
    headline = Figure("fig-pase-vs-dp", "PaSE's strategy: speedup over data parallelism vs devices, by PaSE's cost "
                      "model (dashed) and simulated (solid); dash-dotted: the paper's figures as quoted in the "
                      "project brief", figure_png(lambda axis: _plot(ratios, axis, "dp")))
    expert = Figure("fig-pase-vs-expert", "PaSE's strategy: speedup over the expert strategy (DP convolutions, "
                    "model-parallel FC layers)", figure_png(lambda axis: _plot(ratios, axis, "expert")))
    scenarios = []
    for path in SCENARIOS.values():
        scenario = load_scenario(root / path)
        workload = simulate(scenario).workload
        scenarios.append((scenario, workload.num_params, workload.num_layers))
    claims = _claims(ratios, scenarios[0][1])
    sections = [
        paper_section(PAPER, _setting()), claims_section(claims, headline), reasons_section(claims),
        Section("speedups", "Speedups per GPU type and device count", paragraphs=[
            "Cost model: PaSE's F (compute / prod(c) + r x bytes, r = peak FLOP/s / bandwidth of the slowest "
            "link the p devices span) converted to seconds at peak. Simulated: each strategy compiled into a plan "
            "and played by the engine (roofline compute with per-kind efficiency, links shared, latencies). "
            "p <= 8 runs inside one node (PCIe), larger p across nodes over InfiniBand EDR."],
            tables=[Table("ratios-table", _ratios_display(ratios), caption="speedups"),
                    Table("strategies-table", _strategies_display(frame), caption="every strategy")],
            figures=[expert]),
        Section("configs", f"The strategies at p = {CONFIG_GPUS}", paragraphs=[
            "Per layer, the split of its iteration space: b = batch (data parallel), n = output features / "
            "channels, k = input features (reduction), with the number of parts."],
            tables=[Table("configs-table", pd.DataFrame({"GPU": configs["gpu"], "layer": configs["layer"],
                                                         "PaSE": configs["pase"], "expert": configs["expert"],
                                                         "DP": configs["dp"]}), caption="configurations")]
            if len(configs) else []),
        *scenario_sections(scenarios),
        reproduce_section([f"ghpsim search {path} --gpus {','.join(map(str, GPUS))} --json"
                           for path in SCENARIOS.values()] + ["python benchmarks/bench_pase.py"],
                          ["Search times are left out of this report (they vary from run to run); "
                           "`python benchmarks/bench_pase.py` prints them."]),
    ]
    report = gallery_report(PAPER, sections, {}, data, list(SCENARIOS.values()))
    by_gpu = ratios.groupby("gpu", sort=False)
    line = "; ".join(f"{gpu}: PaSE {times(rows['pase_vs_dp_simulated'].min())}-{times(rows['pase_vs_dp_simulated'].max())} "
                     f"over DP (simulated, p = {rows['p'].min()}-{rows['p'].max()})" for gpu, rows in by_gpu)
    return GalleryEntry(PAPER, report, f"AlexNet, {line} (paper: beats DP in every case)", headline.id, data, claims)


def _ratios_display(ratios: pd.DataFrame) -> pd.DataFrame:
    def x(column):
        return ratios[column].map(lambda v: f"{v:.2f}")
    return pd.DataFrame({"GPU": ratios["gpu"], "p": ratios["p"].astype(str), "link": ratios["link"],
                         "PaSE / DP, cost model (x)": x("pase_vs_dp_cost"),
                         "PaSE / DP, simulated (x)": x("pase_vs_dp_simulated"),
                         "PaSE / expert, cost model (x)": x("pase_vs_expert_cost"),
                         "PaSE / expert, simulated (x)": x("pase_vs_expert_simulated"),
                         "expert / DP, simulated (x)": x("expert_vs_dp_simulated"),
                         "largest DP table (entries)": ratios["largest_table_entries"].astype(str)})


def _strategies_display(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"GPU": frame["gpu"], "p": frame["p"].astype(str), "strategy": frame["strategy"],
                         "cost (GFLOP)": frame["cost_flops"].map(lambda v: f"{v / 1e9:.1f}"),
                         "cost model (ms)": frame["analytic_s"].map(ms),
                         "simulated step (ms)": frame["simulated_step_s"].map(ms)})


def _plot(ratios: pd.DataFrame, axis, baseline: str) -> None:
    for gpu, rows in ratios.groupby("gpu", sort=False):
        line, = axis.plot(rows["p"], rows[f"pase_vs_{baseline}_simulated"], marker="o", label=f"{gpu}, simulated")
        axis.plot(rows["p"], rows[f"pase_vs_{baseline}_cost"], marker="s", linestyle="--", color=line.get_color(),
                  label=f"{gpu}, cost model")
        if baseline == "dp":
            axis.axhline(BRIEF_FIGURES[gpu], color=line.get_color(), linestyle="-.", linewidth=1,
                         label=f"{gpu}: paper, up to {BRIEF_FIGURES[gpu]:g}x (full paper, not in its abstract)")
    axis.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    axis.set_xscale("log", base=2)
    axis.set_xticks(sorted(set(ratios["p"])), [str(p) for p in sorted(set(ratios["p"]))])
    axis.set_xlabel("devices p")
    axis.set_ylabel(f"speedup over {'DP' if baseline == 'dp' else 'the expert strategy'} (x)")
    axis.legend(**gallery_plots.LEGEND_BESIDE)


def _setting() -> list[str]:
    return ["Setting: AlexNet (8 layers, 61 M parameters), batch 128, fp32, plain SGD, on nodes of 8 GTX 1080 Ti "
            "(PCIe 3 with peer-to-peer) or 8 RTX 2080 Ti (PCIe 3 without peer-to-peer, modelled as staged through "
            "host memory), InfiniBand EDR between nodes, as the paper describes its setting. Expert = "
            "data-parallel convolutions and model-parallel (output-feature split) FC layers; DP = batch split "
            "everywhere."]


def _claims(ratios: pd.DataFrame, num_params: int) -> list[Claim]:
    n = len(ratios)
    beats_dp = int((ratios["pase_vs_dp_simulated"] > 1).sum())
    beats_expert_sim = int((ratios["pase_vs_expert_simulated"] >= 1).sum())
    beats_expert_cost = int((ratios["pase_vs_expert_cost"] >= 1).sum())
    worst = ratios.sort_values("pase_vs_expert_simulated", kind="stable").iloc[0]
    maxima = ", ".join(f"{gpu} up to {times(rows['pase_vs_dp_simulated'].max())} simulated / "
                       f"{times(rows['pase_vs_dp_cost'].max())} cost model"
                       for gpu, rows in ratios.groupby("gpu", sort=False))
    return [
        Claim("PaSE's strategies beat data parallelism in every case", "all cases",
              f"{beats_dp} of {n} (GPU, p) cases in simulation; {maxima}", "agrees" if beats_dp == n else "partly agrees",
              "AlexNet's FC layers hold over 90 % of its parameters; DP allreduces all "
              f"{num_params * 4 / 1e6:.0f} MB of gradients every step "
              "while PaSE splits the FC layers' features and moves only activations, so the gap grows with p as "
              "each device's share of the batch shrinks."),
        Claim("Its strategies beat expert-designed ones", "better than expert strategies (no figure in the abstract)",
              f"cost model: {beats_expert_cost} of {n} cases at least as good; simulated: {beats_expert_sim} of {n} "
              f"(worst {times(worst.pase_vs_expert_simulated)} at {worst.gpu}, p = {worst.p})",
              "agrees" if beats_expert_sim == n else "partly agrees",
              "PaSE is optimal for its own cost model, so it never loses there. The engine adds what that model "
              "leaves out (latencies, links shared by concurrent transfers, per-kind compute efficiency, the "
              "hierarchical intra-/inter-node split of collectives), and where PaSE's optimum is only slightly "
              "cheaper on paper the expert plan can be faster when played."),
        Claim("AlexNet speedup over DP on the two GPU types",
              "up to 1.85x (1080 Ti) and 4x (2080 Ti): quoted for the full paper, not in its abstract (unverified)",
              maxima, "partly agrees",
              "Same direction, but several times larger in our model. Our per-device compute is a roofline at "
              "a fixed efficiency, so it "
              "keeps shrinking as the per-device batch falls to 2 samples while DP's allreduce stays fixed; real "
              "kernels lose efficiency at such sizes, which raises every strategy's compute and shrinks the ratio. "
              "The simulator also has no framework overheads per layer or per message."),
        Claim("Strategies are found in practical time", "seconds to minutes",
              f"largest dynamic-programming table {int(ratios['largest_table_entries'].max()):,} entries (max "
              f"dependent set {int(ratios['max_dependent_set'].max())}); bench_pase.py: InceptionV3 at p = 8 in "
              "about a second", "agrees",
              "AlexNet is a chain, so every dependent set has one vertex and the search is tiny; wall times are "
              "not in this report because they change from run to run."),
    ]
