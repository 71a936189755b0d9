"""What `ghpsim rank` prints: sizes where no layout fits beside those that rank, the reason each
layout lost, one number format, and bounds priced as each candidate runs."""

from __future__ import annotations

import json
import time

import pytest

from simulator.layout_search import search_layouts
from simulator.scenario import load_scenario
from tests.test_layout_search import run, tiny_llm
from tests.test_report import ROOT

DEMO = str(ROOT / "scenarios" / "demo.yaml")


def test_a_size_without_a_fitting_layout_is_reported_and_the_others_still_ranked(capsys, tmp_path):
    """--gpus 1,4 where dp on 1 GPU needs ~0.19 GB, on 4 ~0.09 GB, of 0.15 GB: 1 is "no layout fits"."""
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(json.dumps(tiny_llm(batch=16, memory="150 MB")))
    argv = ("rank", str(scenario), "--gpus", "1,4", "--kinds", "dp", "--workers", "1")
    code, out, err = run(capsys, *argv, "--steps", "10", "--plot", str(tmp_path / "p.png"))
    assert code == 0 and err == "", err
    assert "1 GPU (1 x 1 A100-80GB), batch 16: no layout fits in 0.1 GiB of device memory on 1 GPU" in out
    sizes_table = out[out.index("cluster sizes: the best layout of each"):]
    assert [line.split("│")[2].strip() for line in sizes_table.splitlines() if line.startswith("│")] == \
        ["no layout fits", "dp (G=4 x M=1)"]
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    code, out, _ = run(capsys, *argv, "--json")
    sizes = json.loads(out)["sizes"]
    assert code == 0 and [size["num_gpus"] for size in sizes] == [1, 4]
    assert sizes[0]["no_layout_fits"].startswith("no layout fits") and sizes[1]["no_layout_fits"] is None
    assert sizes[1]["rows"][0]["fits_in_memory"]
    scenario.write_text(json.dumps(tiny_llm(batch=16, memory="1 MB")))
    code, out, err = run(capsys, *argv)  # no size fits: one line, exit 2
    assert code == 2 and out == "" and err.startswith("ghpsim: error: --gpus '1,4': no size has a layout that fits; ")
    assert err.count("\n") == 1


def test_the_loss_reason_follows_the_figures_shown(capsys):
    """demo on 3 GPUs: gpipe m=8 has 1f1b m=8's bound and no more communication shown; it loses
    above the bound, not to communication. Every row's parts add up to its step."""
    from simulator.rank_reasons import shown_comm_pct
    code, out, _ = run(capsys, "rank", DEMO, "--gpus", "3", "--workers", "1", "--exhaustive",
                       "--json")
    rows = json.loads(out)["rows"]
    best = rows[0]
    assert code == 0 and best["lost_to"] is None
    gpipe = next(row for row in rows if row["label"] == "gpipe (G=1 x M=3) m=8")
    assert gpipe["bound_s"] == best["bound_s"] and gpipe["lost_to"] == "above bound"
    assert gpipe["above_bound_s"] > best["above_bound_s"]
    for row in rows:
        parts = (row["bound_compute_s"] + row["bound_bubble_s"] + row["bound_host_s"] + row["bound_communication_s"]
                 + row["above_bound_s"])
        assert parts == pytest.approx(row["step_time_s"]), row["label"]
        if row["lost_to"] == "communication":
            assert shown_comm_pct(row) > shown_comm_pct(best), row["label"]


def test_lost_to_names_communication_only_where_the_shown_share_is_higher():
    from simulator.rank_reasons import lost_to
    best = {"compute": 1.0, "bubble": 0.5, "host": 0.0, "communication": 0.1, "above_bound": 0.1}
    row = {"compute": 1.1, "bubble": 0.5, "host": 0.0, "communication": 0.4, "above_bound": 0.25}
    assert lost_to(row, best, more_comm_shown=True) == "communication"
    assert lost_to(row, best, more_comm_shown=False) == "above bound"  # 0.15 above the bound, 0.1 compute
    assert lost_to({**row, "above_bound": 0.1}, best, more_comm_shown=False) == "compute"
    assert lost_to(row, None) is None


