"""Which pipeline plans pay the cycle's message figures (`handoff.cycle`) on a shared host; the
model: asynchronous plans, 1F1B and interleaved 1F1B (`Engine._messages_as_in_cycle`), GPipe the
chain's. Two what-ifs of `../ws4_async_gap/whatif_variants.py`, scored in `results.md`:
`gpipe_cycle_messages` (GPipe too) and `chain_synchronous` (no synchronous plan: the rule before
the twenty-fourth session)."""

import simulator.engine as engine


def patch_message_rule(variant: str) -> None:
    if variant == "gpipe_cycle_messages":
        def messages_as_in_cycle(self, plan):
            return bool(plan.meta.get("asynchronous")) or self.host_parallelism is not None
    elif variant == "chain_synchronous":
        def messages_as_in_cycle(self, plan):
            return bool(plan.meta.get("asynchronous"))
    else:
        raise ValueError(f"no message rule {variant!r}")
    engine.Engine._messages_as_in_cycle = messages_as_in_cycle
