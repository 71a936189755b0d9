"""Does a stage's backward through the modules age like the backward on a weight copy? For each
validation model's 4-stage layer sets, one process, one thread, micro-batch 16, the calibration's
aged cycles (`validator.weight_pass_bench._aged_cycle`) at ages 0-3, on copies and through the
modules; prints per model the medians over the sets of each one's growth with age and of copy over
modules at the same age. Writes nothing.

    python reports/diagnostics/copy_age/growth_probe.py mlp_cpu,resnet_cpu,transformer_cpu

Why (twenty-ninth session, after the first candidate's fresh run): that candidate charged the
copy's age over the fresh modules' backward and moved the transformer's 4-stage asynchronous cases
from +6 to +12 %, while synchronous plans, whose stages keep as many micro-batches in flight, are
charged the fresh modules' backward.
"""
import copy
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from simulator.scenario import load_scenario
from simulator.model_source import resolve_workload
from validator.microbench import load_models_module, _time_blocks, make_optimizer, _same
from validator.calibration_phases import _layer_sets
from validator.weight_pass_bench import _aged_cycle, _layer_inputs
torch.set_num_threads(1)
for name in sys.argv[1].split(","):
    sc = load_scenario(Path(__file__).resolve().parents[3] / "scenarios" / "validation" / f"{name}.yaml", ["cluster.gpus_per_node=4", "training.optimizer=momentum", "training.global_batch_size=64"])
    wl = resolve_workload(sc.model, sc.base_dir); mm = load_models_module()
    modules = mm.build_modules(wl, seed=0); batch, _ = mm.make_batch(wl, 16, seed=0)
    inputs = _layer_inputs(modules, batch)
    rows = []
    for s in _layer_sets(modules):
        rng = range(s[0], s[-1] + 1)
        own = {l: copy.deepcopy(modules[l]) for l in rng}
        params = [p for l in rng for p in own[l].parameters()]
        for p in params: p.grad = torch.zeros_like(p)
        upd = make_optimizer("momentum", params, 0.01)
        c = [_time_blocks(_aged_cycle(own, rng, inputs[rng[0]], upd, a, torch.device("cpu")), 7, 2, 0.01, _same)[0] for a in range(4)]
        m = [_time_blocks(_aged_cycle(own, rng, inputs[rng[0]], upd, a, torch.device("cpu"), on_copy=False), 7, 2, 0.01, _same)[0] for a in range(4)]
        rows.append((c, m))
    med = lambda xs: round(statistics.median(xs), 3)
    print(name, "module aged/fresh", [med([m[a] / m[0] for c, m in rows]) for a in range(4)],
          "copy aged/fresh", [med([c[a] / c[0] for c, m in rows]) for a in range(4)],
          "copy/module same age", [med([c[a] / m[a] for c, m in rows]) for a in range(4)])
