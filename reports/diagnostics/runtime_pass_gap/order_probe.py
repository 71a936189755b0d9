"""The first (fc1-fc3) and last (fc4-fc7) 2-stage MLP stages, one process: the stash as the calibration's
cycle timed it (after a forward and a backward through the modules), in the runtime's order (right
after the update), and in the runtime's order with the modules' passes between the update and the
stash. Medians of 15 blocks, three rounds. Writes nothing. Thirty-fourth session; results in
order_probe.log and results.md."""
import sys, time, statistics, torch, copy
from pathlib import Path
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE)); sys.path.insert(0, str(HERE.parents[2]))
from loop_probe import build_modules, FIRST, LAST, MICROBATCH, DIMS, show
from validator import weight_pass_bench as wpb
from validator.microbench import _time_blocks, _same, make_optimizer
from validator.weight_versions import MicroState, accumulate_gradients, release_backward, stash_weights
from torch.func import functional_call
torch.set_num_threads(1)

def setup(layers):
    m = build_modules()
    inputs = wpb._layer_inputs([m[i] for i in range(7)], torch.randn(MICROBATCH, DIMS[0]))
    own = {l: copy.deepcopy(m[l]) for l in layers}
    params = [p for l in layers for p in own[l].parameters()]
    for p in params: p.grad = torch.zeros_like(p)
    opt = make_optimizer("momentum", params, 0.01); opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    return own, inputs[layers[0]], opt, flat

def runtime_order(own, layers, x, opt, plain_after):
    def run():
        t0 = time.perf_counter()
        used = stash_weights(own, layers)
        t1 = time.perf_counter()
        st = MicroState(weights=used); out = x
        for l in layers:
            if l > layers[0]: out = out.detach().requires_grad_(True)
            st.inputs[l] = out; st.outputs[l] = out = functional_call(own[l], used[l], (out,))
        wpb._backward(st, layers)
        t3 = time.perf_counter()
        accumulate_gradients(own, layers, used); del used; release_backward(st, layers[0])
        t4 = time.perf_counter()
        opt.step(); opt.zero_grad(set_to_none=False)
        t5 = time.perf_counter()
        if plain_after:
            pl = MicroState(); out = x
            for l in layers:
                if l > layers[0]: out = out.detach().requires_grad_(True)
                pl.inputs[l] = out; pl.outputs[l] = out = own[l](out)
            wpb._backward(pl, layers)
        return (t1-t0, t4-t3, t5-t4)
    return run

if __name__ == "__main__":
    for r in range(3):
      for name, layers in (("first", FIRST), ("last", LAST)):
          own, x, opt, flat = setup(layers)
          c = _time_blocks(wpb._cycle(own, layers, x, opt, opt, flat, torch.device("cpu")), 15, 2, 0.01, _same)
          show(f"{name} calibration cycle", {"stash": c[0]*1e3, "accumulate": c[3]*1e3, "update": c[5]*1e3})
          for pa in (False, True):
              own, x, opt, flat = setup(layers)
              c = _time_blocks(runtime_order(own, layers, x, opt, pa), 15, 2, 0.01, _same)
              show(f"{name} runtime order{' +plain' if pa else ''}", {"stash": c[0]*1e3, "accumulate": c[1]*1e3, "update": c[2]*1e3})
