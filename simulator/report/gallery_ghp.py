"""Gallery entry 1, GHP: GHP vs DP vs MP on a deep CNN (ResNet-1001) and a
transformer (BERT-Large) on clusters whose nodes are joined by 10 GbE, with the planner's (G, M)
ranking (`ghpsim rank`) and the picks of the paper's two heuristics (`simulator.heuristics`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from simulator.compare import compare
from simulator.planner import rank_candidates
from simulator.rank_cli import heuristic_rows
from simulator.rank_plot import plot_ranking
from simulator.report import gallery_plots
from simulator.report.document import Figure, Section, Table, figure_png
from simulator.report.gallery_claims import (Claim, GalleryEntry, Paper, claims_section, gallery_report, gib, ms,
                                             paper_section, prefixed, reasons_section, reproduce_section,
                                             scenario_sections, times)
from simulator.report.inputs import ReportInput
from simulator.report.strategy_sections import strategy_sections
from simulator.scenario import load_scenario
from simulator.tables import strategy_label

PAPER = Paper("ghp", "GHP: group hybrid parallelism",
              "Joo & Youn, \"Accelerating Distributed SGD With Group Hybrid Parallelism\", IEEE Access 9, 2021",
              "000_aa7d356fd8e326f9.txt")
SCENARIOS = {"ResNet-1001": "scenarios/resnet1001_ghp_10gbe.yaml",
             "BERT-Large": "scenarios/gallery_ghp_bert_large_10gbe.yaml"}
KINDS = ("dp", "mp", "ghp")


def build(root: Path, quick: bool = False) -> GalleryEntry:
    """`quick` is accepted for symmetry with the other entries; both cases take ~2 s."""
    data: dict[str, pd.DataFrame] = {}
    sections: list[Section] = []
    files: dict[str, bytes] = {}
    summary_rows, scenarios = [], []
    for model, path in SCENARIOS.items():
        scenario = load_scenario(root / path)
        results = compare(scenario, [(kind, None) for kind in KINDS])
        ranking = rank_candidates(scenario, kinds=KINDS, workers=1, show_progress=False)
        heuristics = pd.DataFrame(heuristic_rows(ranking))
        frame = ranking.frame().drop(columns=["partition"])
        key = scenario.name
        data[f"ranking_{key}"], data[f"heuristics_{key}"] = frame, heuristics
        summary_rows.append(_summary_row(model, scenario, frame, heuristics, results))
        sections += _model_sections(model, scenario, results, frame, heuristics, files)
        scenarios.append((scenario, results[0].workload.num_params, results[0].workload.num_layers))
    summary = pd.DataFrame(summary_rows)
    data["summary"] = summary
    headline_figure = Figure("fig-ghp-speedup", "Throughput relative to DP of DP, MP and the best GHP grid "
                             "(simulated, 10 GbE between nodes)", figure_png(lambda axis: _plot_headline(summary, axis)))
    claims = _claims(summary)
    sections = [paper_section(PAPER, _setting()), claims_section(claims, headline_figure), reasons_section(claims),
                Section("summary", "GHP vs DP vs MP", tables=[Table("summary-table", _summary_display(summary))]),
                *sections, *scenario_sections(scenarios),
                reproduce_section([f"ghpsim rank {p} --kinds dp,mp,ghp" for p in SCENARIOS.values()]
                                  + [f"ghpsim compare {p} --strategies dp,mp,ghp" for p in SCENARIOS.values()])]
    report = gallery_report(PAPER, sections, files, data, list(SCENARIOS.values()))
    line = "; ".join(f"{row.model} ({row.num_gpus} GPUs, 10 GbE): best GHP {times(row.ghp_over_dp)} over DP, "
                     f"{times(row.ghp_over_mp)} over MP" for row in summary.itertuples())
    return GalleryEntry(PAPER, report, f"{line} (paper: GHP beats both; the abstract gives no figure)",
                        headline_figure.id, data, claims)


def _summary_row(model, scenario, frame: pd.DataFrame, heuristics: pd.DataFrame, results) -> dict:
    fits = frame[frame["fits_in_memory"]]
    dp, mp = (fits[fits["kind"] == kind].iloc[0] for kind in ("dp", "mp"))
    ghp = fits[fits["kind"] == "ghp"].iloc[0]
    picks = heuristics.set_index("heuristic")
    by_kind = {result.summary["strategy"]: result.summary for result in results}
    return {"model": model, "scenario": scenario.name, "num_gpus": scenario.num_gpus,
            "candidates": len(frame), "dp_step_s": dp["step_time_s"], "mp_step_s": mp["step_time_s"],
            "ghp_label": ghp["label"], "ghp_step_s": ghp["step_time_s"], "ghp_rank": int(ghp["rank"]),
            "ghp_over_dp": dp["step_time_s"] / ghp["step_time_s"], "ghp_over_mp": mp["step_time_s"] / ghp["step_time_s"],
            "dp_inter_node_bytes": by_kind["dp"]["bytes_per_tier"]["inter"],
            "ghp_inter_node_bytes": by_kind["ghp"]["bytes_per_tier"]["inter"],
            "dp_peak_memory_bytes": dp["peak_memory_bytes"], "ghp_peak_memory_bytes": ghp["peak_memory_bytes"],
            "time_min_pick": picks.loc["time-minimising", "label"],
            "time_min_rank": picks.loc["time-minimising", "simulated_rank"],
            "time_min_regret_pct": picks.loc["time-minimising", "regret_pct"],
            "memory_first_pick": picks.loc["memory-first", "label"],
            "memory_first_rank": picks.loc["memory-first", "simulated_rank"]}


def _summary_display(summary: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "model": summary["model"], "GPUs": summary["num_gpus"].astype(str),
        "DP step (ms)": summary["dp_step_s"].map(ms), "MP step (ms)": summary["mp_step_s"].map(ms),
        "best GHP": summary["ghp_label"], "GHP step (ms)": summary["ghp_step_s"].map(ms),
        "GHP over DP (x)": summary["ghp_over_dp"].map(lambda v: f"{v:.2f}"),
        "GHP over MP (x)": summary["ghp_over_mp"].map(lambda v: f"{v:.2f}"),
        "inter-node MB/step, DP": summary["dp_inter_node_bytes"].map(lambda v: f"{v / 1e6:.1f}"),
        "inter-node MB/step, GHP": summary["ghp_inter_node_bytes"].map(lambda v: f"{v / 1e6:.1f}"),
        "peak GiB, DP": summary["dp_peak_memory_bytes"].map(gib),
        "peak GiB, GHP": summary["ghp_peak_memory_bytes"].map(gib)})


def _model_sections(model, scenario, results, frame: pd.DataFrame, heuristics: pd.DataFrame,
                    files: dict[str, bytes]) -> list[Section]:
    """The (G, M) ranking with the heuristics' picks, then the report machinery's sections for
    dp, mp and the scenario's GHP grid (ids prefixed by the scenario name)."""
    picks: dict[str, list[str]] = {}
    for row in heuristics.itertuples():
        if row.label:
            picks.setdefault(row.label, []).append(row.heuristic)
    notes = {label: ", ".join(names) for label, names in picks.items()}
    dp_step = float(frame.loc[frame["kind"] == "dp", "step_time_s"].iloc[0])
    ranking = Section(f"{scenario.name}-rank", f"{model}: every (G, M) grid ranked", paragraphs=[
        f"`ghpsim rank` on {scenario.num_gpus} GPUs, kinds dp, mp and ghp (both placements): "
        f"{len(frame)} candidates, simulated and sorted by step time. The heuristics choose from the "
        "closed-form T_GHP(G, M) without simulating: memory-first takes the smallest M "
        "that fits, time-minimising the smallest closed-form time."],
        tables=[Table(f"{scenario.name}-rank-table", pd.DataFrame({
            "#": frame["rank"].astype(str), "candidate": frame["label"],
            "step (ms)": frame["step_time_s"].map(ms),
            "samples/s": frame["throughput_samples_per_s"].map(lambda v: f"{v:.1f}"),
            "vs DP (x)": (dp_step / frame["step_time_s"]).map(lambda v: f"{v:.2f}"),
            "comm share (%)": (100 * frame["comm_share"]).map(lambda v: f"{v:.0f}"),
            "peak memory (GiB)": frame["peak_memory_bytes"].map(gib),
            "fits": frame["fits_in_memory"].map(lambda v: "yes" if v else "no")}), caption="ranking"),
            Table(f"{scenario.name}-heuristics-table", pd.DataFrame({
                "heuristic": heuristics["heuristic"], "pick": heuristics["label"].fillna("none fits"),
                "closed form (ms)": heuristics["closed_form_s"].map(lambda v: "-" if pd.isna(v) else ms(v)),
                "simulated (ms)": heuristics["simulated_s"].map(lambda v: "-" if pd.isna(v) else ms(v)),
                "simulated rank": heuristics["simulated_rank"].map(lambda v: "-" if pd.isna(v) else str(int(v))),
                "regret (%)": heuristics["regret_pct"].map(lambda v: "-" if pd.isna(v) else f"{v:.1f}")}),
                caption="heuristics' picks")],
        figures=[Figure(f"fig-{scenario.name}-rank", f"{model}: simulated step time per candidate, "
                        "heuristic picks marked", figure_png(lambda axis: plot_ranking(frame, axis, notes),
                                                              (8.0, 1.2 + 0.25 * len(frame))))])
    data = ReportInput(kind="scenario", source=str(scenario.name), title=scenario.name, scenario=scenario,
                       summaries=[r.summary for r in results],
                       spans={strategy_label(r.summary): r.spans for r in results})
    machinery: dict[str, bytes] = {}
    strategy = [prefixed(section, scenario.name, machinery, files) for section in strategy_sections(data, machinery)]
    for section in strategy:
        section.title = f"{model}: {section.title[0].lower()}{section.title[1:]}"
    return [ranking, *strategy]


