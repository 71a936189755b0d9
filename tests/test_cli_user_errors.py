"""User mistakes on the command line found by an audit: each is one line on stderr naming the flag
(or field) and the value, exit code 2, no traceback, nothing written; successes leave stderr empty."""

from __future__ import annotations

import json
import os
import stat

import pytest

from simulator.output import write_text_atomic
from simulator import schedule_cli
from tests.test_bad_input import SMALL, assert_one_line_error, run_cli, write_scenario


def assert_only_line(result, *needles):
    """`assert_one_line_error`, and stderr is exactly that line (no blank line before it)."""
    line = assert_one_line_error(result, *needles)
    assert result[2] == line + "\n", repr(result[2])
    return line


# ----------------------------------------------------------------------------- 1: figure formats

def test_memory_plot_with_an_unsupported_format(capsys, tmp_path):
    out = tmp_path / "x" / "mem.txt"
    assert_only_line(run_cli(capsys, "simulate", SMALL, "--memory-plot", out), "--memory-plot", out, "'txt'", "png")
    assert not (tmp_path / "x").exists()


def test_rank_plot_with_an_unsupported_format(capsys, tmp_path, monkeypatch):
    import simulator.layout_search

    searched = []  # the layout search (the simulations) must not start: the flag is checked first
    monkeypatch.setattr(simulator.layout_search, "search_layouts",
                        lambda *args, **kwargs: searched.append(args) or pytest.fail("searched before the check"))
    out = tmp_path / "x" / "rank.txt"
    result = run_cli(capsys, "rank", SMALL, "--workers", 1, "--plot", out)
    assert_only_line(result, "--plot", out, "'txt'")
    assert searched == [], "checked before simulating"
    assert not (tmp_path / "x").exists()


def test_memory_plot_suffix_case_is_ignored(capsys, tmp_path):
    out = tmp_path / "mem.SVG"
    code, _out, err = run_cli(capsys, "simulate", SMALL, "--memory-plot", out)
    assert code == 0 and err == "" and out.read_bytes().lstrip().startswith(b"<?xml")


# ----------------------------------------------------------------------------- 2: booleans are not numbers

def test_boolean_batch_size_in_the_file(capsys, tmp_path):
    path = write_scenario(tmp_path, training={"global_batch_size": True})
    assert_only_line(run_cli(capsys, "simulate", path), path, "training.global_batch_size", "boolean", "True")


@pytest.mark.parametrize("assignment, field", [
    ("cluster.num_nodes=true", "cluster.num_nodes"),
    ("strategy.num_microbatches=false", "strategy.num_microbatches"),
    ("strategy.zero_stage=true", "strategy.zero_stage"),
    ("cluster.stragglers={0: true}", "cluster.stragglers.0"),
    ("cluster.node_gpus={true: A100}", "cluster.node_gpus"),
])
def test_boolean_for_a_number_with_set(capsys, assignment, field):
    assert_only_line(run_cli(capsys, "simulate", SMALL, "--set", assignment), SMALL, field, "boolean")


@pytest.mark.parametrize("params, field, kind", [
    ({"depth": True}, "model.params.depth", "a number"),
    ({"width_multiplier": "wide"}, "model.params.width_multiplier", "a number"),
    ({"variant": 3}, "model.params.variant", "a name"),
])
def test_zoo_params_of_the_wrong_kind(capsys, tmp_path, params, field, kind):
    path = write_scenario(tmp_path, model={"name": "resnet_cifar", "params": params})
    assert_only_line(run_cli(capsys, "simulate", path), path, field, kind, repr(next(iter(params.values()))))


def test_unknown_zoo_param_is_named_with_the_models_parameters(capsys, tmp_path):
    path = write_scenario(tmp_path, model={"name": "mlp", "params": {"depth": True}})
    assert_only_line(run_cli(capsys, "simulate", path), path, "model.params.depth", "not a parameter of mlp")


def test_zoo_params_of_the_right_kind_still_work(capsys, tmp_path):
    path = write_scenario(tmp_path, model={"name": "resnet_cifar", "params": {"depth": 20, "width_multiplier": 0.5}})
    code, _out, err = run_cli(capsys, "simulate", path)
    assert code == 0 and err == ""


def test_boolean_fields_still_take_booleans(capsys):
    code, _out, err = run_cli(capsys, "simulate", SMALL, "--set", "strategy.overlap_backward=false")
    assert code == 0 and err == ""


# ----------------------------------------------------------------------------- 3: output paths

def test_trace_into_a_directory_names_the_flag_and_path(capsys, tmp_path):
    assert_only_line(run_cli(capsys, "simulate", SMALL, "--trace", tmp_path), f"--trace {tmp_path}: is a directory")
    assert list(tmp_path.iterdir()) == []


def test_trace_under_a_file(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "t.json"
    assert_only_line(run_cli(capsys, "simulate", SMALL, "--trace", out), "--trace", out, "not a directory")


def test_atomic_write_errors_name_the_target_not_the_temporary(tmp_path):
    with pytest.raises(IsADirectoryError) as error:
        write_text_atomic(tmp_path, "x")
    assert error.value.filename == str(tmp_path) and ".tmp" not in str(error.value)
    assert list(tmp_path.iterdir()) == []


def test_merge_profiles_out_is_a_directory(capsys, tmp_path):
    profile, other = tmp_path / "p.json", tmp_path / "q.json"
    profile.write_text("{}")
    other.write_text("{}")
    out = tmp_path / "dir"
    out.mkdir()
    assert_only_line(run_cli(capsys, "merge-profiles", profile, other, "--out", out), f"--out {out}: is a directory")


def test_report_out_is_an_existing_file(capsys, tmp_path):
    out = tmp_path / "file"
    out.write_text("keep")
    line = assert_only_line(run_cli(capsys, "report", SMALL, "--out", out), f"--out {out}", "not a directory")
    assert "figures" not in line and out.read_text() == "keep"


# ----------------------------------------------------------------------------- 4: rank blames the right flag

def test_rank_with_indivisible_microbatches_blames_microbatches(capsys):
    line = assert_only_line(run_cli(capsys, "rank", SMALL, "--workers", 1, "--microbatches", 3, "--kinds", "gpipe"),
                            "--microbatches 3", "not divisible by m=3")
    assert line.startswith("ghpsim: error: --microbatches:"), line


# ----------------------------------------------------------------------------- 5: schedule size

def test_huge_schedule_is_refused_quickly(capsys, monkeypatch):
    built = []  # refused by its size alone: the schedule is never built
    monkeypatch.setattr(schedule_cli, "build_schedule", lambda *args: built.append(args))
    result = run_cli(capsys, "schedule", "gpipe", "--stages", 100000, "--microbatches", 1)
    assert_only_line(result, "--stages 100000", "--microbatches 1", "at most")
    assert built == []


def test_schedule_bound_leaves_room_for_real_pipelines():
    schedule_cli.check_size(200, 200, 1)
    schedule_cli.check_size(64, 64, 4)
    with pytest.raises(ValueError, match=f"{schedule_cli.MAX_ACTIONS:,} actions"):
        schedule_cli.check_size(3000, 1, 1)


# ----------------------------------------------------------------------------- 6: stderr is only the error

def test_rank_success_writes_nothing_to_stderr(capsys):
    code, _out, err = run_cli(capsys, "rank", SMALL, "--workers", 1, "--kinds", "dp")
    assert code == 0 and err == ""


def test_search_success_writes_nothing_to_stderr(capsys):
    code, _out, err = run_cli(capsys, "search", SMALL, "--gpus", 2, "--no-simulate")
    assert code == 0 and err == ""


def test_failing_report_prints_only_the_error(capsys, tmp_path):
    result = run_cli(capsys, "report", SMALL, "--set", "cluster.num_nodes=0", "--out", tmp_path / "r")
    line = assert_only_line(result, "cluster.num_nodes")
    assert "building" not in line and not (tmp_path / "r").exists()


# ----------------------------------------------------------------------------- 7: help text

@pytest.mark.parametrize("command", ["demo", "compare", "report"])
def test_strategies_help_lists_pipeline_specs(capsys, command):
    code, out, _err = run_cli(capsys, command, "--help")
    text = " ".join(out.split())
    assert code == 0
    assert "ghp:G" in text and "KIND:m" in text and "interleaved_1f1b" in text


# ----------------------------------------------------------------------------- 8: a second audit

@pytest.mark.parametrize("argv, needles", [
    (("rank", SMALL, "--top", "abc"), ("ghpsim rank: error:", "--top", "'abc'", "ghpsim rank --help")),
    (("nosuchcommand",), ("ghpsim: error:", "'nosuchcommand'")),
    (("schedule", "1f1b", "--stages", "4"), ("--microbatches",)),
])
def test_argument_errors_are_one_line(capsys, argv, needles):
    """argparse's usage block is not printed: one line naming the flag, exit 2."""
    assert_only_line(run_cli(capsys, *argv), *needles)


def test_output_paths_that_are_not_regular_files_are_refused(capsys, tmp_path):
    """A rename onto a FIFO or a device would replace it: refused, the FIFO kept."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert_only_line(run_cli(capsys, "simulate", SMALL, "--trace", fifo), "--trace", fifo, "not a regular file")
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert_only_line(run_cli(capsys, "simulate", SMALL, "--trace", ""), "--trace", "needs a file name")
    assert_only_line(run_cli(capsys, "simulate", SMALL, "--memory-plot", ""), "--memory-plot", "needs a file name")


def test_an_output_symlink_is_written_through(capsys, tmp_path):
    target, link = tmp_path / "trace.json", tmp_path / "link.json"
    link.symlink_to(target)
    code, _out, err = run_cli(capsys, "simulate", SMALL, "--trace", link)
    assert code == 0 and err == ""
    assert link.is_symlink() and json.loads(target.read_text())["traceEvents"]


@pytest.mark.parametrize("override, needles, absent", [
    ("strategy.partition=[4,0]", ("strategy.partition.1:", "greater than 0", "(got 0)"), ("literal[", "tuple[")),
    ("strategy.placement=foo", ("strategy.placement:", "'group_per_node'", "'foo'"), ("literal[", "tuple[")),
])
def test_union_fields_name_the_branch_the_input_meant(capsys, override, needles, absent):
    line = assert_only_line(run_cli(capsys, "simulate", SMALL, "--set", override), *needles)
    assert not any(part in line for part in absent), line


def test_an_unknown_peak_dtype_is_refused(capsys, tmp_path):
    gpu = {"peak_flops_per_s": {"fp32": 1e13, "fp61": 2e13}, "memory_bytes": "16 GiB",
           "memory_bandwidth_bytes_per_s": "900 GB/s"}
    path = write_scenario(tmp_path, cluster={"num_nodes": 1, "gpus_per_node": 2, "gpu": gpu})
    assert_only_line(run_cli(capsys, "simulate", path), "cluster.gpu.peak_flops_per_s.fp61", "'fp32'", "'fp61'")


def test_a_failed_sweep_leaves_no_new_folder(capsys, tmp_path):
    """A bad axis is refused before the output folder is made."""
    base = write_scenario(tmp_path)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"name: s\nbase: {base.name}\naxes:\n  cluster.gpu.memory_bytes: [1, 2]\n")
    out = tmp_path / "out"
    assert_only_line(run_cli(capsys, "sweep", sweep, "--out", out), "cluster.gpu", "not a mapping")
    assert not out.exists()


def test_a_price_needs_the_run_length(capsys):
    assert_only_line(run_cli(capsys, "rank", SMALL, "--price-per-gpu-hour", "2"), "--price-per-gpu-hour",
                     "--tokens or --steps")


def test_a_folder_as_the_scenario_says_so(capsys, tmp_path):
    assert_only_line(run_cli(capsys, "simulate", tmp_path), str(tmp_path), "is a directory")


def test_merge_profiles_refuses_the_same_file_twice(capsys, tmp_path):
    profile = tmp_path / "p.json"
    profile.write_text("{}")
    assert_only_line(run_cli(capsys, "merge-profiles", profile, profile, "--out", tmp_path / "out.json"),
                     "same file", "counts once")
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("kind, flag", [("gpipe", "--no-stash"), ("1f1b", "--weight-prediction=forward")])
def test_schedule_flags_of_other_kinds_are_refused(capsys, kind, flag):
    assert_only_line(run_cli(capsys, "schedule", kind, "--stages", 2, "--microbatches", 2, flag),
                     flag.split("=")[0], kind)


# ----------------------------------------------------------------------------- 9: a user audit

@pytest.mark.parametrize("argv, needles", [
    (("rank", SMALL, "--gpus", "8,8"), ("--gpus '8,8'", "8 is given twice")),
    (("rank", SMALL, "--gpus", "8,08"), ("--gpus '8,08'", "8 is given twice")),
    (("rank", SMALL, "--gpus", ""), ("--gpus", "''", "empty list")),
    (("rank", SMALL, "--kinds", "dp,dp"), ("--kinds 'dp,dp'", "dp is given twice")),
    (("rank", SMALL, "--microbatch-sizes", "1,2,1"), ("--microbatch-sizes '1,2,1'", "1 is given twice")),
    (("rank", SMALL, "--gpus", "4", "--microbatch-sizes", "5,7"),
     ("--microbatch-sizes", "none of 5,7 divides training.global_batch_size")),
    (("search", SMALL, "--gpus", "4,4"), ("--gpus '4,4'", "4 is given twice")),
    (("search", SMALL, "--gpus", ""), ("--gpus", "''", "empty list")),
    (("compare", SMALL, "--strategies", "dp,dp"), ("--strategies 'dp,dp'", "dp is given twice")),
    (("compare", SMALL, "--strategies", "gpipe:4,gpipe:04"), ("--strategies", "gpipe:4 is given twice")),
])
def test_a_list_flag_with_a_repeated_or_no_value_is_refused(capsys, argv, needles):
    assert_only_line(run_cli(capsys, *argv), *needles)


def test_an_output_that_is_the_scenario_is_refused(capsys, tmp_path):
    scenario = tmp_path / "x.yaml"
    scenario.write_text(open(SMALL).read())
    before = scenario.read_bytes()
    assert_only_line(run_cli(capsys, "simulate", scenario, "--trace", scenario), "--trace", "the scenario",
                     str(scenario))
    assert_only_line(run_cli(capsys, "simulate", scenario, "--trace", tmp_path / "sub" / ".." / "x.yaml"),
                     "--trace", "the scenario")
    assert scenario.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["x.yaml"]


def test_an_output_that_is_the_model_file_or_the_profile_is_refused(capsys, tmp_path):
    layers = tmp_path / "layers.yaml"
    layers.write_text(open("scenarios/layers/tiny_mlp.yaml").read())
    path = write_scenario(tmp_path, model={"file": "layers.yaml"})
    assert_only_line(run_cli(capsys, "simulate", path, "--trace", layers), "--trace", "model.file", "layers.yaml")
    profile = tmp_path / "p.json"
    profile.write_text("{}")
    assert_only_line(run_cli(capsys, "simulate", path, "--trace", profile, "--profile", profile),
                     "--trace", "--profile", str(profile))
    assert profile.read_text() == "{}"


def test_two_outputs_on_one_file_are_refused_and_each_written_one_says_so(capsys, tmp_path):
    same = tmp_path / "same.png"
    assert_only_line(run_cli(capsys, "simulate", SMALL, "--trace", same, "--memory-plot", same),
                     "--memory-plot", "--trace", str(same))
    assert not same.exists()
    trace, plot = tmp_path / "t.json", tmp_path / "m.png"
    code, out, err = run_cli(capsys, "simulate", SMALL, "--trace", trace, "--memory-plot", plot)
    assert code == 0 and err == ""
    assert f"trace written to {trace}" in out and f"memory plot written to {plot}" in out
    assert plot.read_bytes()[:4] == b"\x89PNG" and json.loads(trace.read_text())["traceEvents"]


def test_an_unrecognized_argument_points_to_the_commands_help(capsys, tmp_path):
    assert_only_line(run_cli(capsys, "fit", tmp_path / "runs.csv", "--out", tmp_path / "x.json", "--bogus"),
                     "ghpsim fit: error: unrecognized arguments: --bogus", "(see ghpsim fit --help)")
    assert_only_line(run_cli(capsys, "simulate", SMALL, "extra"), "unrecognized arguments: extra",
                     "(see ghpsim simulate --help)")


def test_a_value_that_begins_with_a_dash_gets_a_hint(capsys, tmp_path):
    line = assert_only_line(run_cli(capsys, "import-model", "mymods:conv", "--input-shape", "-3,8,8", "--out",
                                    tmp_path / "x.yaml"), "--input-shape", "'-3,8,8'", "--input-shape=-3,8,8")
    assert line.endswith("(see ghpsim import-model --help)")
    assert_only_line(run_cli(capsys, "import-model", "mymods:conv", "--input-shape=-3,8,8", "--out",
                             tmp_path / "x.yaml"), "--input-shape", "'-3,8,8'", "positive integers")
    assert not (tmp_path / "x.yaml").exists()


def test_calibrate_refuses_its_scenario_as_out_and_a_repeated_batch_size(capsys, tmp_path):
    pytest.importorskip("torch")
    scenario = tmp_path / "x.yaml"
    scenario.write_text(open(SMALL).read())
    assert_only_line(run_cli(capsys, "calibrate", "--scenario", scenario, "--out", scenario), "--out", "--scenario",
                     str(scenario))
    assert_only_line(run_cli(capsys, "calibrate", "--scenario", scenario, "--out", tmp_path / "p.json",
                             "--batch-sizes", "4,16,4"), "--batch-sizes '4,16,4'", "4 is given twice")
    assert sorted(os.listdir(tmp_path)) == ["x.yaml"]


def test_a_compare_item_that_cannot_run_is_named_by_its_list_item(capsys):
    assert_only_line(run_cli(capsys, "compare", "scenarios/demo.yaml", "--strategies", "gpipe:4,gpipe:3"),
                     "strategy.num_microbatches: 3 does not divide the group batch 64", "(--strategies item gpipe:3)")


def test_schedule_refuses_an_interleaved_schedule_of_one_stage_as_a_scenario_does(capsys):
    assert_only_line(run_cli(capsys, "schedule", "interleaved_1f1b", "--stages", "1", "--microbatches", "2"),
                     "--stages 1: interleaved_1f1b needs at least 2 stages")


def test_a_full_disk_under_stdout_is_one_line_without_an_empty_name(monkeypatch, capsys):
    import errno
    import sys
    from ghpsim.cli import main

    class FullDisk:
        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", FullDisk())
    code = main(["simulate", SMALL])
    assert code == 2 and capsys.readouterr().err == f"ghpsim: error: {os.strerror(errno.ENOSPC)}\n"