def test_a_placement_twin_with_the_same_figures_joins_the_row_above_it():
    from simulator.rank_reasons import shown_rows

    def row(rank, label, step_s, memory_bytes=10.0):
        return {"rank": rank, "label": label, "step_time_s": step_s, "peak_memory_bytes": memory_bytes,
                "fits_in_memory": True}
    base = "megatron (t=8 x p=8 x d=16) m=8 sp"
    rows = [row(1, "megatron (t=8 x p=1 x d=128) m=1", 1.0), row(2, base, 1.5), row(3, base + " tp-dp-pp", 1.5),
            row(4, "megatron (t=4 x p=8 x d=32) m=8", 1.6), row(5, "megatron (t=4 x p=8 x d=32) m=8 tp-dp-pp", 1.7),
            row(6, "megatron (t=2 x p=8 x d=64) m=8", 1.8), row(7, "megatron (t=2 x p=8 x d=64) m=8 tp-dp-pp", 1.8, 11.0)]
    shown = shown_rows(rows)
    assert [position for position, _row, _label in shown] == ["1", "2-3", "4", "5", "6", "7"]
    assert shown[1][2] == base + " (or tp-dp-pp: the same)" and shown[1][1] is rows[1]
    assert shown[3][2] == rows[4]["label"]  # slower: a row of its own, as is a twin of other memory (7)


def test_the_bar_plot_draws_placement_twins_as_one_bar_and_keeps_their_pick():
    import pandas as pd

    from simulator.rank_plot import _twins_joined
    base = "megatron (t=8 x p=8 x d=16) m=8 sp"
    frame = pd.DataFrame([{"rank": rank, "label": label, "step_time_s": 1.5, "peak_memory_bytes": 1.0,
                           "fits_in_memory": True} for rank, label in ((1, base), (2, base + " tp-dp-pp"))])
    joined, picks = _twins_joined(frame, {base: ["a heuristic"]})
    assert list(joined["rank"]) == ["1-2"] and list(joined.columns) == list(frame.columns)
    assert picks[joined["label"][0]] == ["a heuristic"]


def test_an_asynchronous_row_without_a_bound_is_not_said_to_lose_above_it():
    from types import SimpleNamespace

    from simulator.rank_reasons import explain
    bounds = {"sync": SimpleNamespace(step_s=0.07, work_s=0.06, bubble_s=0.01, host_s=0.0, comm_s=0.0),
              "async": SimpleNamespace(step_s=0.0, work_s=0.0, bubble_s=0.0, host_s=0.0, comm_s=0.0)}
    rows = [{"label": "sync", "step_time_s": 0.08, "fits_in_memory": True},
            {"label": "async", "step_time_s": 0.09, "fits_in_memory": True}]
    explain(rows, lambda row: bounds[row["label"]])
    assert [row["lost_to"] for row in rows] == [None, "asynchronous"]


def test_layouts_without_a_pipeline_never_lose_to_the_bubble(capsys):
    """Without pipeline stages there is no fill or drain: where the host's kernel issue paces the
    GPU (GPT-2 at small micro-batches), the bound's rest is host time, and a loser says "host"."""
    code, out, _ = run(capsys, "rank", "scenarios/gpt2_1.5b_dgx_a100_3d.yaml", "--gpus", "8", "--top", "40", "--json")
    document = json.loads(out)
    assert code == 0
    unpipelined = [row for row in document["rows"] + document["pruned"] if " p=1 " in row["label"]]
    assert unpipelined and all(row.get("lost_to", row.get("reason")) != "bubble" for row in unpipelined)
    assert all(row["bound_bubble_s"] == 0.0 for row in document["rows"] if " p=1 " in row["label"])
    assert any(row["reason"] == "host" for row in document["pruned"] if " p=1 " in row["label"])


@pytest.mark.parametrize("value, decimals, text", [
    (1106.63, 2, "1,106.63"), (1097.11, 2, "1,097.11"), (3.96247667e29, 0, "3.962e+29"), (999_999_999.0, 0,
                                                                                           "999,999,999")])
def test_rank_figures_share_one_format_and_huge_ones_are_scientific(value, decimals, text):
    from simulator.rank_cli import _number
    assert _number(value, decimals) == text


