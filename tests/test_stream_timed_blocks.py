"""validator.microbench._time_blocks with deferred readers (the CUDA path): a block's iterations
are all enqueued before any of them is read, and the figures are the block means' medians."""

from validator.microbench import _time_blocks


def test_block_figures_are_means_over_the_blocks_deferred_iterations():
    issued = iter(range(10_000))

    def run():
        index = next(issued)
        return lambda: (0.001 * (1 + index % 2), 0.0)  # forward alternates 1 and 2 ms

    # the second probe (index 1) reads 2 ms, so a block of >= 4 ms holds 2 iterations: 1 and 2 ms
    forward_s, backward_s = _time_blocks(run, repeats=3, warmup=1, min_block_s=0.004, agree=lambda n: n)
    assert abs(forward_s - 0.0015) < 1e-12 and backward_s == 0.0


def test_a_block_of_several_iterations_reads_after_enqueueing_all():
    log = []

    def run():
        log.append("run")
        return lambda: (log.append("read") or (0.001, 0.002))

    forward_s, backward_s = _time_blocks(run, repeats=2, warmup=0, min_block_s=0.012, agree=lambda n: n)
    assert (forward_s, backward_s) == (0.001, 0.002)
    blocks = "".join("r" if entry == "run" else "R" for entry in log)
    # two probes read at once, then 2 blocks of 4 iterations (0.012 / 0.003): all runs, then all reads
    assert blocks == "rR" + "rR" + ("rrrr" + "RRRR") * 2


def test_plain_tuples_still_time_on_the_host():
    assert _time_blocks(lambda: (0.5, 0.25), repeats=3, warmup=1, min_block_s=0.0, agree=lambda n: n) == (0.5, 0.25)
