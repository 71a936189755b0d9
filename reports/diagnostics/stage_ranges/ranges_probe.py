"""Twenty-third session's probe: the weight passes and the update in cycle timed over every
contiguous range of a validation model's layers on one rank (`validator.weight_pass_bench`, micro-
batch 16 as the calibration), then per-layer costs fitted to the singles and prefixes alone (the
calibration's sets before this session, `simulator.weight_pass_layers.per_layer_costs`) compared
with each range's own median. Prints the error of that sum per pass over all ranges, and for the
stages of the 2- and 4-stage partitions given, `per-layer sum / own median` in ms.

Run: python reports/diagnostics/stage_ranges/ranges_probe.py {resnet20|mlp|transformer} [PARTITION ...]
     PARTITION: stage ranges as first-last,first-last,... e.g. 0-4,5-10
"""

import sys
import time

import numpy as np
import torch

from simulator.model_source import resolve_workload
from simulator.scenario import ModelConfig
from simulator.weight_pass_layers import calibration_layer_sets, per_layer_costs
from validator.models import build_modules, make_batch
from validator.weight_pass_bench import time_weight_passes

PARAMS = {"resnet20": {"width_multiplier": 0.5, "image_size": 16},
          "mlp": {"input_dim": 512, "hidden_dim": 1024, "num_hidden_layers": 6, "num_classes": 10},
          "transformer": {"num_layers": 4, "hidden_size": 128, "num_heads": 4, "seq_len": 32, "vocab_size": 512}}


def timed_layer_ranges(params):
    """Every contiguous range of layers, by last layer then first layer downward, a range kept when
    no earlier one held the same layers with weights (the candidate's sets, not kept: ./results.md)."""
    sets, seen = [], set()
    for end in range(1, len(params) + 1):
        for start in range(end - 1, -1, -1):
            key = tuple(layer for layer in range(start, end) if params[layer] > 0)
            if key and key not in seen:
                seen.add(key)
                sets.append(tuple(range(start, end)))
    return sets


def main() -> None:
    torch.set_num_threads(1)
    model = sys.argv[1]
    workload = resolve_workload(ModelConfig(name=model, params=PARAMS[model]))
    layer_params = [layer.num_params for layer in workload.layers]
    modules = build_modules(workload)
    batch, _ = make_batch(workload, 16)
    ranges = [list(layers) for layers in timed_layer_ranges(layer_params)]
    start = time.perf_counter()
    timed = time_weight_passes(modules, ranges, batch, optimizer="momentum")
    print(f"{model}: {len(ranges)} ranges timed in {time.perf_counter() - start:.1f} s (one rank)")
    weighted = [tuple(layer for layer in layers if layer_params[layer] > 0) for layers in ranges]
    by_range = {(layers[0], layers[-1]): entry for layers, entry in zip(ranges, timed)}
    for name in ("stash_s", "predict_s", "accumulate_s", "update_s"):
        prefix_sets = calibration_layer_sets(layer_params)
        costs = per_layer_costs(prefix_sets, [timed[weighted.index(s)][name] for s in prefix_sets], len(layer_params))
        errors = np.array([(costs[first:last + 1].sum() / entry[name] - 1) * 100
                           for (first, last), entry in by_range.items()])
        print(f"  {name[:-2]:10s} per-layer sum (singles+prefixes) vs own range: median {np.median(errors):+.1f} %, "
              f"p10 {np.percentile(errors, 10):+.1f}, p90 {np.percentile(errors, 90):+.1f}, "
              f"worst {errors[np.argmax(np.abs(errors))]:+.1f}")
        for partition in sys.argv[2:]:
            stages = [tuple(int(v) for v in part.split("-")) for part in partition.split(",")]
            print(f"      {partition:18s}", " ".join(f"{costs[first:last + 1].sum() * 1e3:.3f}/"
                                                    f"{by_range[(first, last)][name] * 1e3:.3f}" for first, last in stages))


if __name__ == "__main__":
    main()