def test_huge_run_figures_are_not_truncated(capsys):
    code, out, _ = run(capsys, "rank", DEMO, "--gpus", "3", "--top", "2", "--workers", "1",
                       "--tokens", "1e30", "--price-per-gpu-hour", "1e30")
    assert code == 0 and "…" not in out and "e+" in out
    row = next(line for line in out.splitlines() if line.startswith("│ 1 "))
    assert "148.05" in row and "135.85" in row


def test_bounds_price_each_candidate_as_its_own_kind_on_another_gpu_count():
    """On a GPU count other than the scenario's own, the search starts from a `dp` scenario; the
    megatron candidates' bounds must still be priced as megatron runs them (GPT-2's odd vocabulary
    padded, fp16 weight gradients added per micro-batch), and the dp ones as DDP does: every
    bound stays at or below its simulation."""
    scenario = load_scenario("scenarios/gpt2_1.5b_dgx_a100_3d.yaml",
                             ["training.dtype=fp16", "training.global_batch_size=32"])
    found = search_layouts(scenario, 8, kinds=("megatron", "dp"), microbatch_sizes=(4,), exhaustive=True,
                           workers=1, show_progress=False)
    assert {row["label"].split()[0] for row in found.rows} == {"megatron", "dp"}
    for row in found.rows:
        assert 0 < row["bound_s"] <= row["step_time_s"] * (1 + 1e-9), row["label"]


def test_sizes_on_several_nodes_name_their_network_and_a_default_one_is_noted(capsys, tmp_path):
    """A one-node scenario ranked on more GPUs than a node has: the title names the network joining
    the nodes, and a note says it is the scenario's default, so a plan on a network the user never
    chose does not pass unseen; a scenario that sets its network gets no note."""
    raw = tiny_llm(batch=16)
    del raw["cluster"]["inter_node_link"]
    raw["cluster"]["num_nodes"] = 1
    scenario = tmp_path / "one_node.yaml"
    scenario.write_text(json.dumps(raw))
    code, out, err = run(capsys, "rank", str(scenario), "--gpus", "4", "--kinds", "dp", "--workers", "1")
    assert code == 0 and err == "", err
    assert "4 GPUs (2 x 2 A100-80GB, 1 x ib-edr a node)" in out
    assert "note: the scenario sets no cluster.inter_node_link or nics_per_node" in out
    code, out, _ = run(capsys, "rank", str(scenario), "--gpus", "4", "--kinds", "dp", "--workers", "1", "--json")
    assert (json.loads(out)["inter_node_link"], json.loads(out)["nics_per_node"]) == ("ib-edr", 1)
    scenario.write_text(json.dumps(tiny_llm(batch=16)))  # its own ib-hdr
    code, out, _ = run(capsys, "rank", str(scenario), "--gpus", "4", "--kinds", "dp", "--workers", "1")
    assert "1 x ib-hdr a node" in out and "note:" not in out


@pytest.mark.parametrize("flags, named", [
    (("--kinds", "dp,mp,ghp", "--microbatch-sizes", "3"), "--microbatch-sizes: only megatron layouts read it"),
    (("--kinds", "megatron", "--microbatches", "4"), "--microbatches: only the pipeline kinds read it"),
])
def test_a_micro_batch_flag_no_searched_kind_reads_is_refused(capsys, flags, named):
    code, out, err = run(capsys, "rank", DEMO, *flags)
    assert code == 2 and out == "" and err.startswith(f"ghpsim: error: {named}") and err.count("\n") == 1


def test_several_sizes_keep_the_heuristics_and_name_the_pareto_sizes_and_the_plot(capsys, tmp_path):
    plot = tmp_path / "p.png"
    code, out, _ = run(capsys, "rank", DEMO, "--gpus", "4,8", "--kinds", "dp,mp,ghp", "--top", "2",
                       "--workers", "1", "--json", "--plot", str(plot))
    document = json.loads(out)
    assert code == 0 and document["plot"] == str(plot) and plot.exists()
    assert all(size["heuristics"] for size in document["sizes"])
    bests = {size["num_gpus"]: size["rows"][0] for size in document["sizes"]}
    cheaper = min(bests, key=lambda gpus: bests[gpus]["step_time_s"] * gpus)
    assert cheaper in document["pareto_gpus"] and set(document["pareto_gpus"]) <= {4, 8}
    code, out, _ = run(capsys, "rank", DEMO, "--gpus", "4", "--kinds", "dp,mp,ghp", "--workers", "1",
                       "--exhaustive")
    assert code == 0 and "rank among every layout that may fit in memory (--exhaustive)" in out


