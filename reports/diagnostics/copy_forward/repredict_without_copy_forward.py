"""Re-predict the pipeline benchmark's measurements (reports/validation_pipelines_cpu.csv, one depth)
with each profile's `weight_passes.copy_forward` fit removed, beside the errors as run.

Run: python reports/diagnostics/copy_forward/repredict_without_copy_forward.py STAGES  (2 or 4)
"""
import copy
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

from simulator.compare import parse_strategy_specs
from simulator.scenario import load_scenario
from validator.validate import predictions

stages = int(sys.argv[1])
rows = pd.read_csv("reports/validation_pipelines_cpu.csv")
rows = rows[rows.world_size == stages]
out = []
for model, group in rows.groupby("model", sort=False):
    profile = json.load(open(f"reports/profiles/{model}_ws{stages}_momentum.json"))
    without = copy.deepcopy(profile)
    without["weight_passes"].pop("copy_forward")
    path = Path(tempfile.gettempdir()) / f"{model}_ws{stages}_without_copy_forward.json"
    path.write_text(json.dumps(without))
    scenario = load_scenario(f"scenarios/validation/{model}.yaml", [
        f"cluster.gpus_per_node={stages}", "training.optimizer=momentum",
        f"training.global_batch_size={16 * stages}", "strategy.num_virtual_stages=2"])  # as the benchmark
    figures = predictions(scenario, str(path), parse_strategy_specs(",".join(group.kind)))
    for _, row in group.iterrows():
        predicted_s = figures[row.strategy]["predicted_jitter_s"]
        out.append((model, row.kind, row.jitter_error_pct, 100 * (predicted_s - row.measured_s) / row.measured_s))
table = pd.DataFrame(out, columns=["model", "kind", "as_run_pct", "without_copy_forward_pct"])
print(table.round(1).to_string(index=False))
for column in ("as_run_pct", "without_copy_forward_pct"):
    print(f"{column}: MAPE {table[column].abs().mean():.1f} %, worst {table[column].abs().max():.1f} %")
