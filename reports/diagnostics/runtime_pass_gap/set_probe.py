"""Per calibration layer set of the MLP (and the 2-stage last stage, 3-6): the stash right after an
update (stash_s) and after the modules' passes (stash_after_plain_s), in ms, at micro-batches 16 and
8, two rounds each, one process. Writes nothing. Thirty-fourth session; order_probe.log."""
import sys, torch
from pathlib import Path
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE)); sys.path.insert(0, str(HERE.parents[2]))
from simulator.scenario import load_scenario
from simulator.model_source import resolve_workload
from validator.calibration_phases import _layer_sets
from validator.models import build_modules, make_batch
from validator.weight_pass_bench import time_weight_passes
torch.set_num_threads(1)
sc = load_scenario(str(HERE.parents[2] / 'scenarios/validation/mlp_cpu.yaml'), ["cluster.gpus_per_node=2","training.optimizer=momentum","training.global_batch_size=32"])
w = resolve_workload(sc.model, sc.base_dir); m = build_modules(w, seed=0)
for mb in (16, 8):
    b, _ = make_batch(w, mb, seed=0)
    sets = _layer_sets(m) + [[3,4,5,6]]
    for r in range(2):
        e = time_weight_passes(m, sets, b, repeats=7)
        print(mb, ' '.join(f"{s[0]}-{s[-1]}:{x['stash_s']*1e3:.2f}/{x['stash_after_plain_s']*1e3:.2f}" for s, x in zip(sets, e)), flush=True)
