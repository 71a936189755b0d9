"""A collective's calibration figure is its mean over repeats (`validator.comm_bench`): a step pays
the sum of its collectives, so an operation that is sometimes slow counts at its expectation, not
at its fast mode. (Point-to-point keeps the median; its busy-rank delays are the message chain's.)"""

import statistics
import types

import pytest

torch = pytest.importorskip("torch")
dist = torch.distributed

from validator import comm_bench  # noqa: E402


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_sometimes_slow_operation_is_timed_at_its_mean_not_its_fast_mode(one_rank_group, monkeypatch):
    # a deterministic clock that the operation advances: every fourth sample takes 8 ms (a thread
    # that misses a time slice), the others 1 ms; the machine's load cannot move the figure
    now = [0.0]
    monkeypatch.setattr(comm_bench, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    calls = []

    def operation(position):
        calls.append(position)
        now[0] += 0.008 if len(calls) % 4 == 0 else 0.001

    (figure_s,) = comm_bench._time_collective(operation, count=1, repeats=8, group=None, warmup=0)
    assert len(calls) == 8
    samples = [0.008 if (i + 1) % 4 == 0 else 0.001 for i in range(8)]
    assert figure_s == pytest.approx(statistics.mean(samples), rel=1e-9)  # (6 x 1 + 2 x 8) / 8 = 2.75 ms
    assert figure_s != pytest.approx(statistics.median(samples))  # the median would be the fast mode, 1 ms


def test_the_statistics_skip_the_warmup_samples():
    assert comm_bench._mean([9.0, 9.0, 1.0, 3.0], warmup=2) == 2.0
    assert comm_bench._mean([4.0], warmup=2) == 4.0  # nothing after the warmup: all samples
    assert comm_bench._median([9.0, 9.0, 1.0, 1.0, 7.0], warmup=2) == 1.0
