"""The seed-paper gallery (`ghpsim gallery`): entries built at reduced sizes (--quick) carry the
paper's claims, every figure, and tables whose numbers equal independent simulations of the same
points (and the committed convergence CSV); output is byte-identical on re-run; bad input = one
line + exit 2."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from ghpsim.cli import main
from simulator import load_scenario, simulate
from simulator.report.gallery import ENTRIES, QUICK_NOTE, build_entry, index_markdown
from simulator.report.gallery_claims import VERDICTS, Claim
from simulator.report.render import report_files
from tests.test_report import parse_html, records

ROOT = Path(__file__).resolve().parent.parent
HYPARFLOW = ROOT / "scenarios" / "gallery_hyparflow_resnet1001_skx.yaml"
VGG16 = ROOT / "scenarios" / "pipeline_vgg16_1f1b_pcie.yaml"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(folder, the command's JSON output) of three entries at reduced sizes."""
    out = tmp_path_factory.mktemp("gallery")
    (out / "laysa" / "figures").mkdir(parents=True)
    (out / "laysa" / "figures" / "fig-renamed-long-ago.png").write_bytes(PNG_SIGNATURE)
    (out / "laysa" / "report.md").write_text(  # an earlier gallery report, which wrote that figure
        "# Gallery: LaySA\n\n- ghpsim version: 0.1.0\n\n![renamed](figures/fig-renamed-long-ago.png)\n")
    (out / "laysa" / "notes.txt").write_text("kept: not a gallery output")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["gallery", "--out", str(out), "--only", "hyparflow,spectrain,laysa", "--quick", "--json"]) == 0
    return out, json.loads(stdout.getvalue())


@pytest.fixture(scope="module")
def gallery(built):
    return built[0]


@pytest.fixture(scope="module")
def laysa_entry():
    return build_entry("laysa", quick=True)


def _hyparflow_point(nodes: int, kind: str, replicas: int | None = None) -> dict:
    """One point of the HyPar-Flow scaling written out by hand: 32 samples per node; gpipe with
    m = 8 micro-batches per replica."""
    overrides = [f"cluster.num_nodes={nodes}", f"training.global_batch_size={32 * nodes}", f"strategy.kind={kind}"]
    overrides += (["strategy.num_groups=null", "strategy.num_microbatches=1"] if kind == "dp"
                  else [f"strategy.num_groups={replicas}", "strategy.num_microbatches=8"])
    return simulate(load_scenario(HYPARFLOW, overrides)).summary


def test_every_figure_is_present_and_linked(gallery):
    for name in ("hyparflow", "spectrain"):
        folder = gallery / name
        html = parse_html(folder / "report.html")
        assert html.images and all(image["src"].startswith("data:image/png;base64,") for image in html.images)
        assert all(base64.b64decode(image["src"].split(",", 1)[1]).startswith(PNG_SIGNATURE) for image in html.images)
        markdown = (folder / "report.md").read_text()
        linked = re.findall(r"!\[[^\]]*\]\((figures/[^)]+\.png)\)", markdown)
        assert sorted(linked) == sorted(f"figures/{figure_id}.png" for figure_id in html.ids["figure"])
        assert all((folder / path).read_bytes().startswith(PNG_SIGNATURE) for path in linked)
        assert {"paper", "claims", "reasons", "reproduce"} <= set(html.ids["section"])
        assert QUICK_NOTE in markdown  # a reduced run says so


def test_claims_table_states_the_papers_figures_beside_ours(gallery):
    claims = records(parse_html(gallery / "hyparflow" / "report.html").tables["claims-table"])
    assert [row["paper"] for row in claims[:2]] == ["110x at 128 nodes", "up to 1.6x"]
    assert all(row["verdict"] in VERDICTS for row in claims)
    best = records(parse_html(gallery / "hyparflow" / "report.html").tables["best-table"])
    top = best[-1]  # the largest node count of the run (4 with --quick)
    assert f"{top['hybrid speedup (x)']}x at {top['nodes']} nodes" in claims[0]["ours (simulated)"]
    ratios = [float(row["hybrid / DP (x)"]) for row in best if row["hybrid / DP (x)"] != "-"]
    assert f"at most {max(ratios):.2f}x" in claims[1]["ours (simulated)"]
    spectrain = records(parse_html(gallery / "spectrain" / "report.html").tables["claims-table"])
    assert spectrain[0]["paper"] == "up to 8.91x"


def test_hyparflow_tables_equal_independent_simulations(gallery):
    html = parse_html(gallery / "hyparflow" / "report.html")
    points = {(row["nodes"], row["strategy"]): row for row in records(html.tables["scaling-table"])}
    one, dp4 = _hyparflow_point(1, "dp"), _hyparflow_point(4, "dp")
    hybrid4 = _hyparflow_point(4, "gpipe", replicas=2)  # 2 partitions x 2 replicas
    row = points[("4", "DP")]
    assert float(row["step (ms)"]) == pytest.approx(dp4["step_time_s"] * 1e3, abs=0.005)
    assert float(row["samples/s"]) == pytest.approx(dp4["throughput_samples_per_s"], abs=0.05)
    assert float(row["speedup over 1 node (x)"]) == pytest.approx(
        dp4["throughput_samples_per_s"] / one["throughput_samples_per_s"], abs=0.005)
    row = points[("4", "2 partitions x 2 replicas, m=8")]
    assert row["batch"] == "128"
    assert float(row["samples/s"]) == pytest.approx(hybrid4["throughput_samples_per_s"], abs=0.05)
    assert float(row["vs DP (x)"]) == pytest.approx(
        hybrid4["throughput_samples_per_s"] / dp4["throughput_samples_per_s"], abs=0.005)
    assert {nodes for nodes, _ in points} == {"1", "2", "4"}
    scaling = pd.read_csv(gallery / "hyparflow" / "data" / "scaling.csv")  # the raw numbers, unrounded
    dp_row = scaling[(scaling["nodes"] == 4) & (scaling["partitions"] == 1)].iloc[0]
    assert dp_row["step_time_s"] == pytest.approx(dp4["step_time_s"], rel=1e-12)


