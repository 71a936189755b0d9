"""`ghpsim report` on a sweep table and a validation table: the figures (scaling curves, one per
swept field; predicted vs measured, error per case) and the numbers (efficiency = speedup / GPUs,
MAPE) against hand-computed values."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from ghpsim.cli import main
from tests.test_report import ROOT, parse_html, records, run_report

SMALL = ROOT / "scenarios" / "small_fast_dp_wins.yaml"

# Two strategies at 4 and 8 GPUs, the second dp point at 8 GPUs slower than the first (a second
# value of the swept link), and one failed point. Speedups chosen so that efficiency = speedup / N
# is exact: dp 3.6/4 = 90 %, 6.0/8 = 75 %; mp 1.0/4 = 25 %, 1.2/8 = 15 %.
SWEEP_CSV = """\
point,cluster.num_nodes,cluster.inter_node_link,status,error,strategy,num_gpus,num_groups,workers_per_group,step_time_s,throughput_samples_per_s,speedup
0,1,ib-edr,ok,,dp,4,4,1,0.010,12800.0,3.6
1,1,ib-edr,ok,,mp,4,1,4,0.036,3555.5,1.0
2,2,ib-edr,ok,,dp,8,8,1,0.006,21333.3,6.0
3,2,ib-edr,ok,,mp,8,1,8,0.030,4266.7,1.2
4,2,10gbe,ok,,dp,8,8,1,0.050,2560.0,0.72
5,2,10gbe,failed,point 5: strategy.num_groups: too many stages,mp,,,,,,
"""


@pytest.fixture(scope="module")
def sweep_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep")
    (folder / "results.csv").write_text(SWEEP_CSV)
    assert main(["report", str(folder), "--out", str(folder / "report")]) == 0
    return folder / "report"


def test_sweep_report_figures(sweep_report):
    html = parse_html(sweep_report / "report.html")
    assert html.ids["section"] == ["scenario", "scaling", "axes", "sweep-rows"]
    expected = ["fig-throughput", "fig-efficiency", "fig-axis-cluster-num-nodes", "fig-axis-cluster-inter-node-link"]
    assert html.ids["figure"] == expected
    assert len(html.images) == 4
    for figure_id in expected:
        assert (sweep_report / "figures" / f"{figure_id}.png").is_file()


def test_a_sweep_at_one_gpu_count_draws_no_scaling(tmp_path):
    fixed = "\n".join(line for line in SWEEP_CSV.splitlines() if ",4," not in line) + "\n"  # 8 GPUs only
    (tmp_path / "results.csv").write_text(fixed)
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "report")]) == 0
    html = parse_html(tmp_path / "report" / "report.html")
    assert html.ids["figure"] == ["fig-axis-cluster-num-nodes", "fig-axis-cluster-inter-node-link"]
    assert "Every point has 8 GPUs: no scaling to draw." in (tmp_path / "report" / "report.md").read_text()


def test_fields_swept_as_one_axis_are_grouped_and_drawn_as_one():
    from simulator.report.sweep_order import swept_together
    zipped = pd.DataFrame({"a": [1, 1, 1, 2, 2, 2], "kind": ["dp", "ghp", "ghp"] * 2, "groups": [None, 4, 16] * 2,
                           "fixed": ["x"] * 6})
    assert swept_together(zipped, ["a", "kind", "groups", "fixed"]) == [["a"], ["kind", "groups"], ["fixed"]]
    product = pd.DataFrame({"a": [1, 1, 2, 2], "b": ["p", "q", "p", "q"]})
    assert swept_together(product, ["a", "b"]) == [["a"], ["b"]]


def test_a_combined_axis_gets_one_figure_of_its_value_tuples(tmp_path):
    header = "point,cluster.num_nodes,strategy.kind,strategy.num_groups,status,error,strategy,num_gpus,step_time_s,throughput_samples_per_s,speedup"
    rows = [f"{point},{nodes},{kind},{groups},ok,,{kind},{4 * nodes},0.01,{rate},{speedup}"
            for point, (nodes, kind, groups, rate, speedup) in enumerate(
                [(1, "dp", "", 100.0, 3.0), (1, "ghp", 2, 90.0, 2.7), (2, "dp", "", 180.0, 5.4), (2, "ghp", 2, 150.0, 4.5)])]
    (tmp_path / "results.csv").write_text("\n".join([header, *rows]) + "\n")
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "report")]) == 0
    html = parse_html(tmp_path / "report" / "report.html")
    assert html.ids["figure"] == ["fig-throughput", "fig-efficiency", "fig-axis-cluster-num-nodes",
                                  "fig-axis-strategy-kind-strategy-num-groups"]
    from simulator.report.table_sections import combined_points
    table = pd.read_csv(tmp_path / "results.csv")
    points = combined_points(table, ["strategy.kind", "strategy.num_groups"], "kind, groups")
    assert [str(value) for value in points["kind, groups"]] == ["dp / -", "ghp / 2"]
    assert list(points["throughput_samples_per_s"]) == [180.0, 150.0]  # the best over the node counts


def test_a_swept_model_is_a_line_of_its_own_never_a_best_over_it():
    from simulator.report.table_sections import scaling_frame
    table = pd.DataFrame({"point": range(4), "model.name": ["vgg16", "resnet50"] * 2, "status": ["ok"] * 4,
                          "strategy": ["dp"] * 4, "num_gpus": [4, 4, 8, 8], "step_time_s": [0.1] * 4,
                          "throughput_samples_per_s": [760.0, 1290.0, 135.0, 670.0], "speedup": [3.3, 3.5, 0.6, 1.8]})
    frame = scaling_frame(table)
    assert [(str(row.strategy), row.num_gpus, row.throughput_samples_per_s) for row in frame.itertuples()] == [
        ("dp model=vgg16", 4, 760.0), ("dp model=vgg16", 8, 135.0),
        ("dp model=resnet50", 4, 1290.0), ("dp model=resnet50", 8, 670.0)]


def test_sweep_scaling_table_is_best_point_and_efficiency(sweep_report):
    rows = records(parse_html(sweep_report / "report.html").tables["scaling-table"])
    got = [(row["strategy"], row["GPUs"], row["throughput (samples/s)"], row["efficiency (%)"]) for row in rows]
    assert got == [("dp", "4", "12800.0", "90.0"), ("dp", "8", "21333.3", "75.0"),
                   ("mp", "4", "3555.5", "25.0"), ("mp", "8", "4266.7", "15.0")]


def test_sweep_rows_table_matches_the_csv(sweep_report, tmp_path):
    csv = tmp_path / "results.csv"
    csv.write_text(SWEEP_CSV)
    source = pd.read_csv(csv)
    rows = records(parse_html(sweep_report / "report.html").tables["sweep-table"])
    assert len(rows) == len(source)
    for row, (_, expected) in zip(rows, source.iterrows()):
        assert row["cluster.inter_node_link"] == expected["cluster.inter_node_link"]
        assert row["status"] == expected["status"]
        if expected["status"] == "ok":
            assert float(row["step (ms)"]) == pytest.approx(expected["step_time_s"] * 1e3, abs=5e-4)
            assert float(row["throughput (samples/s)"]) == pytest.approx(expected["throughput_samples_per_s"], abs=0.05)
            assert row["num_gpus"] == str(int(expected["num_gpus"]))
        else:
            assert row["step (ms)"] == "" and row["error"] == expected["error"]
    swept = {row["field"]: row["value"] for row in records(parse_html(sweep_report / "report.html").tables["scenario-sweep"])}
    assert swept["cluster.inter_node_link"] == "ib-edr, 10gbe"
    assert swept["points"] == "6 (5 simulated, 1 failed or infeasible)"


def test_report_of_a_real_sweep(capsys, tmp_path):
    """`ghpsim sweep` output (its folder) goes straight into `ghpsim report`."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(f"name: tiny\nbase: {SMALL}\naxes:\n  cluster.gpus_per_node: [2, 4]\n"
                    "  strategy.kind: [dp, mp]\n")
    assert main(["sweep", str(spec), "--out", str(tmp_path / "sweep"), "--workers", "1", "--no-progress"]) == 0
    capsys.readouterr()
    code, out, err = run_report(capsys, str(tmp_path / "sweep"), "--out", str(tmp_path / "r"), "--json")
    assert code == 0, err
    assert json.loads(out)["kind"] == "sweep"
    html = parse_html(tmp_path / "r" / "report.html")
    assert html.ids["figure"] == ["fig-throughput", "fig-efficiency", "fig-axis-cluster-gpus-per-node",
                                  "fig-axis-strategy-kind"]
    source = pd.read_csv(tmp_path / "sweep" / "results.csv")
    rows = records(html.tables["sweep-table"])
    assert [float(row["step (ms)"]) for row in rows] == pytest.approx(list(source["step_time_s"] * 1e3), abs=5e-4)
    for row in records(html.tables["scaling-table"]):
        point = source[(source["strategy"] == row["strategy"]) & (source["num_gpus"] == int(row["GPUs"]))].iloc[0]
        assert float(row["efficiency (%)"]) == pytest.approx(100 * point["speedup"] / point["num_gpus"], abs=0.05)


