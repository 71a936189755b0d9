"""validator.speed_probe: the reference kernel benchmarks print next to their figures."""

import torch

from validator.speed_probe import PROBE_ITERATIONS, reference_kernel_s


def test_reference_kernel_is_timed_single_threaded_and_restores_the_thread_count():
    before = torch.get_num_threads()
    seconds = reference_kernel_s(repeats=3)
    assert torch.get_num_threads() == before
    # 40 products of 256 x 256 matrices: 2 x 256^3 x 40 = 1.3 GFLOP, between 0.1 and 1000 GFLOP/s
    flops = 2 * 256**3 * PROBE_ITERATIONS
    assert flops / 1000e9 < seconds < flops / 0.1e9
