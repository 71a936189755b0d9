"""The single-process pipeline emulator (`validator.pipeline_reference`) against closed forms:
synchronous schedules = full-batch training (Proposition 1); one stage = plain per-micro-batch
SGD; PipeDream stashing and the no-stash schedule at 2 stages written out by hand; SpecTrain's
prediction distances (Chen et al., 3); and the four asynchronous semantics differ."""

import pytest

torch = pytest.importorskip("torch")

from simulator import load_scenario, simulate  # noqa: E402
from validator.measure import reference_training  # noqa: E402
from validator.microbench import make_optimizer  # noqa: E402
from validator.models import build_modules, loss_fn, make_batch  # noqa: E402
from validator.pipeline_reference import emulate  # noqa: E402
from validator.pipeline_plan import prediction_steps  # noqa: E402

MLP = {"name": "mlp", "params": {"input_dim": 12, "hidden_dim": 16, "num_hidden_layers": 3, "num_classes": 5}}
BATCH, LR = 8, 0.1


def compiled(kind: str, world_size: int, optimizer: str = "momentum", **strategy):
    result = simulate(load_scenario({
        "cluster": {"num_nodes": 1, "gpus_per_node": world_size, "gpu": "cpu",
                    "intra_node_link": "loopback", "inter_node_link": "loopback"},
        "model": MLP, "strategy": {"kind": kind, "symmetry": "off", **strategy},  # every rank, as validated
        "training": {"global_batch_size": BATCH, "optimizer": optimizer}}))
    return result.plan, result.workload


def worst(actual: dict, expected: dict) -> float:
    assert set(actual) == set(expected)
    return max(float((actual[k] - expected[k]).abs().max() / expected[k].abs().max()) for k in expected)


@pytest.mark.parametrize("kind, world_size, strategy", [
    ("gpipe", 2, {"num_microbatches": 4}), ("1f1b", 4, {"num_microbatches": 4}),
    ("interleaved_1f1b", 2, {"num_microbatches": 2, "num_virtual_stages": 2}),
    ("1f1b", 4, {"num_microbatches": 2, "num_groups": 2}),
])
def test_synchronous_emulation_equals_full_batch_training(kind, world_size, strategy):
    plan, workload = compiled(kind, world_size, **strategy)
    expected = reference_training(workload, BATCH, 3, "momentum", LR)
    assert worst(emulate(plan, workload, 3, "momentum", LR).state, expected) <= 1e-5


@pytest.mark.parametrize("kind, strategy", [
    ("pipedream", {}), ("pipedream", {"weight_stashing": False}), ("spectrain", {}),
    ("spectrain", {"weight_prediction": "forward"})])
def test_one_stage_asynchronous_is_momentum_sgd_per_microbatch(kind, strategy):
    """One stage has no staleness (s = 0 for SpecTrain): an update per micro-batch, in order."""
    plan, workload = compiled(kind, 1, num_microbatches=4, **strategy)
    modules = build_modules(workload)
    optimizer = make_optimizer("momentum", [p for m in modules for p in m.parameters()], LR)
    for step in range(2):
        inputs, targets = make_batch(workload, BATCH, seed=1000 + step)
        for i in range(4):
            x = inputs[2 * i:2 * i + 2]
            for module in modules:
                x = module(x)
            loss_fn(workload, x, targets[2 * i:2 * i + 2]).backward()
            optimizer.step()
            optimizer.zero_grad()
    expected = {f"{i}.{n}": p.detach() for i, m in enumerate(modules) for n, p in m.named_parameters()}
    assert worst(emulate(plan, workload, 2, "momentum", LR).state, expected) <= 1e-6


def two_stage_by_hand(stashing: bool) -> dict:
    """2 stages x 2 micro-batches, plain SGD. Stage 0 runs F0 F1 B0 U B1 U, stage 1 F0 B0 U F1 B1 U:
    micro-batch 1 meets W0 (stage 0's first version) in its forward and W1' on stage 1. Its stage-0
    backward uses W0 again (stash) or, without stashing, W0' = W0 - lr g0 with the activations of
    the W0 forward: d(h1) = d(pre2) @ Wb' where pre2 = Wb h1 + bb was computed with W0."""
    workload = compiled("pipedream", 2, "sgd", num_microbatches=2)[1]
    modules = build_modules(workload)
    inputs, targets = make_batch(workload, BATCH, seed=1000)
    first, second = (inputs[:4], targets[:4]), (inputs[4:], targets[4:])

    def grads(x, y):
        for m in modules:
            m.zero_grad()
            x = m(x)
        loss_fn(workload, x, y).backward()
        return [[p.grad.clone() for p in m.parameters()] for m in modules]

    def step(layers, gradients):
        with torch.no_grad():
            for layer in layers:
                for p, g in zip(modules[layer].parameters(), gradients[layer]):
                    p -= LR * g

    w0 = [[p.detach().clone() for p in m.parameters()] for m in modules]
    g_first = grads(*first)
    step([2, 3], g_first)                   # stage 1's update after B0: W1'
    g_second = grads(*second)               # micro-batch 1 at (W0, W1'), stashed stage 0
    if not stashing:                        # stage 0 backward with W0' = W0 - lr g0
        (wa, ba), (wb, bb) = w0[0], w0[1]
        x = second[0]
        pre1 = x @ wa.T + ba
        h1 = pre1.relu()
        pre2 = h1 @ wb.T + bb
        h2 = pre2.relu().requires_grad_()
        out = h2
        for m in modules[2:]:
            out = m(out)
        loss_fn(workload, out, second[1]).backward()
        d2 = h2.grad * (pre2 > 0)
        wb_new = wb - LR * g_first[1][0]
        d1 = (d2 @ wb_new) * (pre1 > 0)
        g_second[0], g_second[1] = [d1.T @ x, d1.sum(0)], [d2.T @ h1, d2.sum(0)]
    step([0, 1], g_first)                   # stage 0's update after B0: W0'
    step([0, 1, 2, 3], g_second)
    return {f"{i}.{n}": p.detach() for i, m in enumerate(modules) for n, p in m.named_parameters()}


@pytest.mark.parametrize("stashing", [True, False])
def test_two_stage_pipedream_matches_the_hand_written_weight_versions(stashing):
    plan, workload = compiled("pipedream", 2, "sgd", num_microbatches=2, weight_stashing=stashing)
    assert worst(emulate(plan, workload, 1, "sgd", LR).state, two_stage_by_hand(stashing)) <= 1e-5


def test_spectrain_prediction_distances():
    """s = floor(k/2) + N - k - 1 forward, floor(k/2) backward; "forward": N - k - 1, reused."""
    assert [prediction_steps(k, 4, "staggered") for k in range(4)] == [(3, 0), (2, 0), (2, 1), (1, 1)]
    assert [prediction_steps(k, 4, "forward") for k in range(4)] == [(3, None), (2, None), (1, None), (0, None)]


def test_the_asynchronous_semantics_are_told_apart():
    """Stash, no-stash and both SpecTrain variants end in different parameters (so the runtime
    tests, which compare at 1e-5, would notice a runtime applying the wrong one)."""
    variants = [("pipedream", {}), ("pipedream", {"weight_stashing": False}), ("spectrain", {}),
                ("spectrain", {"weight_prediction": "forward"})]
    states = [emulate(*compiled(kind, 4, num_microbatches=4, **options), 3, "momentum", LR).state
              for kind, options in variants]
    for a in range(len(states)):
        for b in range(a + 1, len(states)):
            assert worst(states[a], states[b]) > 1e-3, (variants[a], variants[b])
