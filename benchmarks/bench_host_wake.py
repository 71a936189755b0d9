"""What one message costs on a shared CPU host, by how many other ranks compute (prints figures).

Runs `validator.host_wake_bench` (see its docstring) on one host: a sender and a waiting receiver
with 0 .. W-2 other ranks computing without pause, then two ranks sending to each other at the
same moment. Beside the table it prints the kernel's tick (CONFIG_HZ, when /proc/config.gz says)
and, with --profile, the per-message figures that profile's handoff chain gave the simulator (one
figure per profile, whatever the load), to compare.

Run: python benchmarks/bench_host_wake.py [--world-size 5] [--launches 3] [--messages 60]
         [--profile reports/profiles/resnet_cpu_ws4_momentum.json] [--json]
World size 5 on this 2-core host covers a 4-stage pipeline's sender with up to 3 others computing.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
from pathlib import Path

from validator.host_wake_bench import WARMUP_MESSAGES, host_wake_rank_main
from validator.launch import LaunchConfig, RankFailure, spawn


def kernel_tick_hz() -> int | None:
    """CONFIG_HZ of the running kernel, or None where /proc/config.gz is absent."""
    try:
        with gzip.open("/proc/config.gz", "rt") as config:
            for line in config:
                if line.startswith("CONFIG_HZ="):
                    return int(line.split("=", 1)[1])
    except OSError:
        return None
    return None


def _median_of(launches: list[dict], section: str, index: int, part: str, figure: str) -> float:
    return statistics.median(launch[section][index][part][figure] for launch in launches)


def _profile_line(path: Path) -> str:
    document = json.loads(path.read_text())
    handoff = document.get("handoff")
    if not handoff or "preposted" not in handoff:
        return f"{path}: no pre-posted handoff section"
    pre = handoff["preposted"]
    return (f"{path.name} (handoff chain, one figure for every load): isend call median "
            f"{1e3 * pre.get('send_post_s', float('nan')):.3f} ms, mean {1e3 * pre.get('send_post_mean_s', float('nan')):.3f} ms; "
            f"delay mean {1e3 * pre['mean_delay_s']:.3f} ms")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=5)
    parser.add_argument("--launches", type=int, default=3, help="launches; figures are medians over them")
    parser.add_argument("--messages", type=int, default=60, help="messages per busy level and launch")
    parser.add_argument("--size-bytes", type=int, default=128 << 10)
    parser.add_argument("--profile", type=Path, help="a profile whose handoff figures to print beside")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.world_size < 2:
        print(f"--world-size: needs 2 or more ranks, got {args.world_size}", file=sys.stderr)
        return 2
    if args.messages <= WARMUP_MESSAGES:
        print(f"--messages: needs more than the {WARMUP_MESSAGES} warm-up messages, got {args.messages}",
              file=sys.stderr)
        return 2
    if args.profile is not None and not args.profile.is_file():
        print(f"--profile: no such file: {args.profile}", file=sys.stderr)
        return 2
    config = LaunchConfig(world_size=args.world_size, backend="gloo", device="cpu", timeout_s=600.0)
    launches = []
    for launch in range(args.launches):
        try:
            launches.append(spawn(host_wake_rank_main, (args.messages, args.size_bytes), config)[0])
        except RankFailure as failure:
            print(f"launch {launch + 1}: {failure}", file=sys.stderr)
            return 2
    result = {"cores": os.cpu_count(), "kernel_tick_hz": kernel_tick_hz(), "launches": launches}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    tick = result["kernel_tick_hz"]
    print(f"{args.world_size} gloo ranks on {result['cores']} cores; kernel tick "
          f"{'unknown' if tick is None else f'{tick} Hz ({1e3 / tick:.1f} ms)'}; {args.size_bytes} B messages; "
          f"medians over {args.launches} launches of {args.messages} messages per level")
    print("others computing | isend call median / mean / p90 ms | send-to-wake delay median / mean / p90 ms")
    for index, row in enumerate(launches[0]["wake"]):
        call = [_median_of(launches, "wake", index, "call", f) for f in ("median_ms", "mean_ms", "p90_ms")]
        delay = [_median_of(launches, "wake", index, "delay", f) for f in ("median_ms", "mean_ms", "p90_ms")]
        print(f"{row['busy_ranks']:16d} | {call[0]:6.3f} / {call[1]:6.3f} / {call[2]:6.3f}        "
              f"| {delay[0]:6.3f} / {delay[1]:6.3f} / {delay[2]:6.3f}")
    print("crossing sends (two ranks isend to each other, the rest idle): isend call median / mean / p90 ms")
    for index, row in enumerate(launches[0]["crossing"]):
        call = [_median_of(launches, "crossing", index, "call", f) for f in ("median_ms", "mean_ms", "p90_ms")]
        print(f"  second sender {row['offset_ms']:.1f} ms later: {call[0]:6.3f} / {call[1]:6.3f} / {call[2]:6.3f}")
    if args.profile is not None:
        print(_profile_line(args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
