"""Where a rank's tensors live and how its point-to-point messages travel on each backend.

- `data_device()`: the device a rank computes on (set by `validator.launch.init_rank` from the
  launch's `device`): activations, gradients and the communication microbenchmarks' buffers live
  there, so that the calibration times the same path as the validated runs.
- `control_device()`: where small bookkeeping tensors (a step's slowest time, agreed maxima) go:
  the GPU on nccl, which only takes CUDA tensors, the host on gloo.
- `send` / `isend` / `recv` / `irecv`: `torch.distributed`'s, except that on gloo a CUDA tensor is
  staged through host memory. gloo's send and recv hand the tensor's raw pointer to its TCP
  transport (ProcessGroupGloo::send/recv, torch/csrc/distributed/c10d/ProcessGroupGloo.cpp), which
  cannot read device memory; its allreduce, allgather and broadcast stage CUDA tensors themselves.
  This is the path of several ranks sharing one GPU, where nccl refuses two ranks on one device.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

_rank_device_kind = "cpu"


def set_rank_device(kind: str) -> None:
    """Record the launch's device kind ("cpu" or "cuda") for this rank's process."""
    global _rank_device_kind
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {kind!r}")
    _rank_device_kind = kind


def data_device() -> torch.device:
    if _rank_device_kind == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def control_device() -> torch.device:
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def default_backend(device: str) -> str:
    """The backend a launch on `device` uses unless told otherwise: nccl on CUDA, gloo on the CPU."""
    return "nccl" if device == "cuda" else "gloo"


RANKS_PER_CPU = 4
"""At most this many CPU ranks per core (the validation runs 4 ranks on 2 cores): beyond it a
launch only starts processes that wait for a core."""


def device_problem(device: str, backend: str, world_size: int) -> str | None:
    """Why `world_size` ranks cannot run on `device` with `backend` here, or None: gloo or nccl
    only; nccl on GPUs only; a CUDA run needs a GPU, and nccl one GPU per rank (it refuses two
    ranks on one device); at most RANKS_PER_CPU ranks a core on the CPU."""
    if backend not in ("gloo", "nccl"):
        return f"backend {backend!r} is not one the validator runs (gloo, or nccl on GPUs)"
    if device != "cuda":
        if backend == "nccl":
            return "nccl runs on GPUs: use backend gloo on the CPU, or device cuda"
        cores = os.cpu_count() or 1
        if world_size > RANKS_PER_CPU * cores:
            return (f"{world_size} ranks on {cores} CPU cores: at most {RANKS_PER_CPU * cores} "
                    f"({RANKS_PER_CPU} a core) run here")
        return None
    gpus = torch.cuda.device_count()
    if gpus == 0:
        return "'cuda' but torch sees no GPU on this machine"
    if backend == "nccl" and gpus < world_size:
        return (f"nccl needs one GPU per rank: {world_size} ranks but {gpus} GPU(s); "
                "backend gloo lets the ranks share them")
    return None


def _staged(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda and dist.get_backend() == "gloo"


class _StagedReceive:
    """An irecv into host memory whose `wait()` also copies the message into the device buffer."""

    def __init__(self, work, host: torch.Tensor, target: torch.Tensor):
        self.work, self.host, self.target = work, host, target

    def wait(self) -> bool:
        self.work.wait()
        self.target.copy_(self.host)
        return True


def isend(tensor: torch.Tensor, dst: int, tag: int = 0):
    """`dist.isend`; on gloo a CUDA tensor is copied to the host first (the copy is synchronous)."""
    return dist.isend(tensor.cpu() if _staged(tensor) else tensor, dst=dst, tag=tag)


def send(tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
    dist.send(tensor.cpu() if _staged(tensor) else tensor, dst=dst, tag=tag)


def irecv(buffer: torch.Tensor, src: int, tag: int = 0):
    """`dist.irecv`; on gloo into a host buffer copied to the CUDA `buffer` when waited for."""
    if not _staged(buffer):
        return dist.irecv(buffer, src=src, tag=tag)
    host = torch.empty(buffer.shape, dtype=buffer.dtype)
    return _StagedReceive(dist.irecv(host, src=src, tag=tag), host, buffer)


def recv(buffer: torch.Tensor, src: int, tag: int = 0) -> None:
    if not _staged(buffer):
        dist.recv(buffer, src=src, tag=tag)
        return
    host = torch.empty(buffer.shape, dtype=buffer.dtype)
    dist.recv(host, src=src, tag=tag)
    buffer.copy_(host)
