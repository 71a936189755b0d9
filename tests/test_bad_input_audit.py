"""Bad input found by an audit of every command: one line naming the field (or flag) and the
value, exit code 2, nothing written."""

from __future__ import annotations

import json
import os

import networkx as nx
import yaml

from ghpsim.cli import main
from simulator.errors import MAX_MESSAGE_CHARS

BASE = {"name": "tiny", "cluster": {"num_nodes": 2, "gpus_per_node": 1}, "model": {"name": "mlp"},
        "strategy": {"kind": "dp"}, "training": {"global_batch_size": 8}}


def refused(capsys, *argv: str) -> str:
    """The one error line of `ghpsim ARGV`, which must exit 2."""
    code = main(list(argv))
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1, (code, lines[:20])
    assert lines[0].startswith("ghpsim: error: ") and len(lines[0]) <= MAX_MESSAGE_CHARS
    return lines[0]


def test_a_json_key_given_twice_is_refused_by_name(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text('{"hidden_size": 64, "num_hidden_layers": 2, "hidden_size": 128}')
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({**BASE, "model": {"hf_config": "config.json"}}))
    assert refused(capsys, "simulate", str(scenario)).endswith("key 'hidden_size' is given twice")


def test_a_file_that_refuses_to_be_read_is_named(capsys):
    if not os.path.exists("/proc/self/mem"):
        return
    assert refused(capsys, "simulate", "/proc/self/mem").startswith("ghpsim: error: /proc/self/mem: cannot be read")


def test_an_empty_layer_file_is_named_as_the_file(tmp_path, capsys):
    (tmp_path / "layers.csv").write_text("name,kind,forward_flops_per_sample,num_params,"
                                         "output_elements_per_sample\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({**BASE, "model": {"file": "layers.csv"}}))
    line = refused(capsys, "simulate", str(scenario))
    assert "layers.csv" in line and line.endswith("the layer table is empty") and "model.layers" not in line


def test_a_graph_edge_names_its_bad_value(tmp_path, capsys):
    graph = nx.Graph()
    graph.add_edge("gpu0", "sw", bandwidth="25 GB/s", latency="2 us")
    graph.add_edge("gpu1", "sw", bandwidth="25 GB/s", latency="2 us", tier="middle")
    (tmp_path / "g.json").write_text(json.dumps(nx.node_link_data(graph, edges="links")))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({**BASE, "cluster": {
        "num_nodes": 2, "gpus_per_node": 1, "topology": "graph_file", "topology_file": "g.json"}}))
    assert refused(capsys, "simulate", str(scenario)).endswith("tier 'middle' must be intra or inter")


def test_sweep_refuses_a_base_folder_an_unwritable_out_and_too_many_workers(tmp_path, capsys):
    spec = tmp_path / "sweep.yaml"
    (tmp_path / "folder").mkdir()
    spec.write_text(yaml.safe_dump({"name": "s", "base": "folder", "axes": {"training.global_batch_size": [8, 16]}}))
    assert refused(capsys, "sweep", str(spec), "--out", str(tmp_path / "o")).endswith(
        "is a directory, not a scenario file")
    spec.write_text(yaml.safe_dump({"name": "s", "base": BASE, "axes": {"training.global_batch_size": [8, 16]}}))
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert "--out" in refused(capsys, "sweep", str(spec), "--out", str(blocker / "out"))
    line = refused(capsys, "sweep", str(spec), "--out", str(tmp_path / "o"), "--workers", str(10**6))
    assert line.startswith("ghpsim: error: --workers: 1000000 processes on")
    assert not (tmp_path / "o").exists() and not (blocker.parent / "out").exists()


def test_calibrate_refuses_a_model_whose_weights_exceed_the_host(tmp_path, capsys, monkeypatch):
    import simulator.limits
    monkeypatch.setattr(simulator.limits, "available_memory_bytes", lambda: 2.0**20)  # a 1 MiB host
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(BASE))
    out = tmp_path / "profile.json"
    line = refused(capsys, "calibrate", "--scenario", str(scenario), "--out", str(out))
    assert f"--scenario {scenario}: mlp has" in line and "more than the 0.0 GiB this host has available" in line
    assert not out.exists()


