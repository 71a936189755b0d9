"""Pipeline schedule IR: per-rank ordered operations of one step, before any costs or links.

An `Op` is what one rank does next: the forward ("F") or backward ("B") pass of one model chunk
on one micro-batch, a weight prediction ("P", SpecTrain) or a weight update ("U"). Chunks are
numbered globally, 0 .. v*p - 1; chunk c lives on rank c % p of the group (Megatron's interleaved
placement, Narayanan et al. SC'21, section 2.2; with v = 1 the chunk is the stage). Ordering is not
timing: `simulator.schedules.check.unit_time_run` plays the order with unit times, the engine with
real costs.

Cross-rank dependencies are implied by the chunk chain: F(c, i) needs F(c-1, i); B(c, i) needs
B(c+1, i) (the last chunk's B needs its own F(c, i)); everything else is program order on a rank.
"""

from __future__ import annotations

from dataclasses import dataclass

FORWARD, BACKWARD, PREDICT, UPDATE = "F", "B", "P", "U"
PASSES = (FORWARD, BACKWARD)
ASYNCHRONOUS_KINDS = ("pipedream", "spectrain", "delayed_gradient")


@dataclass(frozen=True)
class Op:
    """One operation of a rank. microbatch = -1 for the once-per-step update of synchronous kinds."""

    phase: str
    chunk: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.phase}{self.microbatch}" if self.microbatch >= 0 else self.phase


@dataclass(frozen=True)
class Schedule:
    """Ordered ops of each of the p ranks of one pipeline replica for one step of m micro-batches."""

    kind: str
    num_stages: int
    num_microbatches: int
    num_virtual_stages: int
    ranks: tuple[tuple[Op, ...], ...]

    @property
    def num_chunks(self) -> int:
        return self.num_stages * self.num_virtual_stages

    @property
    def asynchronous(self) -> bool:
        return self.kind in ASYNCHRONOUS_KINDS

    @property
    def interleaves_passes(self) -> bool:
        """Whether some rank runs a forward after one of its backwards (1F1B's steady state, every
        asynchronous kind): activations and gradients are then in flight at once while the stages
        compute, as in `validator.handoff_bench`'s asynchronous cycle; GPipe's forward and backward
        sweeps are not (its messages go one way at a time, as in the benchmark's chain)."""
        for ops in self.ranks:
            passes = [op.phase for op in ops if op.phase in PASSES]
            if BACKWARD in passes and FORWARD in passes[passes.index(BACKWARD):]:
                return True
        return False

    def rank_of_chunk(self, chunk: int) -> int:
        return chunk % self.num_stages

    def local_chunk(self, chunk: int) -> int:
        """Position of a chunk among its rank's chunks (0 .. v - 1)."""
        return chunk // self.num_stages

    def dependencies(self, op: Op) -> tuple[Op, ...]:
        """The ops of other chunks (or the own forward) that `op` waits for."""
        last = self.num_chunks - 1
        if op.phase == FORWARD and op.chunk > 0:
            return (Op(FORWARD, op.chunk - 1, op.microbatch),)
        if op.phase == BACKWARD:
            if op.chunk < last:
                return (Op(BACKWARD, op.chunk + 1, op.microbatch),)
            return (Op(FORWARD, op.chunk, op.microbatch),)
        return ()
