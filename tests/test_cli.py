"""The `ghpsim` command line: demo, simulate (--json, --set, --trace), compare, list."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ghpsim.cli import main
from simulator import load_scenario, simulate

ROOT = Path(__file__).resolve().parent.parent
SMALL = str(ROOT / "scenarios" / "small_fast_dp_wins.yaml")
GHP = str(ROOT / "scenarios" / "resnet1001_ghp_10gbe.yaml")


def run_cli(capsys, *argv):
    """main(argv) in-process -> (exit code, stdout, stderr)."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_json(capsys, *argv):
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_demo_subprocess_prints_all_three_strategies():
    done = subprocess.run([sys.executable, "-m", "ghpsim", "demo"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if "(G=" in line]
    assert len(rows) == 3
    for kind in ("dp", "mp", "ghp"):
        assert any(f"{kind} (G=" in row for row in rows), kind
    assert "Traceback" not in done.stderr


def test_demo_json(capsys):
    document = run_json(capsys, "demo")
    strategies = sorted(row["strategy"].split()[0] for row in document["results"])
    assert strategies == ["dp", "ghp", "mp"]


def test_simulate_json_keys_and_time_split(capsys):
    summary = run_json(capsys, "simulate", GHP)
    for key in ("step_time_s", "throughput_samples_per_s", "num_gpus", "strategy", "devices"):
        assert key in summary, key
    assert summary["strategy"] == "ghp"
    assert summary["num_gpus"] == 16 == len(summary["devices"])
    step = summary["step_time_s"]
    assert step > 0
    assert summary["throughput_samples_per_s"] == pytest.approx(summary["global_batch_size"] / step)
    assert sorted(row["rank"] for row in summary["devices"]) == list(range(16))
    for row in summary["devices"]:
        for key in ("rank", "compute_s", "comm_s", "idle_s"):
            assert key in row, key
        assert min(row["compute_s"], row["comm_s"], row["idle_s"]) >= 0
        total = row["compute_s"] + row["comm_s"] + row["idle_s"]
        assert total == pytest.approx(step, rel=1e-9, abs=0), row


def test_simulate_set_overrides(capsys):
    before = run_json(capsys, "simulate", SMALL)
    after = run_json(capsys, "simulate", SMALL, "--set", "cluster.num_nodes=2",
                     "--set", "training.global_batch_size=32")
    assert before["num_gpus"] == 4 and before["global_batch_size"] == 128
    assert after["num_gpus"] == 8 and after["global_batch_size"] == 32
    assert len(after["devices"]) == 8


def test_set_value_is_parsed_as_yaml(capsys):
    summary = run_json(capsys, "simulate", SMALL, "--set", "strategy.placement=[3, 2, 1, 0]",
                       "--set", "strategy.bucket_size_bytes=1 MiB")
    assert summary["placement"] == [3, 2, 1, 0]
    assert [row["device"] for row in summary["devices"]] == [3, 2, 1, 0]


def test_simulate_plain_output(capsys):
    code, out, err = run_cli(capsys, "simulate", SMALL)
    assert code == 0 and err == ""
    assert "step time" in out and "small_fast_dp_wins" in out


def test_simulate_trace(capsys, tmp_path):
    trace = tmp_path / "sub" / "f.json"
    code, out, err = run_cli(capsys, "simulate", GHP, "--trace", str(trace))
    assert code == 0, err
    assert str(trace) in out
    document = json.loads(trace.read_text())
    events = document["traceEvents"]
    spans = simulate(load_scenario(GHP)).spans
    complete = [event for event in events if event["ph"] == "X"]
    assert len(complete) == len(spans) > 0
    for event in complete:
        assert event["ts"] >= 0 and event["dur"] >= 0
    assert not list(trace.parent.glob("*.tmp"))


def test_compare_json_sorted(capsys):
    document = run_json(capsys, "compare", SMALL, "--strategies", "dp,mp,ghp:2")
    times = [row["step_time_s"] for row in document["results"]]
    assert len(times) == 3 and times == sorted(times)
    labels = [row["strategy"] for row in document["results"]]
    assert any(label.startswith("ghp (G=2 x M=2)") for label in labels)
    assert [s["step_time_s"] for s in document["summaries"]] == times


def test_compare_table(capsys):
    code, out, _ = run_cli(capsys, "compare", SMALL, "--strategies", "dp,mp,ghp:2")
    assert code == 0
    assert sum("(G=" in line for line in out.splitlines()) == 3
    assert "(with" not in out


def test_compare_title_names_the_overrides(capsys):
    """The title quotes the scenario's description, which an override may contradict."""
    code, out, _ = run_cli(capsys, "compare", SMALL, "--strategies", "dp", "--set", "cluster.inter_node_link=25gbe")
    assert code == 0 and "(with cluster.inter_node_link=25gbe)" in out.replace("\n", " ")


@pytest.mark.parametrize("what, expected", [("gpus", "A100-80GB"), ("links", "nvlink3-a100"),
                                            ("models", "resnet1001")])
def test_list(capsys, what, expected):
    code, out, err = run_cli(capsys, "list", what)
    assert code == 0 and err == ""
    assert expected in out


def test_list_aligns_every_preset_name_in_one_column(capsys):
    code, out, _ = run_cli(capsys, "list", "gpus")
    header, *rows = out.splitlines()
    assert header.split()[:3] == ["GPU", "memory", "bandwidth"] and "(TFLOP/s)" in header
    columns = {line.index(" GiB") for line in rows}
    assert code == 0 and len(columns) == 1, columns  # the longest names (A100-80GB-PCIe) too
    assert "0.18375T" not in out and "fp16 0.1837" in out  # P40's peaks in TFLOP/s, 4 significant digits


def test_list_models_gives_each_models_size_and_input(capsys):
    code, out, _ = run_cli(capsys, "list", "models")
    header, *rows = out.splitlines()
    assert code == 0 and header.split()[:3] == ["model", "parameters", "layers"]
    by_name = {row.split()[0]: row for row in rows}
    assert "70.55 B" in by_name["llama3-70b"] and "8,192 tokens, vocabulary 128,256" in by_name["llama3-70b"]
    assert "25.56 M" in by_name["resnet50"] and "3x224x224 inputs, 1000 classes" in by_name["resnet50"]


@pytest.mark.parametrize("what", ["gpus", "links", "models"])
def test_list_json_gives_every_preset_with_its_fields(capsys, what):
    from simulator.hardware import GPUS, LINKS
    from simulator.zoo import MODELS
    code, out, err = run_cli(capsys, "list", what, "--json")
    assert code == 0 and err == ""
    rows = json.loads(out)
    if what == "models":
        assert rows == list(MODELS)
        return
    presets = GPUS if what == "gpus" else LINKS
    assert [row["name"] for row in rows] == list(presets)
    assert all(row["source"] == presets[row["name"]].source for row in rows)
    if what == "gpus":
        assert rows[[row["name"] for row in rows].index("A100-80GB")]["peak_flops_per_s"]["bf16"] == 312e12


def test_list_rejects_unknown_category(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["list", "nodes"])
    assert exit_info.value.code == 2


MLP_CPU = str(ROOT / "scenarios" / "validation" / "mlp_cpu.yaml")
MLP_PROFILE = str(ROOT / "reports" / "profiles" / "mlp_cpu_ws2.json")


def test_simulate_and_compare_with_a_calibration_profile(capsys):
    """--profile: the step time is the profile's cost model's (as `ghpsim validate` predicts it),
    not the analytic model's."""
    from simulator.compare import with_strategy
    from simulator.model_source import resolve_workload
    from simulator.profile import load_profile
    from simulator.profile_costs import ProfileCosts

    overrides = ("--set", "cluster.gpus_per_node=2", "--set", "strategy.kind=mp")
    scenario = load_scenario(MLP_CPU, ["cluster.gpus_per_node=2", "strategy.kind=mp"])
    workload = resolve_workload(scenario.model, scenario.base_dir)
    profile = load_profile(MLP_PROFILE)
    expected = simulate(scenario, costs=ProfileCosts(profile, workload), workload=workload)
    summary = run_json(capsys, "simulate", MLP_CPU, *overrides, "--profile", MLP_PROFILE)
    assert summary["step_time_s"] == pytest.approx(expected.step_time_s, rel=1e-12)
    assert summary["step_time_s"] != pytest.approx(run_json(capsys, "simulate", MLP_CPU, *overrides)["step_time_s"])

    document = run_json(capsys, "compare", MLP_CPU, "--set", "cluster.gpus_per_node=2", "--strategies", "dp,mp",
                        "--profile", MLP_PROFILE)
    dp = simulate(with_strategy(scenario, "dp", None), costs=ProfileCosts(profile, workload),
                  workload=workload)
    times = {row["strategy"].split()[0]: row["step_time_s"] for row in document["results"]}
    assert times == pytest.approx({"mp": expected.step_time_s, "dp": dp.step_time_s}, rel=1e-12)


@pytest.mark.parametrize("profile,optimizer,message", [
    ("missing.json", "sgd", "missing.json: profile not found"),
    (MLP_PROFILE, "adam", "optimizer.name: the profile timed 'sgd' but the scenario trains with 'adam'"),
])
def test_a_bad_profile_is_a_one_line_error(capsys, tmp_path, profile, optimizer, message):
    path = profile if profile == MLP_PROFILE else str(tmp_path / profile)
    code, out, err = run_cli(capsys, "simulate", MLP_CPU, "--set", f"training.optimizer={optimizer}",
                             "--profile", path)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


# ----------------------------------------------------------------------------- help matches behaviour

def help_of(capsys, *argv) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_profile_help_names_the_kernel_model_default_and_fit_profiles(capsys, command):
    text = help_of(capsys, command)
    assert "analytic costs" not in text and "`ghpsim fit`" in text and "`ghpsim calibrate`" in text
    assert "auto: the kernel model where the GPU has kernel tables" in text
    code, out, _ = run_cli(capsys, command, SMALL)  # without a profile: the kernel model, as the help says
    assert code == 0 and ("compute model: kernel (costs.model auto" in out or command == "compare")


def test_rank_help_says_what_each_microbatch_flag_controls_and_the_defaults(capsys):
    text = help_of(capsys, "rank")
    assert "for kind megatron" not in text and "not megatron, see --microbatch-sizes" in text
    assert "micro-batch sizes b tried for megatron layouts, each giving m = B / (d x b)" in text
    assert "m = 1 where b is a replica's whole batch" in text
    assert "(all simulated ones are in --json; default 10)" in text and "default 1,2,4,8" in text


def test_megatron_micro_batches_come_from_the_sizes_b():
    """What the help says: a megatron layout's m is B / (d x b) for b of --microbatch-sizes (m = 1
    where b = B / d), whatever --microbatches (the pipeline kinds' counts) says."""
    from simulator.layout_search import megatron_space
    from simulator.model_source import resolve_workload
    from tests.test_layout_search import tiny_llm
    scenario = load_scenario(tiny_llm(batch=8), [])
    space = megatron_space(scenario, resolve_workload(scenario.model, scenario.base_dir), (1, 2))
    assert {c.num_microbatches for c in space} == {1, 2, 4, 8}
    for c in space:
        assert 8 // c.data_parallel // c.num_microbatches in (1, 2), c.label
    assert any(c.num_microbatches == 1 and c.data_parallel == 4 for c in space)  # b = 2 = B / d


@pytest.mark.parametrize("command, phrases", [
    ("validate", ("(median reported; default 10)", "(median over all their steps; default 1)",
                  "(default reports/validation)", "declared hung (default 600)", "schedules (default own)")),
    ("calibrate", ("(comma list; default 4,16,64)",)),
])
def test_defaults_are_in_the_help(capsys, command, phrases):
    text = help_of(capsys, command)
    for phrase in phrases:
        assert phrase in text, phrase


def test_the_copied_calibration_batch_sizes_match_the_validator():
    pytest.importorskip("torch")
    from ghpsim import arguments
    from validator.calibrate import DEFAULT_BATCH_SIZES
    assert arguments.CALIBRATE_BATCH_SIZES == DEFAULT_BATCH_SIZES