def test_spectrain_tables_equal_simulations_and_the_convergence_csv(gallery):
    html = parse_html(gallery / "spectrain" / "report.html")
    setting = {row["strategy"]: row for row in records(html.tables["setting-table"])}
    dp = simulate(load_scenario(VGG16, ["strategy.kind=dp"])).summary
    spectrain = simulate(load_scenario(VGG16, ["strategy.kind=spectrain"])).summary
    assert float(setting["dp"]["step (ms)"]) == pytest.approx(dp["step_time_s"] * 1e3, abs=0.005)
    assert float(setting["spectrain"]["vs DP (x)"]) == pytest.approx(
        spectrain["throughput_samples_per_s"] / dp["throughput_samples_per_s"], abs=0.005)
    assert setting["spectrain"]["staleness (updates)"] == "3"  # 4 stages: N - 1 on the first
    curves = pd.read_csv(ROOT / "reports" / "convergence.csv")
    rows = curves[(curves["model"] == "cnn") & (curves["stages"] == 4) & (curves["schedule"] == "SpecTrain")]
    last = rows.dropna(subset=["eval_loss"]).sort_values("step").iloc[-1]
    table = {(r["model"], r["stages"], r["schedule"]): r for r in records(html.tables["convergence-table"])}
    assert table[("cnn", "4", "SpecTrain")]["final eval loss"] == f"{last['eval_loss']:.3f}"
    assert len(table) == curves.groupby(["model", "stages", "schedule"]).ngroups
    assert {"fig-convergence-cnn", "fig-convergence-transformer"} <= set(html.ids["figure"])
    committed = (ROOT / "reports" / "convergence_cnn.png").read_bytes()
    assert (gallery / "spectrain" / "figures" / "fig-convergence-cnn.png").read_bytes() == committed


def test_rebuild_is_byte_identical_and_index_lists_each_entry(gallery, laysa_entry):
    files = report_files(laysa_entry.report)
    on_disk = {str(path.relative_to(gallery / "laysa")): path.read_bytes()
               for path in (gallery / "laysa").rglob("*") if path.is_file()}
    assert on_disk.pop("notes.txt") == b"kept: not a gallery output"
    assert files == on_disk  # a second build equals the files the first one wrote, byte for byte; the stale PNG went
    assert "data/batches.csv" in files and f"figures/{laysa_entry.headline_figure}.png" in files
    index = index_markdown([laysa_entry], quick=True)
    lines = [line for line in index.splitlines() if line.startswith("- **[")]
    assert len(lines) == 1 and laysa_entry.headline in lines[0]
    assert f"(laysa/figures/{laysa_entry.headline_figure}.png)" in lines[0]
    assert QUICK_NOTE in index


def test_laysa_claims_and_table_equal_independent_simulations(gallery, laysa_entry):
    scenario = ROOT / "scenarios" / "laysa_resnet_10gbe.yaml"
    sparse = simulate(load_scenario(scenario, ["strategy.gradient_compression=topk"])).summary
    laysa = simulate(load_scenario(scenario, ["training.memory_policy=laysa"])).summary
    change = laysa["memory"]["peak_memory_bytes"] / sparse["memory"]["peak_memory_bytes"] - 1
    assert f"laysa vs sparse alone {100 * change:+.1f} %" in laysa_entry.claims[0].ours
    assert laysa_entry.claims[0].paper == "up to -80.5 %"
    table = {row["variant"]: row for row in records(parse_html(gallery / "laysa" / "report.html").tables["setting-table"])}
    assert table["laysa"]["peak memory (GiB)"] == f"{laysa['memory']['peak_memory_bytes'] / 2**30:.2f}"
    assert float(table["laysa"]["samples/s"]) == pytest.approx(laysa["throughput_samples_per_s"], abs=0.05)
    assert table["laysa"]["fits"] == ("yes" if laysa["fits_in_memory"] else "no")


def test_bad_input_one_line_exit_2(capsys, tmp_path):
    assert main(["gallery", "--out", str(tmp_path), "--only", "ghp,nope"]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "--only" in error and "nope" in error
    with pytest.raises(ValueError):
        Claim("c", "p", "o", "maybe", "w")
    assert set(ENTRIES) == {"ghp", "hyparflow", "spectrain", "pase", "laysa"}


def test_json_output_lists_what_was_written(built):
    out, written = built
    assert written["index"] is None  # not every entry built: the index is left alone
    assert not (out / "README.md").exists()
    assert [entry["name"] for entry in written["entries"]] == ["hyparflow", "spectrain", "laysa"]
    for entry in written["entries"]:
        assert Path(entry["html"]).is_file() and Path(entry["markdown"]).is_file()
    laysa = written["entries"][2]
    assert "fig-laysa-throughput" in laysa["figures"] and len(laysa["verdicts"]) == 5
