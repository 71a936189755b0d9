"""Check that messages arrive intact on this machine's device and backend, before a long run.

`python -m validator.comm_device_check [--device cuda] [--backend gloo] [--world-size 2]` spawns
the ranks, sends a ring of point-to-point messages (blocking and posted ahead, through
`validator.comm_device`) and one allreduce, and prints whether every value arrived; exit code 1 if
not. On one GPU with gloo this exercises the host staging of `validator.comm_device`.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

from validator import comm_device
from validator.launch import LaunchConfig, spawn

MESSAGE_ELEMENTS = 1 << 16


def ring_check(rank: int) -> dict:
    """Each rank sends its rank number to the next and receives from the previous, blocking and
    posted ahead; then an allreduce of the ranks. Returns the values found."""
    world, device = dist.get_world_size(), comm_device.data_device()
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    outgoing = torch.full((MESSAGE_ELEMENTS,), float(rank), device=device)
    incoming = torch.empty(MESSAGE_ELEMENTS, device=device)
    posted = torch.empty(MESSAGE_ELEMENTS, device=device)
    work = comm_device.irecv(posted, src=prev, tag=7)
    if rank % 2 == 0:
        comm_device.send(outgoing, nxt)
        comm_device.recv(incoming, prev)
    else:
        comm_device.recv(incoming, prev)
        comm_device.send(outgoing, nxt)
    comm_device.isend(outgoing + 100, dst=nxt, tag=7).wait()
    work.wait()
    total = torch.full((4,), float(rank), device=device)
    dist.all_reduce(total)
    return {"device": str(device), "blocking_ok": bool((incoming == prev).all()),
            "posted_ok": bool((posted == prev + 100).all()),
            "allreduce_ok": bool((total == sum(range(world))).all())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args(argv)
    results = spawn(ring_check, (), LaunchConfig(world_size=args.world_size, backend=args.backend,
                                                 device=args.device, timeout_s=120.0))
    failed = [rank for rank, found in enumerate(results) if not all(v for k, v in found.items() if k.endswith("_ok"))]
    for rank, found in enumerate(results):
        print(f"rank {rank}: {found}")
    print(f"comm check on {args.device}/{args.backend}, {args.world_size} ranks: "
          + ("ok" if not failed else f"FAILED on rank(s) {failed}"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