def test_an_unknown_layer_column_is_named_by_its_position(tmp_path, capsys):
    (tmp_path / "layers.yaml").write_text(
        "- {name: l0, kind: linear, forward_flops_per_sample: 100, num_params: 10, input_elements_per_sample: 10,"
        " output_elements_per_sample: 10, colour: 1}\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({**BASE, "model": {"file": "layers.yaml"}}))
    assert "layers row 0: column 7 is not a layer-table column" in refused(capsys, "simulate", str(scenario))


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "scenarios", "demo.yaml")


def test_a_validation_table_with_an_empty_model_cell_names_the_cell(tmp_path, capsys):
    lines = open(os.path.join(REPO, "reports", "validation_cpu.csv")).read().splitlines()
    header = lines[0].split(",")
    cells = lines[1].split(",")
    cells[header.index("model")] = ""
    table = tmp_path / "v.csv"
    table.write_text("\n".join([lines[0], ",".join(cells), *lines[2:]]) + "\n")
    line = refused(capsys, "report", str(table), "--out", str(tmp_path / "out"))
    assert line.endswith("v.csv: row 1, column model: empty (a name is needed here)")
    assert not (tmp_path / "out").exists()


def test_partition_refuses_a_batch_the_groups_do_not_divide(capsys):
    line = refused(capsys, "partition", DEMO, "--set", "training.global_batch_size=12")
    assert "training.global_batch_size: 12 is not divisible by the 8 groups" in line


def test_an_explicit_partition_of_a_one_stage_plan_is_still_checked(capsys):
    scenario = os.path.join(REPO, "scenarios", "runs", "megatron_gpt_a100_node.yaml")
    line = refused(capsys, "simulate", scenario, "--set", "strategy.partition=[1, 2]")
    assert "strategy.partition: [1, 2] must give 1 stage size summing to the model's" in line


def test_an_empty_profile_name_is_refused_by_every_command(capsys):
    for command in ("simulate", "compare", "partition"):
        assert refused(capsys, command, DEMO, "--profile", "") == "ghpsim: error: --profile: needs a file name (got '')"


def test_report_leaves_ghp_out_of_its_default_list_where_no_grid_exists(tmp_path, capsys):
    """Two ranks have no GHP grid 1 < G < 2: the default strategies are dp and mp; asking for ghp
    names ghp, not a --strategies flag the user did not pass."""
    scenario = os.path.join(REPO, "scenarios", "validation", "mlp_cpu.yaml")
    assert main(["report", scenario, "--set", "cluster.gpus_per_node=2", "--out", str(tmp_path / "r")]) == 0
    capsys.readouterr()
    report = (tmp_path / "r" / "report.md").read_text()
    assert "dp (G=2" in report and "ghp (G=" not in report
    line = refused(capsys, "report", scenario, "--set", "cluster.gpus_per_node=2", "--strategies", "dp,ghp",
                   "--out", str(tmp_path / "r2"))
    assert line.startswith("ghpsim: error: ghp: no G with 1 < G < 2 fits this scenario's 2 GPUs")


def test_a_node_of_smaller_gpus_is_checked_against_its_own_memory(capsys):
    """Devices on a node of T4s (16 GB) are held to 16 GB, not to the cluster's A100-80GB."""
    overrides = ["strategy.kind=dp", "training.global_batch_size=4096", "cluster.gpu=A100-80GB"]
    argv = ["simulate", DEMO, "--json", *(item for entry in overrides for item in ("--set", entry))]
    assert main([*argv, "--set", "cluster.node_gpus={3: T4}"]) == 0
    summary = json.loads(capsys.readouterr().out)
    on_t4 = [row for row in summary["devices"] if row["node"] == 3]
    elsewhere = [row for row in summary["devices"] if row["node"] != 3]
    assert all(row["peak_memory_bytes"] > 16e9 for row in on_t4)  # the batch a device: over a T4's memory
    assert not any(row["fits_in_memory"] for row in on_t4) and all(row["fits_in_memory"] for row in elsewhere)
    assert summary["fits_in_memory"] is False


def test_a_capacity_factor_beyond_experts_over_top_k_is_refused(capsys):
    scenario = os.path.join(REPO, "scenarios", "mixtral_8x7b_ep_h100.yaml")
    line = refused(capsys, "simulate", scenario, "--set", "model.params.capacity_factor=1e6")
    assert "model.params.capacity_factor 1000000.0 exceeds model.params.num_experts 8 / model.params.top_k 2" in line