def _plot_headline(summary: pd.DataFrame, axis) -> None:
    rows = []
    for row in summary.itertuples():
        rows += [{"model": row.model, "strategy": "DP", "relative": 1.0},
                 {"model": row.model, "strategy": "MP", "relative": row.dp_step_s / row.mp_step_s},
                 {"model": row.model, "strategy": "best GHP", "relative": row.ghp_over_dp}]
    gallery_plots.plot_grouped_bars(pd.DataFrame(rows), axis, "model", "strategy", "relative",
                                    "throughput relative to DP (x)", reference=1.0)


def _setting() -> list[str]:
    return ["Setting: ResNet-1001 (pre-activation, 335 layers, 10.3 M parameters, batch 64, fp32) on 4 nodes x "
            "4 V100 (NVLink 2 inside a node) and BERT-Large (335 M parameters, sequence 512, batch 32, fp16, "
            "Adam) on 2 nodes x 4 A100-40GB (NVLink 3); 10 GbE between nodes in both. The abstract gives no "
            "cluster, model or batch, so these are our choice of a 'slow inter-node network'."]


def _claims(summary: pd.DataFrame) -> list[Claim]:
    by = summary.set_index("model")
    r, b = by.loc["ResNet-1001"], by.loc["BERT-Large"]
    per_model = "; ".join(f"{m}: {times(row.ghp_over_dp)} over DP, {times(row.ghp_over_mp)} over MP"
                          for m, row in by.iterrows())
    traffic = "; ".join(f"{m}: {row.dp_inter_node_bytes / 1e6:.0f} -> {row.ghp_inter_node_bytes / 1e6:.0f} MB"
                        for m, row in by.iterrows())
    memory = "; ".join(f"{m}: {gib(row.dp_peak_memory_bytes)} -> {gib(row.ghp_peak_memory_bytes)} GiB"
                       for m, row in by.iterrows())
    picks = "; ".join(f"{m}: time-minimising picks {row.time_min_pick} (rank {int(row.time_min_rank)} of "
                      f"{row.candidates}, {row.time_min_regret_pct:.1f} % slower than the best), memory-first "
                      f"picks {row.memory_first_pick} (rank {int(row.memory_first_rank)})" for m, row in by.iterrows())
    return [
        Claim("Groups of model-parallel workers, data-parallel across groups, train faster than DP and MP",
              "outperforms both (no figure in the abstract)", per_model, "agrees",
              "DP allreduces every gradient among all N workers across the slow link; GHP's stage_per_node "
              "placement keeps each stage's allreduce among G peers over fewer bytes and sends only "
              f"activations between nodes; MP idles all but one worker. The gap grows with the gradient bytes "
              f"per sample (BERT-Large {times(b.ghp_over_dp)} vs ResNet-1001 {times(r.ghp_over_dp)})."),
        Claim("Grouping cuts the communication among workers", "less network traffic (no figure)",
              f"inter-node bytes per step, DP -> scenario's GHP: {traffic}", "agrees",
              "Counted by the engine on the inter-node links of one step."),
        Claim("Mixing DP and MP mitigates the worker memory limit", "less memory per worker (no figure)",
              f"peak per device, DP -> best GHP: {memory}",
              "partly agrees" if (summary["ghp_peak_memory_bytes"] > summary["dp_peak_memory_bytes"]).any() else "agrees",
              "GHP holds 1/M of the weights, gradients and optimizer state but the activations of B/G samples "
              "for its layers; for BERT-Large (weights + Adam dominate) the peak drops, for ResNet-1001 "
              "(activations dominate, B/G = 2 x B/N samples on half the layers) it does not."),
        Claim("Heuristics based on the training-time model choose the configuration",
              "they minimise training time (no figure)", picks, "partly agrees",
              "Our heuristics are reconstructed from the abstract: the closed form adds compute, "
              "activation transfers and the slowest stage's ring allreduce (NICs shared by the rings leaving a "
              "node) but leaves out the allreduce's overlap with the backward pass and the timing of traffic "
              "that shares links (activations and several stages' allreduces at once), so it can order the grids "
              "differently from the simulation; memory-first stops at the first grid that fits (DP here)."),
        Claim("No accuracy loss: GHP's gradient equals mini-batch SGD's over the full batch (Proposition 1)",
              "proved", "parameters equal single-process training to 1e-5 after k steps "
              "(validator, tests/test_runtime_correctness.py, 2 and 4 CPU ranks)", "agrees",
              "Checked by real torch.distributed runs of the same plans, not by this simulation."),
    ]
