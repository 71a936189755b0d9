"""validator.comm_device: where messages live and how they travel; the device checks of
calibrate and validate. The CUDA staging itself ran on an H200 (reports/gpu/bench_cuda_ws*.log:
`comm check on cuda/gloo, 2 ranks: ok`); here the CPU path and the staging's copy-back."""

import subprocess
import sys

import pytest
import torch

from validator import comm_device
from validator.comm_device_check import main as comm_check_main


def test_ring_of_messages_arrives_on_gloo_cpu(capsys):
    assert comm_check_main(["--device", "cpu", "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "comm check on cpu/gloo, 2 ranks: ok" in out
    assert out.count("'blocking_ok': True, 'posted_ok': True, 'allreduce_ok': True") == 2


def test_rank_device_kind_is_checked():
    with pytest.raises(ValueError, match="'tpu'"):
        comm_device.set_rank_device("tpu")


def test_staged_receive_copies_the_host_message_into_the_device_buffer_when_waited():
    waited = []

    class Work:
        def wait(self):
            waited.append(True)

    host, target = torch.arange(6.0), torch.zeros(6)
    receive = comm_device._StagedReceive(Work(), host, target)
    assert not waited and target.sum() == 0  # nothing copied before the wait
    assert receive.wait() is True
    assert waited == [True] and torch.equal(target, torch.arange(6.0))


def test_device_problem_names_the_missing_gpu_or_the_nccl_rule(monkeypatch):
    assert comm_device.device_problem("cpu", "gloo", 4) is None
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert "no GPU" in comm_device.device_problem("cuda", "gloo", 2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert comm_device.device_problem("cuda", "gloo", 4) is None  # gloo: ranks share the GPU
    problem = comm_device.device_problem("cuda", "nccl", 2)
    assert "2 ranks but 1 GPU(s)" in problem and "gloo" in problem


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
@pytest.mark.parametrize("command", [
    ["calibrate", "--scenario", "scenarios/validation/mlp_cpu.yaml", "--out", "{tmp}/p.json", "--device", "cuda"],
    ["validate", "scenarios/validation/mlp_cpu.yaml", "--set", "cluster.gpus_per_node=2", "--strategies", "dp,mp",
     "--profile", "reports/profiles/mlp_cpu_ws2_cuda.json", "--out", "{tmp}/report"],
])
def test_cuda_without_a_gpu_is_a_one_line_error_and_writes_nothing(tmp_path, command):
    result = subprocess.run([sys.executable, "-m", "ghpsim", *(c.format(tmp=tmp_path) for c in command)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "no GPU" in result.stderr and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []
