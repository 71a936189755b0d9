"""`ghpsim report` on a scenario, a compare and a simulate result: every figure present, the
table numbers equal the simulation's, traces next to the report, bad input = one line + exit 2,
atomic output."""

from __future__ import annotations

import base64
import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ghpsim.cli import main
from simulator import load_scenario
from simulator.compare import compare
from simulator.report import plots
from simulator.tables import strategy_label

ROOT = Path(__file__).resolve().parent.parent
SMALL = str(ROOT / "scenarios" / "small_fast_dp_wins.yaml")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class _Tables(HTMLParser):
    """Cells of every <table id=...> (header row first) and the <img>/<section>/<figure> tags."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.images: list[dict] = []
        self.ids: dict[str, list[str]] = {"section": [], "figure": []}
        self.links: list[str] = []
        self._table = self._cell = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and "id" in attrs:
            self._table = self.tables.setdefault(attrs["id"], [])
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = []
        elif tag == "img":
            self.images.append(attrs)
        elif tag in self.ids and "id" in attrs:
            self.ids[tag].append(attrs["id"])
        elif tag == "a" and "href" in attrs:
            self.links.append(attrs["href"])

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._table[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None


def parse_html(path: Path) -> _Tables:
    parser = _Tables()
    parser.feed(path.read_text())
    return parser


def records(table: list[list[str]]) -> list[dict[str, str]]:
    header, *rows = table
    return [dict(zip(header, row)) for row in rows]


def run_report(capsys, *argv) -> tuple[int, str, str]:
    code = main(["report", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def slug(label: str) -> str:
    """dp (G=4 x M=1) -> dp-g4xm1 (the report's file and id naming)."""
    return re.sub(r"[^a-z0-9]+", "-", label.lower().replace(" x ", "x").replace("=", "")).strip("-")


@pytest.fixture(scope="module")
def small_results():
    return compare(load_scenario(SMALL), [("dp", None), ("mp", None), ("ghp", None)])


@pytest.fixture(scope="module")
def scenario_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("scenario_report")
    assert main(["report", SMALL, "--out", str(out), "--json"]) == 0
    return out


def assert_ms(text: str, seconds: float) -> None:
    assert float(text.replace(",", "")) == pytest.approx(seconds * 1e3, abs=0.0005 + 1e-9), (text, seconds)


def assert_ranking_matches(table: list[list[str]], summaries: list[dict]) -> None:
    """The ranking table, row by row, against the summaries sorted by step time."""
    rows = records(table)
    assert len(rows) == len(summaries)
    for position, (row, summary) in enumerate(zip(rows, sorted(summaries, key=lambda s: s["step_time_s"])), 1):
        devices = summary["devices"]
        assert row["#"] == str(position)
        assert row["strategy"] == strategy_label(summary)
        assert_ms(row["step (ms)"], summary["step_time_s"])
        assert float(row["throughput (samples/s)"].replace(",", "")) == pytest.approx(
            summary["global_batch_size"] / summary["step_time_s"], abs=0.05)
        assert float(row["speedup (x)"]) == pytest.approx(summary["speedup"], abs=0.005)
        for column, key in (("compute (ms)", "compute_s"), ("comm (ms)", "comm_s"), ("idle (ms)", "idle_s")):
            assert_ms(row[column], sum(device[key] for device in devices) / len(devices))
        assert float(row["inter-node (MB)"].replace(",", "")) == pytest.approx(summary["bytes_per_tier"]["inter"] / 1e6, abs=0.05)


# ----------------------------------------------------------------------------- scenario input


def test_scenario_report_has_every_section_and_figure(scenario_report, small_results):
    html = parse_html(scenario_report / "report.html")
    assert html.ids["section"] == ["scenario", "ranking", "breakdown", "timeline", "memory"]
    labels = [strategy_label(result.summary) for result in small_results]
    expected = ["fig-breakdown", *(f"fig-timeline-{slug(label)}" for label in labels), "fig-memory"]
    assert html.ids["figure"] == expected
    assert len(html.images) == len(expected)
    for image, figure_id in zip(html.images, expected):
        prefix = "data:image/png;base64,"
        assert image["src"].startswith(prefix)
        png = base64.b64decode(image["src"][len(prefix):])
        assert png.startswith(PNG_SIGNATURE)
        # the Markdown twin shows the same image as a file next to it
        assert (scenario_report / "figures" / f"{figure_id}.png").read_bytes() == png
        assert f"](figures/{figure_id}.png)" in (scenario_report / "report.md").read_text()


def test_scenario_report_ranking_table_equals_the_simulation(scenario_report, small_results):
    html = parse_html(scenario_report / "report.html")
    assert_ranking_matches(html.tables["ranking-table"], [result.summary for result in small_results])
    assert [row["strategy"] for row in records(html.tables["ranking-table"])][0] == "dp (G=4 x M=1)"  # DP wins here


def test_scenario_report_renders_the_scenario(scenario_report):
    html = parse_html(scenario_report / "report.html")
    cluster = {row["field"]: row["value"] for row in records(html.tables["scenario-cluster"])}
    assert cluster["nodes x GPUs per node"] == "1 x 4 = 4 GPUs"
    assert cluster["GPU"].startswith("V100: 32 GiB")
    training = {row["field"]: row["value"] for row in records(html.tables["scenario-training"])}
    assert training["global_batch_size"] == "128" and training["optimizer"] == "momentum"
    model = {row["field"]: row["value"] for row in records(html.tables["scenario-model"])}
    assert model["model"] == "resnet20"
    text = (scenario_report / "report.html").read_text()
    from importlib.metadata import version
    assert f"<td>ghpsim version</td><td>{version('ghpsim')}</td>" in text


def test_scenario_report_writes_and_links_perfetto_traces(scenario_report, small_results):
    links = parse_html(scenario_report / "report.html").links
    for result in small_results:
        path = f"traces/{slug(strategy_label(result.summary))}.trace.json"
        assert path in links
        events = json.loads((scenario_report / path).read_text())["traceEvents"]
        spans = [event for event in events if event["ph"] == "X"]
        assert len(spans) == len(result.spans)
        assert max(event["ts"] + event["dur"] for event in spans) == pytest.approx(result.step_time_s * 1e6)


def test_memory_table_against_capacity(scenario_report, small_results):
    rows = records(parse_html(scenario_report / "report.html").tables["memory-table"])
    by_label = {row["strategy"]: row for row in rows}
    for result in small_results:
        row = by_label[strategy_label(result.summary)]
        peak = max(device["peak_memory_bytes"] for device in result.summary["devices"])
        assert float(row["peak memory, largest rank (GiB)"]) == pytest.approx(peak / 2**30, abs=0.0005)
        assert row["capacity (GiB)"] == "32.000"  # V100 32 GB
        assert row["fits"] == "yes"


def test_no_temporary_files_left(scenario_report):
    names = [path.name for path in scenario_report.rglob("*")]
    assert not [name for name in names if name.endswith(".tmp")]
    assert sorted(p.name for p in scenario_report.iterdir()) == ["figures", "report.html", "report.md", "traces"]


# ----------------------------------------------------------------------------- result inputs


def test_compare_json_input(capsys, tmp_path):
    assert main(["compare", SMALL, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    source = tmp_path / "compare.json"
    source.write_text(json.dumps(document))
    code, out, err = run_report(capsys, str(source), "--out", str(tmp_path / "r"), "--json", "--title", "T & co")
    assert code == 0, err
    written = json.loads(out)
    assert written["kind"] == "compare"
    html = parse_html(tmp_path / "r" / "report.html")
    assert_ranking_matches(html.tables["ranking-table"], document["summaries"])
    # the ranking is `ghpsim compare`'s own table
    for row, result in zip(records(html.tables["ranking-table"]), document["results"]):
        assert row["strategy"] == result["strategy"]
        assert_ms(row["step (ms)"], result["step_time_s"])
    assert html.ids["figure"] == ["fig-breakdown", "fig-memory"] == written["figures"]
    text = (tmp_path / "r" / "report.html").read_text()
    assert "<title>T &amp; co</title>" in text
    assert "no span table" in text
    assert not (tmp_path / "r" / "traces").exists()


def test_simulate_json_input_without_memory_figures(capsys, tmp_path):
    assert main(["simulate", SMALL, "--set", "strategy.kind=mp", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    for device in summary["devices"]:
        device.pop("peak_memory_bytes", None)
    source = tmp_path / "simulate.json"
    source.write_text(json.dumps(summary))
    code, _, err = run_report(capsys, str(source), "--out", str(tmp_path / "r"))
    assert code == 0, err
    html = parse_html(tmp_path / "r" / "report.html")
    assert_ranking_matches(html.tables["ranking-table"], [summary])
    assert html.ids["figure"] == ["fig-breakdown"]
    assert "The summary has no memory figures" in (tmp_path / "r" / "report.html").read_text()
    assert "The summary has no memory figures" in (tmp_path / "r" / "report.md").read_text()


# ----------------------------------------------------------------------------- bad input


def _bad_inputs(tmp_path: Path) -> dict[str, list[str]]:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"a": 1}')
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    (tmp_path / "empty_folder").mkdir()
    (tmp_path / "bad.yaml").write_text("cluster: [1, 2\n")
    (tmp_path / "c.json").write_text('{"scenario": "x", "results": [], "summaries": [{"step_time_s": 1}]}')
    return {
        "missing": [str(tmp_path / "nope.yaml")],
        "extension": [str(tmp_path / "notes.txt")],
        "json syntax": [str(tmp_path / "broken.json")],
        "json shape": [str(tmp_path / "other.json")],
        "summary keys": [str(tmp_path / "c.json")],
        "csv columns": [str(tmp_path / "other.csv")],
        "folder": [str(tmp_path / "empty_folder")],
        "yaml": [str(tmp_path / "bad.yaml")],
        "set on json": [str(tmp_path / "other.json"), "--set", "training.global_batch_size=8"],
        "strategies": [SMALL, "--strategies", "dp,xyz"],
    }


@pytest.mark.parametrize("case", ["missing", "extension", "json syntax", "json shape", "summary keys",
                                  "csv columns", "folder", "yaml", "set on json", "strategies"])
def test_bad_input_one_line_exit_2(capsys, tmp_path, case):
    argv = _bad_inputs(tmp_path)[case]
    out = tmp_path / "out"
    code, stdout, err = run_report(capsys, *argv, "--out", str(out))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "building the report" not in err, err  # the error is the only line
    assert lines[0].startswith("ghpsim: error: ") and "Traceback" not in err
    assert not out.exists()


# ----------------------------------------------------------------------------- atomic output


def test_failure_while_rendering_writes_nothing(capsys, tmp_path, monkeypatch, scenario_report):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.html").write_text("previous report")

    def broken(*_args, **_kwargs):
        raise RuntimeError("plot failed")
    monkeypatch.setattr(plots, "plot_gantt", broken)
    with pytest.raises(RuntimeError, match="plot failed"):
        main(["report", SMALL, "--strategies", "dp", "--out", str(out)])
    assert [path.name for path in out.rglob("*")] == ["report.html"]
    assert (out / "report.html").read_text() == "previous report"


def test_failure_while_writing_leaves_no_partial_file(tmp_path, monkeypatch):
    out = tmp_path / "out"
    real_replace = os.replace
    calls = []

    def replace_then_fail(source, target):
        calls.append(target)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real_replace(source, target)
    monkeypatch.setattr(os, "replace", replace_then_fail)
    assert main(["report", SMALL, "--strategies", "dp", "--out", str(out)]) == 2
    files = sorted(path for path in out.rglob("*") if path.is_file())
    assert len(files) == 2 and not any(path.name.endswith(".tmp") for path in files)
    for path in files:
        assert path.read_bytes().startswith(PNG_SIGNATURE)  # the figures come first, whole
    assert not (out / "report.html").exists()


# ----------------------------------------------------------------------------- calibration profile


def test_scenario_with_profile_uses_the_profile_costs(capsys, tmp_path):
    """--profile: each strategy's step time is the simulation with the profile's costs (as
    `ghpsim validate` predicts), and the report names the profile."""
    from simulator.compare import with_strategy
    from simulator.model_source import resolve_workload
    from simulator.profile import load_profile
    from simulator.profile_costs import ProfileCosts
    from simulator.simulate import simulate

    scenario_path = ROOT / "scenarios" / "validation" / "mlp_cpu.yaml"
    profile_path = ROOT / "reports" / "profiles" / "mlp_cpu_ws4.json"
    code, _, err = run_report(capsys, str(scenario_path), "--profile", str(profile_path),
                              "--strategies", "dp,ghp:2", "--out", str(tmp_path / "r"))
    assert code == 0, err
    scenario = load_scenario(scenario_path)
    workload = resolve_workload(scenario.model, scenario.base_dir)
    costs = ProfileCosts(load_profile(profile_path), workload)
    expected = {f"{kind} (G={groups} x M={4 // groups})":
                simulate(with_strategy(scenario, kind, groups), costs=costs, workload=workload).step_time_s
                for kind, groups in (("dp", 4), ("ghp", 2))}
    html = parse_html(tmp_path / "r" / "report.html")
    rows = records(html.tables["ranking-table"])
    assert sorted(row["strategy"] for row in rows) == sorted(expected)
    for row in rows:
        assert_ms(row["step (ms)"], expected[row["strategy"]])
    assert f"calibration profile {profile_path}" in (tmp_path / "r" / "report.html").read_text()


def test_overrides_apply_to_a_scenario_input(capsys, tmp_path):
    code, _, err = run_report(capsys, SMALL, "--set", "cluster.gpus_per_node=2", "--strategies", "dp,mp",
                              "--out", str(tmp_path / "r"))
    assert code == 0, err
    rows = records(parse_html(tmp_path / "r" / "report.html").tables["ranking-table"])
    assert [row["strategy"] for row in rows] == ["dp (G=2 x M=1)", "mp (G=1 x M=2)"]


def test_the_timeline_draws_a_span_too_short_to_see_a_few_pixels_wide():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    spans = pd.DataFrame([{"rank": 0, "stream": "compute", "kind": "F", "start_s": 0.0, "end_s": 1.0},
                          {"rank": 1, "stream": "send", "kind": "send", "start_s": 0.5, "end_s": 0.5 + 1e-6}])
    figure, axis = plt.subplots()
    plots.plot_gantt(spans, axis)
    drawn_ms = sorted(float(bars.get_paths()[0].get_extents().width) for bars in axis.collections)
    plt.close(figure)
    assert drawn_ms == pytest.approx([plots.MIN_SPAN_SHARE * 1e3, 1e3])  # the 1 us send at 0.3 % of the step
