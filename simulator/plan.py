"""The plan: per-rank ordered actions, the contract between strategies, engine and validator.

Ordering is not timing. A strategy says *what* each rank does and in which order; the engine
decides *when*, from the costs and the topology. Streams per rank:

- compute: `Compute` actions, in list order;
- comm: `Collective` actions, in list order (like one NCCL stream); a collective starts when every
  participant has reached it;
- `Send` actions start as soon as their dependencies are done (no stream); `Recv` is the event of
  the matching send's data arriving (matched by `key`), which later actions can depend on.

Action ids are unique within a rank; `deps` name ids of the same rank.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Union

FORWARD, BACKWARD, OPTIMIZER = "F", "B", "opt"


@dataclass(frozen=True)
class Compute:
    """Forward or backward of layers [layer_start, layer_end) on `batch` samples, or the update."""

    id: int
    phase: str
    layer_start: int
    layer_end: int
    batch: float
    microbatch: int = 0
    deps: tuple[int, ...] = ()
    num_params: int = 0
    """For the optimizer and the weight passes: parameters updated or passed over; for an
    asynchronous pipeline's forward: the weights of the copy it runs on (0: the module's own)."""

    @property
    def label(self) -> str:
        if self.phase == OPTIMIZER:
            return "optimizer"
        return f"{self.phase}{self.microbatch} L{self.layer_start}-{self.layer_end - 1}"


@dataclass(frozen=True)
class Send:
    id: int
    dst: int
    size_bytes: float
    key: tuple
    deps: tuple[int, ...] = ()
    label: str = "send"
    messages: int = 1
    """The bytes go as this many back-to-back messages, each paying the route's latency (a CP ring's
    steps, each waiting for the previous hop: `simulator.strategies.context`)."""


@dataclass(frozen=True)
class Recv:
    id: int
    src: int
    key: tuple
    label: str = "recv"


@dataclass(frozen=True)
class Collective:
    """An allreduce among `ranks` (global rank ids, including this one) of `size_bytes`."""

    id: int
    op: str
    ranks: tuple[int, ...]
    size_bytes: float
    key: tuple
    deps: tuple[int, ...] = ()
    algorithm: str = "auto"
    label: str = "allreduce"
    repeat: int = 1
    """Times the collective runs back to back (tensor parallelism: the TP collectives of one pass)."""
    cycle_s: float = 0.0
    """> 0: issued by a background thread that wakes every cycle_s seconds (Horovod's fusion,
    `simulator.strategies.fusion`): it starts at the first multiple of cycle_s after its deps."""


Action = Union[Compute, Send, Recv, Collective]


@dataclass(frozen=True)
class Stage:
    """Layers [layer_start, layer_end) held by the workers of pipeline/MP stage `index`."""

    index: int
    layer_start: int
    layer_end: int
    num_params: int
    chunks: tuple[tuple[int, int], ...] = ()
    """interleaved_1f1b: the [start, end) layer ranges of the v model chunks this stage holds (then
    [layer_start, layer_end) spans them all); empty = the single range [layer_start, layer_end)."""


@dataclass(frozen=True)
class Plan:
    strategy: str
    num_groups: int
    workers_per_group: int
    stages: tuple[Stage, ...]
    rank_to_device: tuple[int, ...]
    actions: tuple[tuple[Action, ...], ...]
    """actions[rank] = that rank's ordered actions."""
    group_batch: float
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def num_ranks(self) -> int:
        return len(self.actions)

    def rank_of(self, group: int, stage: int) -> int:
        """Rank numbering of the GHP grid: rank = group * M + stage."""
        return group * self.workers_per_group + stage

    def grid_position(self, rank: int) -> tuple[int, int]:
        """(group, stage) of a rank."""
        return divmod(rank, self.workers_per_group)


def action_from_fields(kind, values: dict):
    """An instance of the frozen action class `kind` whose instance dict is `values`, every field
    given: its __init__, which sets the fields one by one, skipped (plans of a million actions)."""
    action = object.__new__(kind)
    object.__setattr__(action, "__dict__", values)
    return action


def stream_actions(actions) -> tuple[list, list, list, list]:
    """One rank's (compute stream, comm stream, TP / EP comm stream, sends), in plan order: one pass
    by exact type (the action classes here have no subclasses)."""
    compute, collectives, tensor, sends = [], [], [], []
    for action in actions:
        kind = type(action)
        if kind is Compute:
            compute.append(action)
        elif kind is Collective:
            (tensor if action.key[0] in ("tp", "ep") else collectives).append(action)
        elif kind is Send:
            sends.append(action)
    return compute, collectives, tensor, sends


def message_links(actions, receives_needed: bool = True, sends_needed: bool = True
                  ) -> tuple[dict[int, tuple[int, ...]], dict[int, int]]:
    """Per compute action of one rank: the receives it waits for, and how many sends wait for it
    (each left empty when not needed)."""
    if not (receives_needed or sends_needed):
        return {}, {}
    kinds = {action.id: type(action) for action in actions}
    receives = {action.id: tuple(dep for dep in action.deps if kinds.get(dep) is Recv)
                for action in actions if isinstance(action, Compute)}
    sends: dict[int, int] = defaultdict(int)
    for action in actions:
        if isinstance(action, Send):
            for dep in action.deps:
                if kinds.get(dep) is Compute:
                    sends[dep] += 1
    return ({key: value for key, value in receives.items() if value} if receives_needed else {},
            dict(sends) if sends_needed else {})
