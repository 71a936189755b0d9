"""`ghpsim report`: the "costs" line names the cost model the result records (a compare result's
`compute_model`, a sweep store's per point; nothing guessed); sweep plots and tables follow the
sweep's order (numbers ascending, categories as the sweep lists them); a compare result's scenario
section keeps each strategy's own settings out of the shared summary."""

from __future__ import annotations

import json
import shutil

from matplotlib.figure import Figure

from ghpsim.cli import main
from simulator.report import plots
from simulator.report.inputs import load_report_input
from simulator.report.table_sections import best_points, sweep_lines
from tests.test_report import SMALL, parse_html, records, run_report
from tests.test_report_input import _cli_json

LINK = "cluster.inter_node_link"
GROUPS = [1, 2, 4, 8, 16]
LINKS = ["10gbe", "25gbe", "100gbe", "ib-hdr"]  # as the sweep file lists them; not in string order


def _costs_line(report_dir) -> str:
    return next(line for line in (report_dir / "report.md").read_text().splitlines() if line.startswith("- costs:"))


def _report(capsys, source, out) -> None:
    code, _, err = run_report(capsys, str(source), "--out", str(out))
    assert code == 0, err


# ----------------------------------------------------------------------------- defect 1: the cost model


def test_compare_result_names_its_recorded_cost_model(capsys, tmp_path):
    document = _cli_json("compare", SMALL, "--json")
    recorded = document["summaries"][0]["compute_model"]
    assert recorded["model"] == "kernel"  # a V100 under costs.model auto
    (tmp_path / "cmp.json").write_text(json.dumps(document))
    _report(capsys, tmp_path / "cmp.json", tmp_path / "r")
    line = _costs_line(tmp_path / "r")
    assert f"kernel model ({recorded['note']})" in line and "analytic" not in line
    for summary in document["summaries"]:
        del summary["compute_model"]
    (tmp_path / "old.json").write_text(json.dumps(document))
    _report(capsys, tmp_path / "old.json", tmp_path / "r_old")
    line = _costs_line(tmp_path / "r_old")
    assert "not recorded" in line and "analytic" not in line


def test_sweep_report_names_the_cost_models_its_store_records(capsys, tmp_path):
    spec = tmp_path / "models.yaml"
    spec.write_text(f"name: models\nbase: {SMALL}\naxes:\n  costs.model: [analytic, kernel, kernel]\n"
                    "  strategy.kind: [dp, mp]\n")
    assert main(["sweep", str(spec), "--out", str(tmp_path / "sweep"), "--workers", "1", "--no-progress"]) == 0
    _report(capsys, tmp_path / "sweep", tmp_path / "r")
    line = _costs_line(tmp_path / "r")
    assert "analytic model (costs.model analytic) for 2 points" in line
    assert "kernel model (costs.model kernel: volta kernel figures" in line and "for 4 points" in line
    assert sorted(path.name for path in (tmp_path / "sweep").iterdir()) == ["results.csv", "sweep.sqlite"]
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(tmp_path / "sweep" / "results.csv", alone / "results.csv")
    _report(capsys, alone, tmp_path / "r_alone")
    line = _costs_line(tmp_path / "r_alone")
    assert "not recorded in results.csv" in line and "analytic" not in line


# ----------------------------------------------------------------------------- defect 2: the sweep's order


def _sweep_csv(rows_order=None) -> str:
    """A ghp sweep over G x links (point order: the last axis fastest); throughput grows with the
    link's position in LINKS and with G."""
    lines = ["point,strategy.num_groups,cluster.inter_node_link,status,error,strategy,num_gpus,num_groups,"
             "step_time_s,throughput_samples_per_s,speedup"]
    point = 0
    for groups in GROUPS:
        for rank, link in enumerate(LINKS):
            throughput = 100.0 * groups + 10.0 * rank
            lines.append(f"{point},{groups},{link},ok,,ghp,16,{groups},{64 / throughput},{throughput},"
                         f"{throughput / 100}")
            point += 1
    header, body = lines[0], lines[1:]
    return "\n".join([header, *(body if rows_order is None else [body[i] for i in rows_order])]) + "\n"


def test_sweep_plots_and_tables_follow_the_sweep_order(capsys, tmp_path):
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / "results.csv").write_text(_sweep_csv(rows_order=list(range(19, -1, -1))))  # rows reversed
    _report(capsys, folder, tmp_path / "r")
    html = parse_html(tmp_path / "r" / "report.html")
    expected = [f"ghp G={groups}" for groups in GROUPS]
    assert [row["strategy"] for row in records(html.tables["scaling-table"])] == expected
    swept = {row["field"]: row["value"] for row in records(html.tables["scenario-sweep"])}
    assert swept[LINK] == ", ".join(LINKS) and swept["strategy.num_groups"] == "1, 2, 4, 8, 16"

    table = load_report_input(folder).table
    axis = Figure().subplots()
    plots.plot_sweep_axis(best_points(sweep_lines(table, exclude=LINK), [LINK, "strategy"]), axis, LINK)
    assert [tick.get_text() for tick in axis.get_xticklabels()] == LINKS
    assert [text.get_text() for text in axis.get_legend().get_texts()] == expected
    for line, groups in zip(axis.get_lines(), GROUPS):  # each line left to right in the sweep's order
        assert list(line.get_xdata()) == [0, 1, 2, 3]
        assert list(line.get_ydata()) == [100.0 * groups + 10.0 * rank for rank in range(4)]

    axis = Figure().subplots()
    plots.plot_throughput_scaling(best_points(sweep_lines(table), ["strategy", "num_gpus"]), axis)
    assert [text.get_text() for text in axis.get_legend().get_texts()] == expected


# ----------------------------------------------------------------------------- defect 3: per-strategy settings


def test_compare_scenario_section_shows_strategy_settings_per_strategy(capsys, tmp_path):
    document = _cli_json("compare", SMALL, "--json")
    summaries = sorted(document["summaries"], key=lambda summary: summary["step_time_s"])
    assert len({json.dumps(summary["partition"]) for summary in summaries}) > 1
    (tmp_path / "cmp.json").write_text(json.dumps(document))
    _report(capsys, tmp_path / "cmp.json", tmp_path / "r")
    html = parse_html(tmp_path / "r" / "report.html")
    shared = {row["field"]: row["value"] for row in records(html.tables["scenario-summary"])}
    assert "partition" not in shared
    assert shared["num_gpus"] == str(summaries[0]["num_gpus"])
    rows = records(html.tables["scenario-strategies"])
    assert [row["partition"] for row in rows] == [str(summary["partition"]) for summary in summaries]
    assert len(rows) == len(summaries) == len({row["strategy"] for row in rows})
