"""The forward of the 2-stage MLP stages (fc1-fc3, fc4-fc7) in the runtime's order, one process: through
the modules after the update (a synchronous stage), on a stashed copy right after the stash
(PipeDream), and on SpecTrain's predicted weights right after the prediction; each cycle then runs
the backward, the accumulate where a copy was used, and the update. Medians of 15 blocks, three
rounds. Writes nothing.

    python reports/diagnostics/runtime_pass_gap/forward_probe.py

Why (thirty-fourth session, `spans_amd.log`): the validated 2-stage MLP runs' forwards took 1.56 /
1.94 ms in 1F1B, 1.75 / 2.40 ms in PipeDream and 2.04 / 2.64 ms in SpecTrain (first / last stage),
while the model charged the asynchronous forwards as the synchronous ones (the calibration's
copy_forward was about 0 for these layers).
"""
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[2]))
from order_probe import FIRST, LAST, _same, _time_blocks, functional_call, setup, show, wpb  # noqa: E402
from validator.weight_versions import (MicroState, accumulate_gradients, predict_layer_weights,  # noqa: E402
                                       release_backward, stash_weights)


def cycle(own, layers, x, opt, weights: str):
    def run():
        used = {"modules": lambda: None, "stash": lambda: stash_weights(own, layers),
                "predict": lambda: predict_layer_weights(own, layers, opt, 1, 0.01)}[weights]()
        t0 = time.perf_counter()
        state = MicroState(weights=used)
        out = x
        for layer in layers:
            if layer > layers[0]:
                out = out.detach().requires_grad_(True)
            state.inputs[layer] = out
            state.outputs[layer] = out = (own[layer](out) if used is None
                                          else functional_call(own[layer], used[layer], (out,)))
        t1 = time.perf_counter()
        wpb._backward(state, layers)
        if used is not None:
            accumulate_gradients(own, layers, used)
            del used
        release_backward(state, layers[0])
        opt.step()
        opt.zero_grad(set_to_none=False)
        return (t1 - t0,)
    return run


if __name__ == "__main__":
    torch.set_num_threads(1)
    for _ in range(3):
        for name, layers in (("first", FIRST), ("last", LAST)):
            figures = {}
            for weights in ("modules", "stash", "predict"):
                own, x, opt, _flat = setup(layers)
                figures[weights] = _time_blocks(cycle(own, layers, x, opt, weights), 15, 2, 0.01, _same)[0] * 1e3
            show(f"{name} forward on", figures)
