"""Bad input on the command line and in output paths: one line naming the flag or field and the
value, exit code 2, and no result file left behind when a command fails part-way."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.test_bad_input import SMALL, assert_one_line_error, run_cli

A100_MEGATRON = {
    "name": "small_megatron",
    "cluster": {"num_nodes": 1, "gpus_per_node": 8, "gpu": "A100-80GB", "intra_node_link": "nvlink3-a100"},
    "model": {"name": "transformer", "params": {"num_layers": 4, "hidden_size": 256, "num_heads": 4, "seq_len": 128,
                                                "vocab_size": 1000}},
    "strategy": {"kind": "megatron", "tp_degree": 2, "pp_degree": 2, "num_microbatches": 4},
    "training": {"global_batch_size": 16, "dtype": "bf16", "optimizer": "adam"},
}
KERNEL_PROFILE = {"format": "ghpsim-profile/2", "kind": "kernel", "architecture": "ampere",
                  "parameters": {"gemm_efficiency": 0.7, "host_overhead_s": 5e-5}}


def test_a_report_with_a_kernel_profile_is_built_with_the_kernel_model(tmp_path, capsys):
    """`report --profile` takes the profiles `simulate --profile` takes, kernel profiles included."""
    scenario, profile = tmp_path / "megatron.yaml", tmp_path / "kernel.json"
    scenario.write_text(yaml.safe_dump(A100_MEGATRON))
    profile.write_text(json.dumps(KERNEL_PROFILE))
    code, out, err = run_cli(capsys, "report", scenario, "--profile", profile, "--out", tmp_path / "report", "--json")
    assert code == 0, err
    assert Path(json.loads(out)["html"]).is_file()
    other = {**KERNEL_PROFILE, "architecture": "volta"}
    profile.write_text(json.dumps(other))
    assert_one_line_error(run_cli(capsys, "report", scenario, "--profile", profile, "--out", tmp_path / "again"),
                          "architecture", "'volta'")
    assert not (tmp_path / "again").exists()


def test_simulate_writes_its_trace_and_memory_plot_both_or_neither(tmp_path, capsys):
    trace, plot = tmp_path / "trace.json", tmp_path / "not_a_folder" / "memory.png"
    (tmp_path / "not_a_folder").write_text("a file where the plot's folder should be")
    line = assert_one_line_error(run_cli(capsys, "simulate", SMALL, "--trace", trace, "--memory-plot", plot),
                                 "--memory-plot", "not_a_folder")
    assert "--trace" not in line
    assert not trace.exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["not_a_folder"]  # no temporary file either
    plot = tmp_path / "plots" / "memory.png"
    code, _out, err = run_cli(capsys, "simulate", SMALL, "--trace", trace, "--memory-plot", plot)
    assert code == 0, err
    assert json.loads(trace.read_text())["traceEvents"] and plot.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("blocker", ["report.html", "report.md"])
def test_a_report_that_cannot_write_one_of_its_files_writes_none(tmp_path, capsys, blocker):
    out = tmp_path / "report"
    (out / blocker).mkdir(parents=True)
    assert_one_line_error(run_cli(capsys, "report", SMALL, "--out", out), "--out", blocker, "is a directory")
    assert sorted(path.name for path in out.iterdir()) == [blocker]


def test_a_report_whose_trace_folder_is_a_file_writes_nothing(tmp_path, capsys):
    out = tmp_path / "report"
    out.mkdir()
    (out / "traces").write_text("")
    assert_one_line_error(run_cli(capsys, "report", SMALL, "--out", out), "--out", "traces")
    assert sorted(path.name for path in out.iterdir()) == ["traces"]


def test_write_files_atomic_leaves_nothing_when_a_later_file_fails(tmp_path):
    from simulator.output import write_files_atomic
    (tmp_path / "b").write_text("a file, not a folder")
    existing = tmp_path / "a.txt"
    existing.write_text("kept")
    with pytest.raises(OSError):
        write_files_atomic({existing: b"new", tmp_path / "new" / "deep" / "c.txt": b"c", tmp_path / "b" / "d.txt": b"d"})
    assert existing.read_text() == "kept"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a.txt", "b"]  # no temporary file, no new folder
    written = write_files_atomic({existing: b"new", tmp_path / "new" / "c.txt": b"c"})
    assert [path.read_bytes() for path in written] == [b"new", b"c"]


def test_the_output_checks_probe_and_leave_nothing_behind(tmp_path):
    from simulator.output import check_output_file, check_output_folder
    (tmp_path / "old").mkdir()
    for path in (tmp_path / "a.json", tmp_path / "new" / "deeper" / "a.json", tmp_path / "old" / "a.json"):
        check_output_file(path, "--out")
    for path in (tmp_path / "old", tmp_path / "new" / "folder"):
        check_output_folder(path, "--out")
    assert os.listdir(tmp_path) == ["old"] and os.listdir(tmp_path / "old") == []


@pytest.mark.parametrize("assignment", ["cluster..num_nodes=2", ".cluster.num_nodes=2", "cluster.num_nodes.=2",
                                        ".=1"])
def test_a_set_key_with_an_empty_part_is_refused(capsys, assignment):
    assert_one_line_error(run_cli(capsys, "simulate", SMALL, "--set", assignment), "--set", assignment,
                          "an empty part")


@pytest.mark.parametrize("argv,needles", [
    (("compare", SMALL, "--strategies", "dp,,mp"), ("--strategies", "'dp,,mp'", "empty item")),
    (("compare", SMALL, "--strategies", "spectrain:"), ("--strategies", "'spectrain:'", "a number after ':'")),
    (("rank", SMALL, "--gpus", "4,,"), ("--gpus", "'4,,'")),
    (("rank", SMALL, "--kinds", "dp,"), ("--kinds", "'dp,'", "empty item")),
])
def test_comma_lists_with_an_empty_item_are_refused(capsys, argv, needles):
    assert_one_line_error(run_cli(capsys, *argv), *needles)


def test_a_text_where_a_zoo_model_computes_with_a_number_names_the_parameter(capsys):
    gpt = str(Path(SMALL).parent / "gpt2_1.5b_dgx_a100_3d.yaml")
    line = assert_one_line_error(run_cli(capsys, "simulate", gpt, "--set", "model.params.seq_len=abc"),
                                 "model.params.seq_len", "'abc'", "expected a number")
    assert "not supported between" not in line


def test_a_layer_table_with_an_unknown_top_level_key_is_refused(tmp_path, capsys):
    rows = [{"name": name, "forward_flops_per_sample": 1000, "num_params": 10, "input_elements_per_sample": 10,
             "output_elements_per_sample": 10} for name in ("a", "b")]
    (tmp_path / "table.yaml").write_text(yaml.safe_dump({"layers": rows, "extra": 1}))
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump({"model": {"file": "table.yaml"}, "training": {"global_batch_size": 8},
                                        "cluster": {"gpus_per_node": 2}, "strategy": {"kind": "mp"}}))
    assert_one_line_error(run_cli(capsys, "simulate", scenario), "model.file", "table.yaml", "top-level key")


@pytest.mark.parametrize("argv,needle", [
    (("schedule", "interleaved_1f1b", "--stages", "4", "--microbatches", "3"), "--microbatches: 3"),
    (("schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--virtual-stages", "3"), "--virtual-stages: 3"),
])
def test_schedule_names_its_own_flags(capsys, argv, needle):
    line = assert_one_line_error(run_cli(capsys, *argv), needle)
    assert "strategy." not in line


def test_gallery_refuses_an_out_that_is_a_file_before_building(tmp_path, capsys):
    out = tmp_path / "file.txt"
    out.write_text("")
    assert_one_line_error(run_cli(capsys, "gallery", "--out", out, "--only", "pase"), "--out", "not a directory")


def _never(*_args, **_kwargs):
    raise AssertionError("the work ran: the --out where nothing can be made should have been refused before it")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc (takes no new folder)")
@pytest.mark.parametrize("argv", [("gallery", "--only", "ghp,pase"), ("report", SMALL)])
def test_an_out_where_no_folder_can_be_made_is_refused_before_building(capsys, monkeypatch, argv):
    import simulator.report.gallery
    import simulator.report.inputs
    monkeypatch.setattr(simulator.report.gallery, "build_entry", _never)
    monkeypatch.setattr(simulator.report.inputs, "load_report_input", _never)
    out = "/proc/ghpsim_no_such/out"
    assert_one_line_error(run_cli(capsys, *argv, "--out", out), f"--out {out}: cannot make a folder in /proc")


def test_import_model_checks_its_out_before_running_the_users_code(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "user_factory.py").write_text("raise RuntimeError('the user code ran')\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    line = assert_one_line_error(run_cli(capsys, "import-model", "user_factory:build", "--input-shape", "8",
                                         "--out", folder), "--out", "is a directory")
    assert "the user code ran" not in line
    for name in ("table.csv", "table.txt"):  # model.file reads a .csv as a CSV table: YAML there would not load
        line = assert_one_line_error(run_cli(capsys, "import-model", "user_factory:build", "--input-shape", "8",
                                             "--out", tmp_path / name), "--out", "name it .yaml or .yml")
        assert "the user code ran" not in line and not (tmp_path / name).exists()


def test_an_hf_config_with_zero_experts_is_refused_not_read_as_dense(tmp_path, capsys):
    config = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
              "intermediate_size": 512, "vocab_size": 1000, "rms_norm_eps": 1e-5, "num_local_experts": 0,
              "num_experts_per_tok": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump({"model": {"hf_config": "config.json", "params": {"seq_len": 128}},
                                        "training": {"global_batch_size": 8}, "cluster": {"gpu": "H100-SXM"}}))
    assert_one_line_error(run_cli(capsys, "simulate", scenario), "num_local_experts", "got 0")


def test_a_pase_search_too_large_to_finish_is_refused_before_it_starts(capsys):
    """GPT-3's 674 vertices on 1,024 GPUs: ~6e10 table entries (a quarter of an hour); refused in a second."""
    gpt3 = str(Path(SMALL).parent / "gpt3_175b_dgx_a100_3d.yaml")
    assert_one_line_error(run_cli(capsys, "search", gpt3, "--no-simulate", "--gpus", "8,1024"), "--gpus 1024",
                          "entries", "limit")


@pytest.mark.parametrize("argv,needles", [
    (("--workers", "3000"), ("--workers", "3000")),
    (("--tokens", "1e308", "--price-per-gpu-hour", "2"), ("--tokens", "1e+308")),
    (("--tokens", "1e12", "--price-per-gpu-hour", "1e300"), ("--price-per-gpu-hour", "1e+300")),
    (("--gpus", "1000000"), ("--gpus", "1000000", "16,384")),
])
def test_rank_refuses_flags_that_would_run_away_or_overflow(capsys, argv, needles):
    assert_one_line_error(run_cli(capsys, "rank", SMALL, "--kinds", "dp,mp,ghp", *argv), *needles)


@pytest.mark.parametrize("command", ["report", "sweep"])
def test_an_empty_out_folder_is_refused_not_the_current_folder(tmp_path, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    source = SMALL if command == "report" else str(Path(SMALL).parent / "sweeps" / "resnet50_dp_vs_ghp_scaling.yaml")
    assert_one_line_error(run_cli(capsys, command, source, "--out", ""), "--out", "needs a folder name")
    assert list(tmp_path.iterdir()) == []
