"""Does a stage's backward through the modules age like the backward on a weight copy? For each
validation model's 4-stage layer sets, one process, one thread, micro-batch 16, the calibration's
aged cycles (`validator.weight_pass_bench._aged_cycle`, through `age_probe.timed_sets`) at ages
0-3, on copies and through the modules; prints per model the medians over the sets of each one's growth with age and of copy over
modules at the same age. Writes nothing.

    python reports/diagnostics/copy_age/growth_probe.py mlp_cpu,resnet_cpu,transformer_cpu

Why (twenty-ninth session, after the first candidate's fresh run): that candidate charged the
copy's age over the fresh modules' backward and moved the transformer's 4-stage asynchronous cases
from +6 to +12 %, while synchronous plans, whose stages keep as many micro-batches in flight, are
charged the fresh modules' backward.
"""
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from age_probe import timed_sets  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    for name in sys.argv[1].split(","):
        rows = [([item["copy_cycle_fresh_s"], *item["aged_copy_backward_s"]], item["aged_module_backward_s"])
                for item in timed_sets(name)]

        def median(ratio) -> list[float]:
            return [round(statistics.median(ratio(copies, modules, age) for copies, modules in rows), 3)
                    for age in range(4)]

        print(name, "module aged/fresh", median(lambda c, m, a: m[a] / m[0]),
              "copy aged/fresh", median(lambda c, m, a: c[a] / c[0]),
              "copy/module same age", median(lambda c, m, a: c[a] / m[a]))


if __name__ == "__main__":
    main()