def test_the_bar_plot_draws_the_top_k_and_every_heuristics_pick(capsys, tmp_path, monkeypatch):
    import simulator.rank_plot as rank_plot
    drawn = {}
    monkeypatch.setattr(rank_plot, "write_ranking_plot",
                        lambda frame, path, title, picks: drawn.update(labels=list(frame["label"]), picks=picks))
    code, out, _ = run(capsys, "rank", DEMO, "--gpus", "16", "--kinds", "dp,mp,ghp", "--top", "2", "--exhaustive",
                       "--workers", "1", "--json", "--plot", str(tmp_path / "p.png"))
    ranking = json.loads(out)
    simulated = [row["label"] for row in ranking["rows"]]
    picked = {row["label"] for row in ranking["heuristics"] if row["label"] in simulated}
    assert code == 0 and picked - set(simulated[:2])  # a pick outside the two best: drawn all the same
    assert set(drawn["labels"]) == set(simulated[:2]) | picked and len(simulated) > len(drawn["labels"])


def test_a_gpu_count_that_breaks_a_per_node_setting_is_named_as_the_cause(capsys):
    """The straggler scenario gives node 3 other GPUs; on 8 GPUs (2 nodes of 4) there is no node 3:
    the error says that --gpus made the cluster too small for the file's setting."""
    from ghpsim.cli import main
    assert main(["rank", str(ROOT / "scenarios" / "straggler_vgg16_ghp.yaml"), "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ghpsim: error: --gpus 8 (2 nodes of 4): ") and "cluster.node_gpus" in err, err
    assert err.count("\n") == 1


def test_the_pareto_plot_numbers_its_front_and_lists_each_layout_once(monkeypatch, tmp_path):
    from types import SimpleNamespace

    import simulator.rank_plot as rank_plot
    drawn = {}
    monkeypatch.setattr(rank_plot, "_save", lambda figure, path, title: drawn.setdefault("figure", figure))

    def ranking(gpus, rows):
        return SimpleNamespace(scenario=SimpleNamespace(num_gpus=gpus), rows=[
            {"label": label, "step_time_s": step_s, "fits_in_memory": True} for label, step_s in rows])
    rankings = [ranking(1, [("dp (G=1 x M=1)", 10.0), ("dp (G=1 x M=1)", 10.0)]),  # found twice: one point
                ranking(8, [("dp (G=8 x M=1)", 1.5), ("mp (G=1 x M=8)", 9.0)]), ranking(64, [("dp (G=64 x M=1)", 0.5)])]
    rank_plot.write_pareto_plot(rankings, tmp_path / "p.png", "title")
    axis = drawn["figure"].axes[0]
    texts = [text.get_text() for text in axis.texts]
    assert texts[-1] == ("Pareto front:\n1. 64 GPUs: dp (G=64 x M=1)\n2. 8 GPUs: dp (G=8 x M=1)\n"
                         "3. 1 GPU: dp (G=1 x M=1)")
    assert texts[:-1] == ["1", "2", "3"] and axis.get_xscale() == "log"  # 0.5 to 10 s: a decade and more


def test_the_phase_seconds_are_wall_time_and_add_up_to_no_more_than_the_search():
    """Screening runs in slices over the workers: its memory and bound seconds split its wall time
    as the workers' time was split (their sum would exceed it), so the phases add up to the search."""
    started = time.perf_counter()
    ranking = search_layouts(load_scenario(tiny_llm()), kinds=("dp", "mp", "ghp", "gpipe", "1f1b", "interleaved_1f1b", "megatron"), microbatch_sizes=(1, 2), workers=2,
                             show_progress=False)
    wall_s = time.perf_counter() - started
    seconds = ranking.stats.seconds
    assert set(seconds) == {"enumerate", "memory", "bound", "simulate"} and min(seconds.values()) >= 0
    assert seconds["memory"] + seconds["bound"] > 0 and sum(seconds.values()) <= wall_s
