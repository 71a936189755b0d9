"""The report's first section: the scenario (cluster, model, strategy, training) or, for results
that carry no scenario, what the result itself records."""

from __future__ import annotations

import pandas as pd

from simulator.report.document import Section, Table
from simulator.report.inputs import ReportInput, sweep_axes, sweep_ok, value_text
from simulator.report.sweep_order import axis_values, point_order
from simulator.scenario import Scenario
from simulator.tables import has_no_placement, strategy_label

GIB = 2**30


def scenario_section(data: ReportInput) -> Section:
    section = Section(id="scenario", title="Scenario")
    if data.scenario is not None:
        section.paragraphs.append(f"{data.scenario.name}: {data.scenario.description}".rstrip(": "))
        for part, rows in scenario_rows(data.scenario, data.num_params, data.num_layers).items():
            section.tables.append(Table(f"scenario-{part}", _key_values(rows), caption=CAPTIONS.get(part, part)))
    elif data.kind in ("compare", "simulate"):
        section.paragraphs.append("The result file records no scenario file; shown: " + (
            "what its summary records." if len(data.summaries) == 1 else
            "what its summaries record (what every strategy shares; below it, each strategy's own settings)."))
        section.tables.append(Table("scenario-summary", _key_values(summary_rows(data.summaries)),
                                    caption="summary"))
        per_strategy = strategy_rows(data.summaries)
        if len(per_strategy.columns) > 1:
            section.tables.append(Table("scenario-strategies", per_strategy, caption="per strategy"))
    elif data.kind == "sweep":
        section.paragraphs.append("A sweep table: one simulated scenario per row; the swept fields:")
        section.tables.append(Table("scenario-sweep", _key_values(sweep_rows(data.table)), caption="sweep"))
    else:
        section.paragraphs.append("A validation table: one predicted and measured plan per row.")
        section.tables.append(Table("scenario-validation", _key_values(validation_rows(data.table)),
                                    caption="validation"))
    return section


def _key_values(rows: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({"field": list(rows), "value": [str(value) for value in rows.values()]})


def scenario_rows(scenario: Scenario, num_params: int | None, num_layers: int | None) -> dict[str, dict]:
    """Field -> readable value, per part of the scenario (units in the text)."""
    cluster, model, training = scenario.cluster, scenario.model, scenario.training
    gpu = cluster.gpu
    peaks = ", ".join(f"{dtype} {flops / 1e12:g} TFLOP/s" for dtype, flops in gpu.peak_flops_per_s.items())
    cluster_rows = {
        "nodes x GPUs per node": f"{cluster.num_nodes} x {cluster.gpus_per_node} = {scenario.num_gpus} GPUs",
        "GPU": f"{gpu.name}: {gpu.memory_bytes / GIB:g} GiB, {gpu.memory_bandwidth_bytes_per_s / 1e9:g} GB/s, {peaks}",
        "intra-node link": _link(cluster.intra_node_link),
        "inter-node link": _link(cluster.inter_node_link),
        "NICs per node": cluster.nics_per_node,
    }
    shown = {"num_nodes", "gpus_per_node", "gpu", "intra_node_link", "inter_node_link", "nics_per_node"}
    cluster_rows.update({key: value for key, value in cluster.model_dump(mode="json").items()
                         if key not in shown and value not in (None, {}, [])})
    source = model.name or model.file or "inline layer table"
    model_rows = {"model": source}
    if model.params:
        model_rows["parameters of the zoo factory"] = ", ".join(f"{k}={v}" for k, v in model.params.items())
    if num_layers is not None:
        model_rows["layers"] = num_layers
    if num_params is not None:
        model_rows["parameters"] = f"{num_params / 1e6:,.2f} M ({num_params:,})"
    strategy = {"kind": scenario.strategy.kind, **scenario.strategy.model_dump(mode="json", exclude_defaults=True)}
    if "bucket_size_bytes" in strategy:
        strategy["bucket_size_bytes"] = f"{scenario.strategy.bucket_size_bytes / 2**20:g} MiB"
    return {"cluster": cluster_rows, "model": model_rows,
            "strategy": strategy, "training": training.model_dump(mode="json", exclude_defaults=True)}


CAPTIONS = {"strategy": "strategy (of the file, fields not at their defaults; the report compares the strategies below)",
            "training": "training (fields not at their defaults)"}
"""A part's caption where it says more than the part's name."""


def _link(link) -> str:
    return f"{link.name}: {link.bandwidth_bytes_per_s / 1e9:g} GB/s per direction, {link.latency_s * 1e6:g} us"


SUMMARY_KEYS = ("scenario", "model", "num_gpus", "global_batch_size", "partition", "placement",
                "collective_algorithms")
"""What the scenario section shows of a compare or simulate result's summaries."""


def _value(summary: dict, key: str):
    """A summary's `key` as the report shows it: the placement "-" where the grid has no choice
    (one group or one worker a group), as the ranking table shows it."""
    if key == "placement" and key in summary and has_no_placement(summary):
        return "-"
    return summary[key]


def _shared(summaries: list[dict], key: str) -> bool:
    """Every summary records `key`, with one value."""
    return all(key in summary and _value(summary, key) == _value(summaries[0], key) for summary in summaries)


def summary_rows(summaries: list[dict]) -> dict:
    """The `SUMMARY_KEYS` values every strategy shares (all of a single summary's)."""
    return {key: _value(summaries[0], key) for key in SUMMARY_KEYS if _shared(summaries, key)}


def strategy_rows(summaries: list[dict]) -> pd.DataFrame:
    """A row per strategy: its label and the `SUMMARY_KEYS` values the strategies do not share
    (e.g. each one's partition, placement and collective algorithms); "-" where one records none."""
    own = [key for key in SUMMARY_KEYS if not _shared(summaries, key)]
    columns = {"strategy": [strategy_label(summary) for summary in summaries]}
    columns.update({key: [_cell(_value(summary, key) if key in summary else "-") for summary in summaries] for key in own})
    return pd.DataFrame(columns)


def _cell(value) -> str:
    """A summary value as table text: a count per name (collective algorithms) as "name x count"."""
    if isinstance(value, dict):
        return ", ".join(f"{name} x{count}" for name, count in value.items()) or "-"
    return str(value)


def sweep_rows(table: pd.DataFrame) -> dict:
    rows = {column: _axis_text(table, column) for column in sweep_axes(table)}
    rows["strategies (simulated)"] = ", ".join(str(v) for v in axis_values(table.dropna(subset=["strategy"]),
                                                                          "strategy"))
    ok = sweep_ok(table)
    rows["points"] = f"{len(table)} ({int(ok.sum())} simulated, {int((~ok).sum())} failed or infeasible)"
    return rows


def _axis_text(table: pd.DataFrame, column: str) -> str:
    """A swept field's values as the sweep file lists them (first appearance in point order), "-"
    for a missing one."""
    return ", ".join(dict.fromkeys(point_order(table)[column].map(lambda v: value_text(v, "-"))))


def validation_rows(table: pd.DataFrame) -> dict:
    rows = {}
    if "model" in table.columns:
        rows["models"] = ", ".join(sorted(set(table["model"].astype(str))))
    if "world_size" in table.columns:
        rows["world sizes (ranks)"] = ", ".join(str(n) for n in sorted(set(table["world_size"])))
    rows["cases"] = len(table)
    return rows