# ----------------------------------------------------------------------------- validation

# errors: (8 - 10) / 10 = -20 %, (22 - 20) / 20 = +10 %, (9 - 12) / 12 = -25 %: MAPE 55 / 3 = 18.3 %
VALIDATION_ROWS = [
    {"strategy": "dp (G=2 x M=1)", "world_size": 2, "predicted_s": 0.008, "measured_s": 0.010, "error_pct": -20.0},
    {"strategy": "mp (G=1 x M=2)", "world_size": 2, "predicted_s": 0.022, "measured_s": 0.020, "error_pct": 10.0},
    {"strategy": "ghp (G=2 x M=2)", "world_size": 4, "predicted_s": 0.009, "measured_s": 0.012, "error_pct": -25.0},
]


def _check_validation_report(folder: Path) -> None:
    html = parse_html(folder / "report.html")
    assert html.ids["section"] == ["scenario", "validation"]
    assert html.ids["figure"] == ["fig-validation-scatter", "fig-validation-error"]
    assert len(html.images) == 2
    rows = records(html.tables["validation-table"])
    assert [(r["case"], r["ranks"], r["predicted (ms)"], r["measured (ms)"], r["error (%)"]) for r in rows] == [
        ("dp (G=2 x M=1)", "2", "8.000", "10.000", "-20.0"), ("mp (G=1 x M=2)", "2", "22.000", "20.000", "+10.0"),
        ("ghp (G=2 x M=2)", "4", "9.000", "12.000", "-25.0")]
    text = (folder / "report.html").read_text()
    assert "MAPE 18.3 % over 3 cases; worst |error| 25.0 % (ghp (G=2 x M=2))" in text


