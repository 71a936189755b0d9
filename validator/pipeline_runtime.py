"""Execute a pipeline `Plan` (gpipe, 1f1b, interleaved_1f1b, pipedream, spectrain, delayed_gradient)
for one rank as real torch.distributed training, several micro-batches in flight.

The rank interprets its own actions in plan order (`notes/pipeline_contract.md`): `Recv`/`Send` of
activations and their gradients matched by the key ("act"|"grad", group, chunk, micro-batch) (the
key doubles as the gloo tag, so messages of several micro-batches and chunks between one pair of
ranks cannot be confused); `Compute` F / B of micro-batch i on the chunk holding its layers, with
the inputs, outputs and graph of each micro-batch kept apart; layer-wise backward so that a bucket
closes where the plan says and its `Collective` (async allreduce among the stage's G replicas)
overlaps the rest; `Compute` opt; `Compute` predict and repredict (SpecTrain's prediction before
a forward, and the staggered one before a backward); `Compute` stash (PipeDream's copy
of the weights before a forward) and `Compute` accumulate (after an asynchronous backward segment:
the gradient of the weights it ran on added onto the live gradients), so that each pass the
simulator costs (`CostModel.weight_pass_s`) is one span here.

Weights, per kind (`weight_mode`):
- accumulate (gpipe, 1f1b, interleaved_1f1b): every micro-batch uses the live weights; its loss is
  its mean / m, gradients accumulate, one update per step (GHP Proposition 1 holds).
- stash (pipedream): the forward of micro-batch i runs on a copy of the weights taken then, and
  its backward on that same copy (PipeDream weight stashing, Narayanan et al. SOSP 2019, 3.3).
- newest (pipedream with `weight_stashing: false`, delayed_gradient): the forward runs on an alias
  of the live weight storage, so the backward reads the weights as they are then (the forward's
  saved activations with the newest weights), without any copy.
- predict (spectrain): the forward runs on W_hat = W - s * lr * v (v: SGD momentum buffer; Chen et
  al. arXiv 1809.02839), s = floor(k/2) + M - k - 1 ("staggered") or M - k - 1 ("forward") on stage
  k; "staggered" overwrites those weights with s = floor(k/2) before the backward, "forward" keeps
  them. Asynchronous kinds update after every micro-batch with its own mean loss.
The update itself always applies to the live weights (torch.optim on the rank's parameters).

Why not torch.distributed.pipelining (only): gpipe and 1f1b also run through torch's own
PipelineStage + ScheduleGPipe / Schedule1F1B (`--pipeline-runtime torch`,
`validator.torch_pipelining`; gloo on CPU, torch 2.13; same parameters as full-batch training), so
torch's schedules are timed against the prediction too. But `schedule.step()` runs torch's own
action order as one opaque call, so that runtime cannot: time each action as a span (one
"schedule" span per rank), run the *plan's* order for pipedream, spectrain, delayed_gradient or
interleaved_1f1b (the simulator's chunk order), or close gradient buckets layer by layer so the
G x M grid's replica allreduces overlap the backward (it all-reduces after the schedule). All kinds
run on this send/recv runtime by default.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.func import functional_call

from simulator.errors import ScenarioError
from simulator.plan import BACKWARD, FORWARD, OPTIMIZER, Collective, Compute, Plan, Recv, Send
from simulator.strategies.pipeline import ACCUMULATE_PHASE, REPREDICT_PHASE, STASH_PHASE
from simulator.workload import Workload
from validator import comm_device
from validator.microbench import make_optimizer
from validator.models import build_modules, loss_fn, make_batch
from validator.pipeline_plan import (PREDICT, chunk_ranges, message_tag, num_microbatches, prediction_steps,
                                     prediction_variant, sends_delivered_by, weight_mode)
from validator.runtime import gradient_bucket, layer_output_shapes, peer_groups
from validator.weight_versions import (MicroState, accumulate_gradients, predict_layer_weights, release_backward,
                                      repredict_layer_weights, stash_weights)


class PipelineExecutor:
    """One rank's chunks, optimizer, in-flight micro-batches and the interpreter of its actions."""

    def __init__(self, plan: Plan, workload: Workload, rank: int, optimizer: str = "sgd",
                 learning_rate: float = 0.01, seed: int = 0, device: str = "cpu"):
        if plan.meta.get("topk"):
            raise ScenarioError("strategy.gradient_compression: topk is not supported by the pipeline runtime "
                                f"(strategy.kind {plan.strategy}); run top-k with dp or ghp")
        self.plan, self.workload, self.rank, self.seed = plan, workload, rank, seed
        self.learning_rate = learning_rate
        self.device = torch.device(device)
        self.group_index, self.stage_index = plan.grid_position(rank)
        self.chunks = chunk_ranges(plan)
        self.own_chunks = list(range(self.stage_index, len(self.chunks), plan.workers_per_group))
        built = build_modules(workload, seed=seed)
        self.modules = {layer: built[layer].to(self.device) for c in self.own_chunks
                        for layer in range(*self.chunks[c])}
        self.parameters = [p for layer in sorted(self.modules) for p in self.modules[layer].parameters()]
        self.mode = weight_mode(plan)
        if self.mode == "predict" and optimizer != "momentum":
            raise ValueError(f"training.optimizer: spectrain predicts weights from the momentum buffer; "
                             f"needs 'momentum', got {optimizer!r}")
        self.optimizer = make_optimizer(optimizer, self.parameters, learning_rate)
        self.groups = peer_groups(plan)
        self.num_microbatches = num_microbatches(plan)
        self.microbatch_size = int(plan.group_batch) // self.num_microbatches
        self.loss_scale = 1.0 if self.mode != "accumulate" else 1.0 / self.num_microbatches
        self.output_shapes = layer_output_shapes(workload, seed)
        if self.mode == "predict":
            variant = prediction_variant(plan, rank)
            self.steps_forward, self.steps_backward = prediction_steps(
                self.stage_index, plan.workers_per_group, variant)
        self.losses: list[float] = []
        self.delivered_by = sends_delivered_by(plan, rank)
        self.receives = [a for a in plan.actions[rank] if isinstance(a, Recv)]
        self.buckets: dict[tuple[int, ...], torch.Tensor] = {}  # reduced layers -> flat gradients
        self.bucketed: set[int] = set()                            # ids of parameters viewing a bucket

    def chunk_of(self, layer: int) -> int:
        return next(c for c in self.own_chunks if self.chunks[c][0] <= layer < self.chunks[c][1])

    # ------------------------------------------------------------------ one step
    def load_batch(self, step_index: int) -> None:
        """Generate step `step_index`'s batch and keep this rank's part (before the step's barrier
        in measured runs, as `validator.runtime.RankExecutor.load_batch`)."""
        group_batch = int(self.plan.group_batch)
        inputs, targets = make_batch(self.workload, group_batch * self.plan.num_groups,
                                     seed=self.seed + 1000 + step_index)
        rows = slice(self.group_index * group_batch, (self.group_index + 1) * group_batch)
        # keep only what a data loader would give this rank: its group's rows (own storage, not a
        # view pinning the whole generated batch), inputs where chunk 0 runs, targets where the last
        own = (lambda t: t[rows].clone()) if self.plan.num_groups > 1 else (lambda t: t)
        self.batch = (own(inputs).to(self.device) if 0 in self.own_chunks else None,
                      own(targets).to(self.device) if len(self.chunks) - 1 in self.own_chunks else None)

    def step(self, step_index: int) -> list[tuple]:
        """Run the rank's actions once on the batch `load_batch` holds; return its spans (seconds
        from the step's start)."""
        self.received, self.flight, self.predicted, self.stashed = {}, {}, {}, {}
        self.pending_sends, self.reductions, self.unreduced, self.spans = {}, [], [], []
        self.span_cpu_s = {}
        self.last_backward = None
        self.losses = []
        self.posted, self.next_receive = {}, 0
        self.step_start = time.perf_counter()
        self._post_next_receive()
        for action in self.plan.actions[self.rank]:
            getattr(self, HANDLERS[type(action)])(action)  # by name: a subclass may stand in for one
        for work in self.pending_sends.values():
            work.wait()
        return self.spans

    def _span(self, stream: str, name: str, kind: str, start: float, size_bytes: float = 0.0,
              microbatch: int = 0, end: float | None = None):
        now = time.perf_counter() if end is None else end
        self.spans.append((self.rank, stream, name, kind, start - self.step_start, now - self.step_start,
                           float(size_bytes), microbatch))

    def _microbatch(self, index: int, column: int) -> torch.Tensor:
        size = self.microbatch_size
        return self.batch[column][index * size:(index + 1) * size]

    # ------------------------------------------------------------------ communication
    def _post_next_receive(self) -> None:
        """Post the rank's next receive of the step (irecv), so that a peer's send is matched when it
        is made (gloo holds a send until the receive is posted), as pipeline runtimes pre-post theirs."""
        if self.next_receive >= len(self.receives):
            return
        action = self.receives[self.next_receive]
        self.next_receive += 1
        layer = self.chunks[action.key[2]][1] - 1  # act: output of chunk; grad: gradient of that output
        buffer = torch.empty((self.microbatch_size, *self.output_shapes[layer]), device=self.device)
        work = comm_device.irecv(buffer, src=action.src, tag=message_tag(action.key, len(self.chunks)))
        self.posted[action.key] = (work, buffer)

    def _recv(self, action: Recv) -> None:
        start = time.perf_counter()
        kind, _, chunk, microbatch = action.key
        while action.key not in self.posted:
            self._post_next_receive()
        work, buffer = self.posted.pop(action.key)
        work.wait()
        self._post_next_receive()  # one receive ahead
        for key in self.delivered_by.get(action.key, ()):  # a send's work holds its tensor until waited
            self.pending_sends.pop(key).wait()
        self.received[(kind, chunk, microbatch)] = buffer
        self._span("recv", action.label, "recv", start, buffer.numel() * buffer.element_size(), microbatch)

    def _send(self, action: Send) -> None:
        start = time.perf_counter()
        kind, _, chunk, microbatch = action.key
        if kind == "act":
            state = self.flight[(chunk, microbatch)]
            tensor = state.outputs[self.chunks[chunk][1] - 1].detach().contiguous()
        else:  # the input gradient of chunk + 1 (= gradient of chunk's output)
            state = self.flight[(chunk + 1, microbatch)]
            tensor = state.input_grads.pop(self.chunks[chunk + 1][0]).contiguous()
        tag = message_tag(action.key, len(self.chunks))
        self.pending_sends[action.key] = comm_device.isend(tensor, dst=action.dst, tag=tag)
        self._span("send", action.label, "send", start, tensor.numel() * tensor.element_size(), microbatch)

    def _reduced_layers(self, action: Collective) -> list[int]:
        """The layers of the current backward's segments since the last collective (one bucket when
        overlapped); all the rank's layers for a whole-stage allreduce on a multi-chunk rank."""
        layers, self.unreduced = sorted({layer for a, b in self.unreduced for layer in range(a, b)}), []
        stage_params = self.plan.stages[self.stage_index].num_params
        if len(self.own_chunks) > 1 and action.size_bytes in (2 * stage_params, 4 * stage_params):
            return sorted(self.modules)
        return layers

    def _bucket(self, layers: tuple[int, ...], params: list[torch.Tensor]) -> torch.Tensor:
        """The flat gradient buffer of `layers`; the first time, the gradients become views of it
        (DDP's gradient_as_bucket_view, as `validator.runtime`), unless some already view another
        bucket (then a copy, written back at the update)."""
        flat = self.buckets.get(layers)
        if flat is not None:
            return flat
        if any(id(p) in self.bucketed for p in params):
            return torch.cat([p.grad.reshape(-1) for p in params])
        self.bucketed.update(id(p) for p in params)
        flat = self.buckets[layers] = gradient_bucket(params)
        return flat

    def _collective(self, action: Collective) -> None:
        """Async allreduce among the stage's replicas; waited for at the update."""
        start = time.perf_counter()
        layers = tuple(self._reduced_layers(action))
        params = [p for layer in layers for p in self.modules[layer].parameters()]
        flat = self._bucket(layers, params)
        work = dist.all_reduce(flat, group=self.groups[self.stage_index], async_op=True)
        finished_at: list[float] = []
        work.get_future().add_done_callback(lambda _future: finished_at.append(time.perf_counter()))
        self.reductions.append((work, flat, params, action, start, finished_at))

    # ------------------------------------------------------------------ compute
    def _compute(self, action: Compute) -> None:
        if action.phase == OPTIMIZER:
            self._wait_reductions()  # the update's span starts once its gradients have arrived
        start, cpu_start_s = time.perf_counter(), time.thread_time()
        COMPUTE_PHASES[action.phase](self, action)
        self.span_cpu_s[len(self.spans)] = time.thread_time() - cpu_start_s
        self._span("compute", action.label, action.phase, start, microbatch=action.microbatch)

    def _forward_weights(self, chunk: int, microbatch: int) -> dict | None:
        layers = range(*self.chunks[chunk])
        if self.mode == "accumulate":
            return None
        if self.mode == "predict":
            return self.predicted.pop(microbatch)
        if self.mode == "stash":
            return self.stashed.pop((chunk, microbatch))
        # newest: same storage as the live weights, own autograd version counter (`.data`), so the
        # optimizer's in-place updates are what the backward reads
        return {layer: {name: p.data.requires_grad_(True) for name, p in self.modules[layer].named_parameters()}
                for layer in layers}

    def _forward(self, action: Compute) -> None:
        chunk, microbatch = self.chunk_of(action.layer_start), action.microbatch
        state = self.flight[(chunk, microbatch)] = MicroState(weights=self._forward_weights(chunk, microbatch))
        x = self._microbatch(microbatch, 0) if chunk == 0 else self.received.pop(("act", chunk - 1, microbatch))
        for layer in range(action.layer_start, action.layer_end):
            if layer > 0:
                x = x.detach().requires_grad_(True)
            state.inputs[layer] = x
            module = self.modules[layer]
            x = module(x) if state.weights is None else functional_call(module, state.weights[layer], (x,))
            state.outputs[layer] = x
        if chunk == len(self.chunks) - 1 and action.layer_end == self.chunks[chunk][1]:
            loss = loss_fn(self.workload, x, self._microbatch(microbatch, 1))
            self.losses.append(float(loss.detach()))
            state.loss = loss * self.loss_scale

    def _backward(self, action: Compute) -> None:
        chunk, microbatch = self.chunk_of(action.layer_start), action.microbatch
        state = self.flight[(chunk, microbatch)]
        chunk_end = self.chunks[chunk][1]
        if self.last_backward != (chunk, microbatch):
            self.unreduced, self.last_backward = [], (chunk, microbatch)
        for layer in range(action.layer_end - 1, action.layer_start - 1, -1):
            if layer < chunk_end - 1:
                state.outputs[layer].backward(state.input_grads[layer + 1])
            elif chunk == len(self.chunks) - 1:
                state.loss.backward()
            else:
                state.outputs[layer].backward(self.received.pop(("grad", chunk, microbatch)))
            x = state.inputs[layer]
            state.input_grads[layer] = x.grad if x.requires_grad else None
            state.outputs[layer] = None
        self.unreduced.append((action.layer_start, action.layer_end))
        if state.weights is None:  # the live weights (synchronous kinds); others: after the accumulate action
            self._backward_done(state, chunk, action)

    def _stash(self, action: Compute) -> None:
        """PipeDream: the weights micro-batch i's forward and backward will run on (a copy)."""
        chunk = self.chunk_of(action.layer_start)
        self.stashed[(chunk, action.microbatch)] = stash_weights(
            self.modules, range(action.layer_start, action.layer_end))

    def _accumulate(self, action: Compute) -> None:
        """Asynchronous kinds: the segment's gradients w.r.t. the weights the micro-batch used,
        added onto the live weights' gradients; then what its backward no longer needs is dropped."""
        chunk = self.chunk_of(action.layer_start)
        state = self.flight[(chunk, action.microbatch)]
        accumulate_gradients(self.modules, range(action.layer_start, action.layer_end), state.weights)
        self._backward_done(state, chunk, action)

    def _backward_done(self, state: MicroState, chunk: int, action: Compute) -> None:
        if action.layer_start == self.chunks[chunk][0]:  # its backward on the chunk is over
            release_backward(state, action.layer_start)

    def _predict(self, action: Compute) -> None:
        """SpecTrain: weights for micro-batch i's forward (a plan whose backward predictions are
        also phase "predict", built before "repredict" existed: those go to `_repredict`)."""
        chunk = self.own_chunks[0]
        if (chunk, action.microbatch) in self.flight:
            self._repredict(action)
            return
        self.predicted[action.microbatch] = predict_layer_weights(self.modules, range(*self.chunks[chunk]),
                                                                  self.optimizer, self.steps_forward,
                                                                  self.learning_rate)

    def _repredict(self, action: Compute) -> None:
        """Staggered SpecTrain: weights for micro-batch i's backward, written into those its forward ran on."""
        chunk = self.own_chunks[0]
        state = self.flight[(chunk, action.microbatch)]
        if self.steps_backward is None:
            return  # the forward variant keeps the forward's weights
        repredict_layer_weights(self.modules, range(*self.chunks[chunk]), self.optimizer, self.steps_backward,
                                self.learning_rate, state.weights)

    def _wait_reductions(self) -> None:
        """Wait for the stage's allreduces and record their comm spans (each ending when its result
        arrived), before the update's compute span starts: waiting for peers is communication."""
        for work, flat, _params, reduction, start, finished_at in self.reductions:
            work.wait()
            self._span("comm", reduction.label, reduction.op, start, flat.numel() * flat.element_size(),
                       end=finished_at[0] if finished_at else None)

    def _update(self, action: Compute) -> None:
        for _work, flat, params, _reduction, _start, _finished_at in self.reductions:
            flat /= self.plan.num_groups
            if params[0].grad.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr():
                offset = 0  # a copy, not the gradients' own bucket: write it back
                for p in params:
                    count = p.numel()
                    p.grad.copy_(flat[offset:offset + count].view_as(p))
                    offset += count
        self.reductions = []
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)

    def state(self) -> dict[str, torch.Tensor]:
        """This rank's parameters keyed by global layer index and parameter name."""
        return {f"{layer}.{name}": p.detach().cpu().clone()
                for layer in sorted(self.modules) for name, p in self.modules[layer].named_parameters()}


COMPUTE_PHASES = {FORWARD: PipelineExecutor._forward, BACKWARD: PipelineExecutor._backward,
                  OPTIMIZER: PipelineExecutor._update, PREDICT: PipelineExecutor._predict,
                  REPREDICT_PHASE: PipelineExecutor._repredict,
                  STASH_PHASE: PipelineExecutor._stash, ACCUMULATE_PHASE: PipelineExecutor._accumulate}
HANDLERS = {Recv: "_recv", Send: "_send", Compute: "_compute", Collective: "_collective"}

__all__ = ["PipelineExecutor"]