def test_layout_degrees_on_another_kind_are_noted(capsys):
    assert main(["simulate", DEMO, "--json", "--set", "strategy.kind=dp", "--set", "strategy.num_groups=null",
                 "--set", "strategy.tp_degree=4"]) == 0
    err = capsys.readouterr().err
    assert err == "ghpsim: note: strategy.tp_degree 4: not used by kind dp (kind megatron only)\n"


def test_a_pgf_figure_without_tex_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    import shutil
    monkeypatch.setattr(shutil, "which", lambda name: None)  # no TeX installed
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(BASE))
    plot = tmp_path / "m.pgf"
    line = refused(capsys, "simulate", str(scenario), "--memory-plot", str(plot), "--json")
    assert line.endswith("format 'pgf' needs xelatex, which is not installed") and not plot.exists()
    offered = refused(capsys, "simulate", str(scenario), "--memory-plot", str(tmp_path / "m.xyz")).partition("use one of")[2]
    assert "png" in offered and "pgf" not in offered


def test_fit_names_the_base_scenario_a_row_cannot_use(tmp_path, capsys):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({**BASE, "cluster": {"num_node": 2, "gpus_per_node": 1}}))
    runs = tmp_path / "runs.csv"
    runs.write_text("training.global_batch_size,measured_step_s\n8,0.1\n")
    line = refused(capsys, "fit", str(runs), "--base", str(tmp_path / "base.yaml"), "--out", str(tmp_path / "p.json"))
    assert "runs.csv:2: base '" in line and line.endswith("base.yaml': cluster.num_node: unknown key")
    assert not (tmp_path / "p.json").exists()


def test_rank_names_the_scenario_whose_model_is_unknown(tmp_path, capsys):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({**BASE, "model": {"name": "mlpp"}}))
    assert refused(capsys, "rank", str(scenario)).startswith(f"ghpsim: error: {scenario}: model.name: unknown model")


def test_version_and_a_closed_pipe_have_their_own_exit_codes(capsys):
    import subprocess
    import sys

    import pytest
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("ghpsim ")
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will read: the first write fails with EPIPE
    try:
        done = subprocess.run([sys.executable, "-m", "ghpsim", "list", "gpus"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")


def test_a_file_option_ending_in_a_separator_is_refused_as_a_folder(tmp_path, capsys):
    for argv in (["merge-profiles", "a.json", "b.json", "--out", f"{tmp_path}/new/"],
                 ["import-model", "os:getcwd", "--input-shape", "8", "--out", f"{tmp_path}/m.yaml/"]):
        assert refused(capsys, *argv).endswith("ends with a path separator (a folder), where one file is written")
    assert list(tmp_path.iterdir()) == []


def test_a_file_nobody_may_replace_is_refused_up_front(tmp_path, monkeypatch):
    import errno

    import pytest

    from simulator.errors import ScenarioError
    from simulator.output import check_output_file
    target = tmp_path / "p.json"
    target.write_text("{}")
    opened = os.open

    def immutable(path, flags, *mode):
        if str(path) == str(target) and flags & os.O_WRONLY:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))
        return opened(path, flags, *mode)
    check_output_file(target, "--out")  # an ordinary file: replaced
    monkeypatch.setattr(os, "open", immutable)
    with pytest.raises(ScenarioError, match=r"--out .*p.json: cannot be replaced \(Operation not permitted\)"):
        check_output_file(target, "--out")
    assert target.read_text() == "{}"


def test_sigterm_stops_a_command_as_ctrl_c_does_with_its_own_exit_code(capsys, monkeypatch):
    import signal

    import pytest

    from ghpsim import cli
    saved = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    if saved[signal.SIGTERM] is not signal.SIG_DFL:
        pytest.skip("SIGTERM already has a handler in this process")
    monkeypatch.setattr(cli, "load", lambda target: lambda args: os.kill(os.getpid(), signal.SIGTERM))
    try:
        assert main(["list", "gpus"]) == 128 + signal.SIGTERM
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)
    assert capsys.readouterr().err == "ghpsim: interrupted\n"
