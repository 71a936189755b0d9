"""What-if, not the model: the asynchronous runtimes' weight passes (stash, predict, repredict,
accumulate, copy_forward) and the update timed in cycle, refitted from each profile's own per-set
medians as intercept + per_layer x (layers with weights) + per_param x parameters instead of
intercept + per_param x parameters, then the benchmark's measurements re-predicted.

Why: the calibration times them over each single layer and each prefix of layers. In the ResNet's
profiles a single layer costs about the same whatever its size (3.5k-18.6k parameters: 0.027-0.029 ms
a stash) while prefixes grow by about 0.03 ms a layer: the cost is per layer (the runtime's loop over
the layers and their tensors), and a fit on parameters alone charges a stage of few large layers too
much and one of many small layers too little. The sets' layer counts are rebuilt from the workload
(`validator.calibration_phases._layer_sets`, the layers with weights of each set); a stage's count is
found from its parameter count over the contiguous layer ranges of the model (and pairs of ranges
apart, an interleaved stage's chunks).

Run: python reports/diagnostics/cycle_compute/whatif_weight_passes_per_layer.py CSV PROFILES_DIR
"""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from simulator import profile_costs as pc
from simulator.compare import parse_strategy_specs
from simulator.model_source import resolve_workload
from simulator.scenario import load_scenario
from validator.validate import predictions

PASSES = ("stash", "predict", "repredict", "accumulate", "copy_forward")


def layer_sets(params):
    sets, seen = [], set()
    for end in range(1, len(params) + 1):
        for candidate in ([end - 1], list(range(end))):
            key = tuple(layer for layer in candidate if params[layer])
            if key and key not in seen:
                seen.add(key)
                sets.append(key)
    return sets


def refit(entry, counts):
    design = np.column_stack([np.ones(len(counts)), counts, entry["num_params"]])
    coef, *_ = np.linalg.lstsq(design, np.array(entry["medians_s"]), rcond=None)
    return np.maximum(coef, 0.0)


csv_path, profiles = sys.argv[1], Path(sys.argv[2])
rows = pd.read_csv(csv_path)
out = []
original_pass, original_update = pc.ProfileCosts._measured_pass_s, pc.ProfileCosts.optimizer_s
for (model, stages), group in rows.groupby(["model", "world_size"], sort=False):
    overrides = [f"cluster.gpus_per_node={stages}", "training.optimizer=momentum",
                 f"training.global_batch_size={16 * stages}", "strategy.num_virtual_stages=2"]
    scenario = load_scenario(f"scenarios/validation/{model}.yaml", overrides)
    params = [layer.num_params for layer in resolve_workload(scenario.model, scenario.base_dir).layers]
    path = profiles / f"{model}_ws{stages}_momentum.json"
    document = json.loads(path.read_text())
    counts = [len(key) for key in layer_sets(params)]
    fits = {name: refit(document["weight_passes"][name], counts) for name in PASSES}
    fits["update"] = refit(document["optimizer"]["in_cycle"], counts)
    layers_of = {}  # parameters of a contiguous range -> its layers with weights
    for start in range(len(params)):
        for end in range(start + 1, len(params) + 1):
            layers_of.setdefault(sum(params[start:end]), sum(1 for p in params[start:end] if p))

    ranges = [(sum(params[a:b]), sum(1 for p in params[a:b] if p), a, b)
              for a in range(len(params)) for b in range(a + 1, len(params) + 1)]
    for n1, k1, a1, b1 in ranges:  # an interleaved stage's update: two chunks apart
        for n2, k2, a2, b2 in ranges:
            if a2 > b1:
                layers_of.setdefault(n1 + n2, k1 + k2)

    def at(name, num_params):
        a, per_layer, per_param = fits[name]
        return a + per_layer * layers_of[num_params] + per_param * num_params

    def measured_pass_s(self, name, num_params):
        if name not in fits:
            return original_pass(self, name, num_params)
        return self.speed_factor * self._weight_pass_scale.get(name, 1.0) * at(name, num_params)

    def optimizer_s(self, num_params):
        if num_params <= 0:
            return 0.0
        return self.speed_factor * self._in_cycle_scale * at("update", num_params)

    pc.ProfileCosts._measured_pass_s, pc.ProfileCosts.optimizer_s = measured_pass_s, optimizer_s
    try:
        figures = predictions(scenario, str(path), parse_strategy_specs(",".join(group.kind)))
    finally:
        pc.ProfileCosts._measured_pass_s, pc.ProfileCosts.optimizer_s = original_pass, original_update
    print(f"{model} p={stages}: stash refit intercept {fits['stash'][0]*1e3:.3f} ms, per layer "
          f"{fits['stash'][1]*1e3:.3f} ms, per param {fits['stash'][2]*1e9:.2f} ns "
          f"(as fitted: {document['weight_passes']['stash']['per_param_s']*1e9:.2f} ns a parameter)")
    for _, row in group.iterrows():
        predicted_s = figures[row.strategy]["predicted_jitter_s"]
        out.append((model, stages, row.kind, row.jitter_error_pct, 100 * (predicted_s - row.measured_s) / row.measured_s))
table = pd.DataFrame(out, columns=["model", "stages", "kind", "as_run_pct", "per_layer_fit_pct"])
print(table.round(1).to_string(index=False))
for stages, part in [("all", table), *table.groupby("stages")]:
    for column in ("as_run_pct", "per_layer_fit_pct"):
        print(f"{stages} stages, {column}: MAPE {part[column].abs().mean():.1f} %, worst {part[column].abs().max():.1f} %")
