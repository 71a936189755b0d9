"""Measure a profile's `handoff` section again, alone, and write it into existing profiles.

The handoff chain (`validator.handoff_bench`) times what a pipeline stage's thread spends on each
message besides the passes: the `isend` call, the wait on a message that had arrived, and the
delay of a message whose receiver was waiting. Calibrations on a GPU did not time it before
2026-11-23 (it ran on CPUs only), and on a GPU these calls stage every message through the host.
This measures it on the profile's own device and world size, with the profile's model computing
between hops, and replaces the section in place (a note in the profile says when); nothing else in
the profile changes and no validated run enters it. For profiles whose runs are already measured,
so that `benchmarks/repredict.py` can score the section on those measurements.

`--cycle-only` measures only `handoff.cycle` (every rank in the asynchronous 1F1B cycle at once)
and adds it to the profile, its chain figures kept.

Run: python benchmarks/handoff_recalibrate.py --models mlp_cpu,resnet_cpu --stages 2,4 \
         --profiles reports/gpu --profile-suffix _cuda [--device cuda --backend gloo] [--cycle-only]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from bench_pipeline_validation import pipeline_overrides, pipeline_profile
from bench_validation import device_refusal
from simulator.model_source import resolve_workload
from simulator.output import write_json_atomic
from simulator.scenario import load_scenario
from validator.handoff_bench import handoff_rank_main
from validator.launch import LaunchConfig, spawn
from validator.calibrate import DEFAULT_BATCH_SIZES

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mlp_cpu,resnet_cpu,transformer_cpu")
    parser.add_argument("--stages", default="2,4")
    parser.add_argument("--profiles", default=str(ROOT / "reports" / "profiles"))
    parser.add_argument("--profile-suffix", default="")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--repeats", type=int, default=10, help="chain sweeps timed per receive protocol")
    parser.add_argument("--cycle-only", action="store_true",
                        help="measure and replace only handoff.cycle (the asynchronous cycle), keeping the chain's figures")
    args = parser.parse_args()
    refusal = device_refusal(args.device, args.backend, args.stages)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    for name in args.models.split(","):
        for stages in (int(p) for p in args.stages.split(",")):
            scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{name}.yaml", pipeline_overrides(stages))
            workload = resolve_workload(scenario.model, scenario.base_dir)
            path = pipeline_profile(name, stages, Path(args.profiles), args.profile_suffix)
            if not path.is_file():
                print(f"{path}: no such profile (calibrate first: bench_pipeline_validation.py)", file=sys.stderr)
                return 2
            document = json.loads(path.read_text())
            if document["world_size"] != stages or document["device"]["kind"] != args.device:
                print(f"{path}: world_size {document['world_size']} / device {document['device']['kind']} "
                      f"do not match --stages {stages} / --device {args.device}", file=sys.stderr)
                return 2
            batch = DEFAULT_BATCH_SIZES[len(DEFAULT_BATCH_SIZES) // 2]  # as the calibration's handoff phase
            config = LaunchConfig(world_size=stages, backend=args.backend, device=args.device, timeout_s=300.0)
            measured = spawn(handoff_rank_main, (workload, batch, "validator.models", 0, args.repeats, 2,
                                                 args.cycle_only), config)[0]
            stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            if args.cycle_only:
                if measured is None:
                    print(f"{path}: the cycle timed no waited or no arrived message; profile left as it was",
                          file=sys.stderr)
                    return 1
                if "handoff" not in document:
                    print(f"{path}: no handoff section to add a cycle to (run without --cycle-only)", file=sys.stderr)
                    return 2
                document["handoff"]["cycle"] = measured
                document.setdefault("notes", []).append(f"handoff.cycle measured alone at {stamp} "
                                                        "(benchmarks/handoff_recalibrate.py --cycle-only)")
                write_json_atomic(path, document)
                print(f"{name:16s} p={stages} {section_figures('cycle', measured)}", flush=True)
                continue
            handoff = measured
            document["handoff"] = handoff
            document.setdefault("notes", []).append(f"handoff measured again alone at {stamp} "
                                                    "(benchmarks/handoff_recalibrate.py)")
            write_json_atomic(path, document)
            pre = handoff["preposted"]
            print(f"{name:16s} p={stages} handoff mean {handoff['mean_delay_s'] * 1e3:.3f} ms; pre-posted mean "
                  f"{pre['mean_delay_s'] * 1e3:.3f} ms, send post {1e3 * (pre.get('send_post_s') or 0):.3f} ms "
                  f"(mean {1e3 * (pre.get('send_post_mean_s') or 0):.3f}), ready receive "
                  f"{1e3 * (pre.get('ready_receive_s') or 0):.3f} ms (mean {1e3 * (pre.get('ready_receive_mean_s') or 0):.3f})",
                  flush=True)
            if "cycle" in handoff:
                print(f"{'':16s}     {section_figures('cycle', handoff['cycle'])}", flush=True)
    return 0


def section_figures(label: str, section: dict) -> str:
    """One line of a pre-posted section's figures in ms."""
    ms = {key: 1e3 * (section.get(key) or 0.0) for key in ("mean_delay_s", "send_post_s", "send_post_mean_s",
                                                            "ready_receive_s", "ready_receive_mean_s")}
    return (f"{label}: delay mean {ms['mean_delay_s']:.3f} ms, send post {ms['send_post_s']:.3f} ms (mean "
            f"{ms['send_post_mean_s']:.3f}), ready receive {ms['ready_receive_s']:.3f} ms (mean "
            f"{ms['ready_receive_mean_s']:.3f})")


if __name__ == "__main__":
    sys.exit(main())