def test_validation_csv_report(capsys, tmp_path):
    source = tmp_path / "validation" / "toy.csv"
    source.parent.mkdir()
    pd.DataFrame(VALIDATION_ROWS).to_csv(source, index=False)
    code, _, err = run_report(capsys, str(source), "--out", str(tmp_path / "r"))
    assert code == 0, err
    _check_validation_report(tmp_path / "r")


def test_validation_json_report(capsys, tmp_path):
    """`ghpsim validate --json` output: {"scenario", "mape_pct", "rows"}."""
    source = tmp_path / "toy.json"
    source.write_text(json.dumps({"scenario": "toy", "mape_pct": 55 / 3, "rows": VALIDATION_ROWS}))
    code, _, err = run_report(capsys, str(source), "--out", str(tmp_path / "r"))
    assert code == 0, err
    _check_validation_report(tmp_path / "r")


def test_committed_validation_table_mape(capsys, tmp_path):
    """reports/validation_cpu.csv (15 cases, 3 models): MAPE and worst case as computed from the CSV."""
    code, _, err = run_report(capsys, str(ROOT / "reports" / "validation_cpu.csv"), "--out", str(tmp_path / "r"))
    assert code == 0, err
    rows = records(parse_html(tmp_path / "r" / "report.html").tables["validation-table"])
    assert len(rows) == 15 and rows[0]["case"] == "mlp_cpu dp (G=2 x M=1)"  # model named: several models
    errors = pd.read_csv(ROOT / "reports" / "validation_cpu.csv")["error_pct"].abs()
    expected = f"MAPE {errors.mean():.1f} % over {len(errors)} cases; worst |error| {errors.max():.1f} %"
    assert expected in (tmp_path / "r" / "report.md").read_text()


def test_sweep_with_no_simulated_point(capsys, tmp_path):
    failed = "\n".join(line for line in SWEEP_CSV.splitlines() if line.startswith(("point", "5,")))
    (tmp_path / "results.csv").write_text(failed + "\n")
    code, _, err = run_report(capsys, str(tmp_path / "results.csv"), "--out", str(tmp_path / "r"))
    assert code == 0, err
    html = parse_html(tmp_path / "r" / "report.html")
    assert html.images == [] and html.ids["figure"] == []
    assert "No point of the sweep was simulated" in (tmp_path / "r" / "report.html").read_text()
    assert records(html.tables["sweep-table"])[0]["status"] == "failed"
