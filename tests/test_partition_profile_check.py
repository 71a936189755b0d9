"""`ghpsim partition --profile`: the workers must be a number of ranks the profile timed.

A calibration at world size W holds compute timed with W ranks at once (and its `compute_slowdown`
levels); `simulate --profile` refuses a scenario of more ranks than the profile holds. `partition`
refuses N > W, or N not among the profile's levels, in one line naming --workers, --profile and both
values (exit 2), and rescales the compute fits to N ranks at once (simulator/partition_cli.py). A
kernel profile prices the scenario's GPU, as with `simulate --profile`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ghpsim.cli import main
from simulator import load_scenario
from simulator.collective_forms import ring_allreduce_time_s
from simulator.fabrics import build_topology
from simulator.model_source import resolve_workload
from simulator.pipedream_costs import ring_figures
from simulator.workload import dtype_bytes

ROOT = Path(__file__).resolve().parent.parent
MLP_CPU = str(ROOT / "scenarios" / "validation" / "mlp_cpu.yaml")  # 1 x 4 CPU ranks
PROFILES = ROOT / "reports" / "profiles"
WS2 = str(PROFILES / "mlp_cpu_ws2.json")  # world size 2, ranks sharing the host's processors
WS4 = str(PROFILES / "mlp_cpu_ws4.json")  # world size 4, compute_slowdown at 1, 2 and 4 ranks
WS4_CUDA = str(PROFILES / "mlp_cpu_ws4_cuda.json")  # world size 4, no shared processors


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(capsys, *argv) -> str:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err.strip()


@pytest.mark.parametrize("json_flag", [(), ("--json",)])
def test_default_workers_beyond_the_profile_world_size_are_refused(capsys, json_flag):
    line = one_line_error(capsys, "partition", MLP_CPU, "--profile", WS2, *json_flag)
    assert "--workers: 4 workers (the default: the scenario's GPU count)" in line
    assert f"--profile {WS2} was calibrated at world size 2" in line and "--workers 2 or fewer" in line


def test_explicit_workers_beyond_the_profile_world_size_are_refused(capsys):
    line = one_line_error(capsys, "partition", MLP_CPU, "--profile", WS2, "--workers", "4", "--json")
    assert line.startswith("ghpsim: error: --workers: 4 workers, but --profile")
    assert "world size 2" in line and "calibrate at world size 4" in line


def test_simulate_refuses_the_same_mismatch(capsys):
    # the behaviour partition now follows: more ranks than the profile holds is an error
    line = one_line_error(capsys, "simulate", MLP_CPU, "--profile", WS2)
    assert "no fit for a group of 4 ranks" in line and "--set cluster.num_nodes=1 --set cluster.gpus_per_node=2" in line


def test_a_kernel_profile_prices_the_scenario_gpu_as_simulate_does(capsys):
    kernels = str(ROOT / "reports" / "gpu" / "h200_kernels" / "kernel_profile.json")  # measured on an H200
    scenario = str(ROOT / "scenarios" / "runs" / "megatron_gpt_a100_node.yaml")
    line = one_line_error(capsys, "partition", scenario, "--profile", kernels, "--workers", "8")
    assert "architecture: measured on 'hopper' GPUs, but cluster.gpu 'A100-80GB' is 'ampere'" in line
    args = ("partition", scenario, "--workers", "8", "--set", "cluster.gpu=H200", "--json")
    code, out, err = run_cli(capsys, *args, "--profile", kernels)
    assert code == 0, err
    measured = json.loads(out)["pipedream"]["time_per_microbatch_s"]
    code, out, err = run_cli(capsys, *args)
    assert code == 0 and json.loads(out)["pipedream"]["time_per_microbatch_s"] != measured


def test_workers_the_profile_did_not_time_at_once_are_refused(capsys):
    line = one_line_error(capsys, "partition", MLP_CPU, "--profile", WS4, "--workers", "3")
    assert "--workers: 3 workers" in line and f"--profile {WS4} (world size 4)" in line
    assert "1, 2, 4 ranks at once" in line


@pytest.mark.parametrize("profile, workers, remedy", [
    ("mlp_cpu_ws2.json", (), "give --workers 2 or fewer, or calibrate at world size 4"),
    ("mlp_cpu_ws4.json", ("--workers", "3"), "timed compute with 1, 2, 4 ranks at once only; give one of those")])
def test_a_long_profile_path_is_shortened_at_its_front_and_the_remedy_kept(tmp_path, capsys, profile, workers, remedy):
    """A scenario and profile deep in long folders: the path loses its front, never the message its end."""
    import shutil
    folder = tmp_path.joinpath(*(f"a_rather_long_folder_name_for_testing_{i}" for i in range(6)))
    folder.mkdir(parents=True)
    shutil.copy(MLP_CPU, folder)
    shutil.copy(PROFILES / profile, folder)
    line = one_line_error(capsys, "partition", str(folder / "mlp_cpu.yaml"), "--profile", str(folder / profile),
                          *workers)
    assert line.endswith(remedy), line
    assert f"--profile .../a_rather_long_folder_name_for_testing_5/{profile} " in line


def test_a_scenario_shrunk_to_the_profile_world_size_partitions(capsys):
    code, out, err = run_cli(capsys, "partition", MLP_CPU, "--profile", WS2, "--set", "cluster.gpus_per_node=2",
                             "--json")
    assert code == 0, err
    assert json.loads(out)["num_workers"] == 2


@pytest.mark.parametrize("profile, workers", [(WS4, 4), (WS4, 2), (WS4_CUDA, 2), (WS2, 2)])
def test_compute_is_rescaled_to_the_workers_computing_at_once(capsys, profile, workers):
    # plain DP over N workers: (forward + backward of every layer at b from the profile's fits,
    # times compute_slowdown[N] / compute_slowdown[W], + a ring allreduce of the gradients) / N
    code, out, err = run_cli(capsys, "partition", MLP_CPU, "--profile", profile, "--workers", str(workers), "--json")
    assert code == 0, err
    document = json.loads(out)
    fits = json.loads(Path(profile).read_text())
    slowdown = {int(k): v for k, v in fits["compute_slowdown"].items()}
    scale = slowdown[workers] / slowdown[fits["world_size"]]
    batch = document["microbatch_size"]
    compute_s = scale * sum(layer[phase]["intercept_s"] + layer[phase]["per_sample_s"] * batch
                            for layer in fits["layers"] for phase in ("forward", "backward"))
    scenario = load_scenario(MLP_CPU)
    workload = resolve_workload(scenario.model, scenario.base_dir)
    ring = ring_figures(build_topology(scenario.cluster), list(range(workers)))
    sync_s = ring_allreduce_time_s(workload.num_params * dtype_bytes(scenario.training.dtype), workers, *ring)
    assert document["plain_dp"]["time_per_microbatch_s"] == pytest.approx((compute_s + sync_s) / workers, rel=1e-9)
