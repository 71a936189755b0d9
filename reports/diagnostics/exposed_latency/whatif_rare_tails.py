"""What-if (nineteenth session): message tails as rare slow events instead of a mean on every message.

The model adds each message's tail (mean over median of the isend call and of the wait on an arrived
message, `ProfileCosts.asynchronous_messages`) to every message. The validator reports the median
step, though, and on this host a slow call or wait is one scheduler tick (slow waits' median
3.8-4.0 ms, `../ws2_message_tails/results.md`). If such events are rare per step, the median step
has none, and the mean overstates it; with many messages per step (4 stages) it has some. Here,
in every jitter draw, each message is slow with probability tail / SLOW_S and then costs SLOW_S
(default 4 ms), drawn with a generator seeded by the engine run's index within the
scored run (deterministic); the nominal figure
is drawn too, but only the median under jitter is scored. Prints what `../ws4_async_gap/
whatif_variants.py` prints, or with CASES=1 the ResNet's cases one by one.

    python reports/diagnostics/exposed_latency/whatif_rare_tails.py [RUN,...]
"""

import itertools
import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "reports/diagnostics/ws4_async_gap"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import simulator.engine as engine  # noqa: E402
import whatif_variants  # noqa: E402

SLOW_S = float(os.environ.get("SLOW_S", "0.004"))
_engine_runs = itertools.count()
_original_init = engine.Engine.__init__
_original_score = whatif_variants.score


def _init(self, *args, **kwargs):
    _original_init(self, *args, **kwargs)
    self._tail_draws = random.Random(next(_engine_runs))


def _score_from_seed_zero(name: str, variant: str) -> None:
    """Each run scored with engine runs seeded 0, 1, ... whatever runs came before it."""
    global _engine_runs
    _engine_runs = itertools.count()
    (resnet_cases if os.environ.get("CASES") else _original_score)(name, variant)


def _message_work(self, rank, messages, work_s, tail_s):
    yield from self._rank_work(rank, messages * work_s)
    if tail_s <= 0:
        return
    probability = min(1.0, tail_s / SLOW_S)
    slow = sum(self._tail_draws.random() < probability for _ in range(messages))
    if slow:
        yield self.env.timeout(slow * SLOW_S)


def resnet_cases(name: str, variant: str) -> None:
    for row in whatif_variants.case_errors(name, "resnet_cpu").itertuples():
        print(f"{name} resnet {row.world_size} ranks {row.kind:20s} {row.jitter_error_pct:+6.1f} %")


if __name__ == "__main__":
    engine.Engine.__init__ = _init
    engine.Engine._message_work = _message_work
    whatif_variants.score = _score_from_seed_zero
    sys.argv = [sys.argv[0], "none", *sys.argv[1:]]
    sys.exit(whatif_variants.main())
