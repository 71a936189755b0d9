"""What-if (a diagnostic fitted on measured spans, not a model): the ResNet-20's 2-stage asynchronous
cases with the per-message work its own runs spent (twenty-fifth session).

The model plays asynchronous plans' messages with the figures timed in the pipeline runtime on a
synthetic MLP (`handoff.runtime`: isend call about 0.16 ms, wait on an arrived message about 0.17 ms
on the rank's thread). The ResNet's own runs spent 0.07 and 0.05 ms (medians, ninth run's step
spans, `../concurrent_passes/resnet2_step_spans.log`); the MLP's spent about 0.2 ms on each
(`../oversubscribed_rate/mlp2_step_spans.log`). MODE `none`: the model as it stands; `spans`: the
ResNet's 2-rank profiles play the spans' medians on the thread; `spans_delay`: the same, and the
isend call's difference moved into the delay to the receiver (the message's mean delay kept).
Runs without the runtime's figures do not change.

Run: python reports/diagnostics/calibration_spread/message_costs_whatif.py MODE
"""

import dataclasses
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "ws4_async_gap"))

import pandas as pd  # noqa: E402

import simulator.profile_costs as profile_costs  # noqa: E402
import whatif_variants  # noqa: E402

RESNET_SEND_POST_S, RESNET_READY_RECEIVE_S = 0.07e-3, 0.05e-3
RUNS = ("latest", "second_run", "first_run", "s18_first", "s19_fifth", "s20_fresh", "s21_fresh", "s22_fresh",
        "s22_second", "s23_fresh")
MODES = ("none", "spans", "spans_delay")


def patch(mode: str) -> None:
    whatif_variants.patch("prefix_sets")  # the model as it stands on every run's profiles
    original_init = profile_costs.ProfileCosts.__init__

    def init(self, profile, workload, **options):
        original_init(self, profile, workload, **options)
        messages = self.runtime_messages
        if mode == "none" or messages is None or not profile.model_name.startswith("resnet") \
                or profile.world_size != 2:
            return
        moved_s = messages.send_post_s - RESNET_SEND_POST_S if mode == "spans_delay" else 0.0
        self.runtime_messages = dataclasses.replace(
            messages, send_post_s=RESNET_SEND_POST_S, ready_receive_s=RESNET_READY_RECEIVE_S,
            handoff_s=messages.handoff_s + moved_s)

    profile_costs.ProfileCosts.__init__ = init


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "none"
    if mode not in MODES:
        print(f"MODE: {mode!r} is not one of {', '.join(MODES)}", file=sys.stderr)
        return 2
    patch(mode)
    frames = []
    for run in RUNS:
        errors = whatif_variants.case_errors(run, "resnet_cpu")
        errors["run"] = run
        frames.append(errors[errors["world_size"] == 2])
    table = pd.concat(frames).pivot_table(index="kind", columns="run", values="jitter_error_pct")[list(RUNS)]
    table["mean"] = table.mean(axis=1)
    pd.set_option("display.width", 250)
    print(f"# {mode}: the ResNet-20's 2-stage cases, jittered error % per run")
    print(table.round(1).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
