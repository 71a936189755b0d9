"""The `burst_jitter` what-if (`results.md`), applied by `../ws4_async_gap/whatif_variants.py
burst_jitter` and by `score_other.py`: patches the current model in the caller's process only."""

import dataclasses
import statistics

import simulator.profile as simulator_profile


def over_burst_medians(rows, passes_per_burst):
    """Each row (in time order) over the median of every value in its burst of `passes_per_burst` rows."""
    factors = []
    for first in range(0, len(rows), passes_per_burst):
        burst = rows[first:first + passes_per_burst]
        median = statistics.median(value for row in burst for value in row)
        factors.extend(tuple(value / median for value in row) for row in burst)
    return tuple(factors)


def patch_burst_jitter() -> None:
    """`burst_jitter` (thirty-first session, `../burst_jitter/results.md`, not kept): the pass jitter's
    factors over the median of their own burst (`pass_jitter.passes_per_burst` rows) instead of the
    level's, for the rows of `levels` and for the work under processor sharing on a shared host."""
    import simulator.pass_jitter as pass_jitter

    parse = pass_jitter.parse_pass_jitter

    def parse_by_burst(read, document):
        jitter = parse(read, document)
        burst = (document.get("pass_jitter") or {}).get("passes_per_burst")
        if jitter is None or not burst:
            return jitter
        jitter = dataclasses.replace(jitter, levels={k: over_burst_medians(rows, burst)
                                                     for k, rows in jitter.times_s.items()})
        object.__setattr__(jitter, "passes_per_burst", burst)
        return jitter

    def speed_draws(self, level, samples, parallelism=None):
        burst = getattr(self, "passes_per_burst", None)
        if parallelism is None or not burst:
            return original_draws(self, level, samples, parallelism)
        offsets = self.start_offsets_s.get(level) or tuple((0.0,) * len(row) for row in self.levels[level])
        times = self.times_s.get(level) or self.levels[level]
        work = [pass_jitter.shared_work_s(starts, row, parallelism) for starts, row in zip(offsets, times)]
        factors = over_burst_medians(work, burst)
        return [(factors[i], offsets[i]) for i in pass_jitter._spaced(len(factors), samples)]

    original_draws = pass_jitter.PassJitter.speed_draws
    pass_jitter.PassJitter.speed_draws = speed_draws
    simulator_profile.parse_pass_jitter = parse_by_burst
