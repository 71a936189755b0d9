"""SpecTrain's predict and repredict as the calibration's cycle times them and in the runtime's order
(predict right after the update, repredict after the forward on the prediction), the 2-stage MLP
stages, one process. Writes nothing. Thirty-fourth session; order_probe.log."""
import sys, time, torch
from pathlib import Path
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE)); sys.path.insert(0, str(HERE.parents[2]))
from order_probe import setup, show, FIRST, LAST, _time_blocks, _same, wpb, MicroState, accumulate_gradients, release_backward, functional_call
from validator.weight_versions import predict_layer_weights, repredict_layer_weights
def predict_order(own, layers, x, opt):
    def run():
        t0 = time.perf_counter()
        used = predict_layer_weights(own, layers, opt, 1, 0.01)
        t1 = time.perf_counter()
        st = MicroState(weights=used); out = x
        for l in layers:
            if l > layers[0]: out = out.detach().requires_grad_(True)
            st.inputs[l] = out; st.outputs[l] = out = functional_call(own[l], used[l], (out,))
        t2 = time.perf_counter()
        repredict_layer_weights(own, layers, opt, 1, 0.01, used)
        t3 = time.perf_counter()
        wpb._backward(st, layers)
        accumulate_gradients(own, layers, used); del used; release_backward(st, layers[0])
        opt.step(); opt.zero_grad(set_to_none=False)
        return (t1-t0, t3-t2)
    return run
for r in range(3):
    for name, layers in (("first", FIRST), ("last", LAST)):
        own, x, opt, flat = setup(layers)
        c = _time_blocks(wpb._cycle(own, layers, x, opt, opt, flat, torch.device("cpu")), 15, 2, 0.01, _same)
        show(f"{name} calibration cycle", {"predict": c[1]*1e3, "repredict": c[2]*1e3})
        own, x, opt, flat = setup(layers)
        c = _time_blocks(predict_order(own, layers, x, opt), 15, 2, 0.01, _same)
        show(f"{name} runtime order", {"predict": c[0]*1e3, "repredict": c[1]*1e3})
