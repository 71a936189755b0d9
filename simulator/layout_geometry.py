"""Pieces of a layout the search and its bounds share: the device of each megatron position under
the two searched orders, and a cost model that remembers the times it was asked for."""

from __future__ import annotations


def megatron_device(order: str, t: int, p: int, d: int):
    """(dp, pp, tp) -> device: Megatron's order (tp fastest, then pp, then dp) or "tp_dp_pp"."""
    if order == "tp_dp_pp":  # tp fastest, then the replicas, then the stages
        return lambda dp, pp, tp: pp * d * t + dp * t + tp
    return lambda dp, pp, tp: dp * p * t + pp * t + tp


def megatron_placement(order: str, t: int, p: int, d: int) -> str | tuple[int, ...]:
    """strategy.placement of a megatron layout: Megatron's order (tp, pp, dp) or, for "tp_dp_pp",
    the explicit device of each (dp, pp, tp) position (`simulator.strategies.tensor.device_of`)."""
    if order != "tp_dp_pp":
        return "group_per_node"
    device = megatron_device(order, t, p, d)
    return tuple(device(dp, pp, tp) for dp in range(d) for pp in range(p) for tp in range(t))


class RememberedCosts:
    """A cost model whose compute, update and weight-pass times are remembered (the same values)."""

    def __init__(self, model):
        self._model, self._seen = model, {}

    def __getattr__(self, name):
        return getattr(self._model, name)

    def _remember(self, key, compute):
        found = self._seen.get(key)
        if found is None:
            found = self._seen[key] = compute()
        return found

    def compute_s(self, layer_index, phase, batch):
        return self._remember((layer_index, phase, batch), lambda: self._model.compute_s(layer_index, phase, batch))

    def optimizer_s(self, num_params, layers=None):
        return self._remember(("U", num_params, layers), lambda: self._model.optimizer_s(num_params, layers=layers))

    def weight_pass_s(self, name, num_params, layers=None):
        return self._remember((name, num_params, layers),
                              lambda: self._model.weight_pass_s(name, num_params, layers=layers))
