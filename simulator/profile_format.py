"""The calibration profile file format (`ghpsim-profile/1`), as markdown: written by
`validator.calibrate`, read by `simulator.profile`, whose module documentation includes it."""

PROFILE_FORMAT = """\
# Calibration profile (`ghpsim-profile/1`)

A JSON object. Times are in seconds, sizes in bytes, bandwidths in bytes per second. Keys not
listed here are allowed and ignored by `load_profile` (the validator adds raw medians and notes).

| key | type | meaning |
| --- | --- | --- |
| `format` | `"ghpsim-profile/1"` | identifies the file; anything else is rejected |
| `created_utc` | string | ISO-8601 time of the calibration |
| `device` | `{"kind": "cpu"\\|"cuda", "name", "num_threads"}` | what the layers ran on; `num_threads` is `torch.get_num_threads()` of each rank |
| `torch_version` | string | `torch.__version__` |
| `backend` | `"gloo"\\|"nccl"` | the process-group backend of the communication benchmarks |
| `world_size` | int >= 1 | ranks (processes) that ran the calibration at the same time |
| `model` | `{"name", "params": {...}, "num_layers", "layer_names": [...], "num_params", "forward_flops_per_sample"}` | the workload: `name` is `Workload.name` (the zoo name), `params` the zoo factory parameters; the last three are optional and, when present, must match the workload |
| `layers` | list, one per layer, in order | `{"index", "name", "forward": FIT, "backward": FIT, "batch_sizes": [...], "r2_forward", "r2_backward"}` |
| `optimizer` | `{"name": "sgd"\\|"momentum"\\|"adam", "intercept_s", "per_param_s"}` | one update: `intercept_s + per_param_s x num_params`(the step and the zeroing of the gradients, as the runtimes update), timed back to back. Optional `in_cycle`: `{"intercept_s", "per_param_s", "ranks_at_once"}`, the same update timed at the end of a micro-batch cycle (after the stage's forward, backward and weight passes; `validator.weight_pass_bench`), `ranks_at_once` ranks computing (1: rank 0 alone); when present it is the update's cost (rescaled by compute_slowdown like the weight passes) and the engine adds no cold-start factor to it |
| `weight_passes` | `{"stash": PASS_FIT, "predict": PASS_FIT, "repredict": PASS_FIT, "accumulate": PASS_FIT, "average": PASS_FIT, "copy_forward": PASS_FIT}` | optional: the per-micro-batch passes over a stage's weights of the asynchronous pipeline runtime (`validator.weight_pass_bench`; "repredict": SpecTrain's staggered prediction before a backward, written into the forward's weights, since 2026-11-23, else the "predict" fit); without it they are scaled from the optimizer fit by the fp32 words each moves. "copy_forward" (since 2026-11-23): what an asynchronous forward costs more on a weight copy (`torch.func.functional_call`) than through the module, added to those forwards; without it, nothing. Each fit may keep its sets' `num_params` and `medians_s` (the calibration's single layers and prefixes, in order); where the workload rebuilds as many sets, a pass over a stage's layers costs the sum of per-layer costs fitted to those medians (non-negative least squares, `simulator.weight_pass_layers`; since 2026-11-24), else the fit. The same holds for `optimizer.in_cycle` |
| `cold_start` | `{"gap_s", "decay_s", "batch_size", "forward_factors": [...], "backward_factors": [...], "optimizer_factor", "topk_factor", ...}` | optional (`validator.cold_bench`): per layer (one factor each, in order), for the update and for the top-k selection (its residual cold; optional, default 1), the time of the pass after a pause of `gap_s` over its back-to-back time, at `batch_size`; `decay_s` the time constant of the penalty over shorter pauses. Optional `forward_single_pass_s` / `backward_single_pass_s` (one per layer, seconds >= 0 at the fits' concurrency): a single hot pass over a block iteration timed in the same pair (median over pairs of `paired_excess_forward_s` / `paired_excess_backward_s`, informational), added to every pass's fit; `ranks_at_once`: how many ranks timed the hot passes together (informational). The engine slows each pass by the age of its operands (`simulator.cold_start`); without the section passes run at their back-to-back times |
| `layer_sweep` | `{"batch_sizes": [...], "forward_ratios": [[...], ...], "backward_ratios": [[...], ...], "trials", "passes", "ranks_at_once"}` | optional, CPU profiles (`validator.sweep_bench`): per layer, one ratio per batch size (increasing, the layer fits' sizes): the layer's pass inside whole-model sweeps over the same pass repeated back to back, median over `trials` of single-pass medians (`passes` each, the first two dropped), `ranks_at_once` ranks measuring together (on a CPU host no more than its cores; rank 0's figures). `ProfileCosts.compute_s` multiplies the layer's cost by it, interpolated linearly in the batch size and held outside the sizes (`simulator.layer_sweep`); without the section, 1 |
| `cycle_compute` | `{"efficiency", "round_efficiencies": [...], "hop_compute_s", "host_parallelism"}` | optional, CPU profiles at world_size >= 2 (since 2026-11-24; `validator.cycle_compute_bench`): the layer steps done inside the compute windows of the asynchronous 1F1B cycle (every rank at once, backward windows of `hop_compute_s`, forwards half) over what processor sharing at parallelism `host_parallelism` (measured in the same rounds) expects given the windows open at each moment (`simulator.cycle_compute`); `efficiency` (between 0.2 and 2) the median over rounds. On a shared host the engine multiplies the compute of asynchronous pipelines (`pipedream`, `spectrain`, `delayed_gradient`) by 1 / `efficiency`, and where ranks outnumber the host's cores (a `pass_jitter` level below `world_size`) by P / (`host_parallelism` x `efficiency`), P = world_size / compute_slowdown[world_size] (since 2026-11-24's twenty-first session; `simulator.cycle_compute.asynchronous_compute_factor`); without it, by 1 |
| `p2p` | `ALPHA_BETA` or `null` | one-way point-to-point transfer between ranks 0 and 1 (`null` only when `world_size` is 1) |
| `allreduce` | `{"<group size>": ALPHA_BETA, ...}` | allreduce among a group of that many ranks; may be `{}` when `world_size` is 1 |
| `compute_slowdown` | `{"<ranks computing at once>": factor}` | optional; see below |
| `allgather` | `{"<group size>": ALPHA_BETA}` | optional (older profiles lack it; then plans with top-k compression cannot be timed): allgather among a group of that many ranks; `S` = the bytes *each rank contributes* |
| `topk` | `{"<density>": TOPK_FIT}` | optional (as `allgather`): the top-k selection pass at that density; see below |
| `overlap` | `{"world_size", "collective": OVERLAP, "p2p": OVERLAP}` | optional (CPU profiles from the overlap microbenchmark on): see below |
| `handoff` | `{"world_size", "size_bytes", "mean_delay_s", "median_delay_s", "preposted": {"num_messages", "mean_delay_s", "median_delay_s"}, ...}` | optional (profiles at world_size >= 2; GPU profiles since 2026-11-23): a message's delay from send to a waiting receiver while other ranks compute (`validator.handoff_bench`), receives posted on demand (top level) and one ahead (`preposted`, optional: older profiles use the top level for both); on a shared host (and on a GPU, whose messages gloo stages through the host) every point-to-point arrival comes `mean_delay_s - p2p(size_bytes)` (at least 0) later than the ping-pong fit says, with the `preposted` mean for plans whose receives are posted one ahead (pipeline schedules); `preposted` may add `send_post_s` (median `isend` call) and `ready_receive_s` (median wait on a message that had already arrived, with posting the next receive): the pipeline runtime's own time per message sent and per message found arrived, on the rank's thread (absent: 0), played as the thread's work on the host's cores; and `send_post_mean_s`, `ready_receive_mean_s` (their means: both have a long tail on a shared host), whose excess over the median is added as a delay on the rank's path that uses no core (absent: none); `cycle` (optional, since 2026-11-23): `mean_delay_s`, `send_post_s`, `send_post_mean_s`, `ready_receive_s`, `ready_receive_mean_s` (all required in it) measured with every rank in the asynchronous 1F1B steady state at once (`validator.handoff_bench.time_cycle_handoffs`), used in place of `preposted`'s for asynchronous pipelines (`pipedream`, `spectrain`, `delayed_gradient`) and, on a shared host (since 2026-11-24), for `1f1b` and `interleaved_1f1b` (whose ranks interleave forwards and backwards; `gpipe` keeps `preposted`'s); its optional `hop_compute_s` is the backward window it ran (since 2026-11-24 fitted to a balanced stage of the model, `validator.handoff_bench.stage_hop_compute_s`; before, 2 ms); `runtime` (optional, since 2026-11-24's twentieth session): the same five figures (all required in it, plus a `workload` note) timed inside the pipeline runtime running PipeDream on a synthetic MLP (`validator.runtime_messages_bench`), recorded for diagnostics and not played by the model |
| `pass_jitter` | `{"batch_size", "passes_per_burst", "levels": {"<ranks at once>": [[t_rank0, t_rank1, ...], ...]}, "start_offsets_s": {"<ranks at once>": [[o_rank0, ...], ...]}}` | optional (`validator.pass_jitter_bench`): whole-model forward + backward passes at `batch_size`, each after a barrier, k ranks at once; one row per pass (in time order), one time per computing rank. `start_offsets_s` (optional; recorded when all ranks run on one host): per pass, each rank's exit from the barrier after the first rank's, seconds, rows as in `levels`. Not used by `simulate`: the validator's prediction under jitter (`simulator.pass_jitter`) replays the plan once per row, each rank's compute scaled by its factor (its time over the level's median, or on a shared host its work under processor sharing over the median work) and started after its offset |
| `method` | `{"layers", "comm", "measure_s", "layer_passes": {"passes", "relative_totals", "spread_pct"}, ...}` | optional, ignored by the loader: how the figures were taken; `layer_passes` the sweeps over the layers (`validator.layer_passes`; each layer figure is the median over them) and each sweep's total over their median; `settings` the calibration's own (batch sizes, repeats, message sizes, densities, passes), with which `ghpsim validate --bracket` calibrates again; a pooled profile (`ghpsim merge-profiles`, `simulator.profile_merge`) adds `merged_from`, its parts' `created_utc` |

* `FIT` = `{"intercept_s": >= 0, "per_sample_s": >= 0}`: the pass of that layer on a batch of `b`
  samples takes `intercept_s + per_sample_s x b` seconds (least squares over `batch_sizes`).
  The last layer's times include the loss (its forward and its backward).
* `ALPHA_BETA` = `{"latency_s": >= 0, "bandwidth_bytes_per_s": > 0, "sizes_bytes": [...]}`: a
  message (or allreduce buffer) of `S` bytes takes `latency_s + S / bandwidth_bytes_per_s`.
  For an allreduce the bandwidth is the *algorithm* bandwidth (buffer bytes per second of the
  whole collective), not a link bandwidth: no 2(p-1)/p factor is to be applied on top.
* `compute_slowdown`: the layer fits are measured with all `world_size` ranks computing at the
  same time (on a machine with fewer cores or devices than ranks they share them).
  `compute_slowdown[k]` is the time of a pass with `k` ranks computing at once relative to one
  rank computing alone (`"1"` is 1.0). `ProfileCosts(..., concurrent_ranks=k)` rescales the
  fits by `compute_slowdown[k] / compute_slowdown[world_size]`.
* `OVERLAP` = `{"compute_slowdown": > 0, "comm_slowdown": > 0, ...}`: with all `world_size`
  ranks computing while all of them run that kind of communication (a stream of asynchronous
  allreduces; point-to-point messages between rank pairs), compute ran `compute_slowdown` times
  and the communication `comm_slowdown` times slower than each alone
  (`validator.overlap_bench`); the engine's shared-host model uses them
  (`simulator.host_sharing`). Without the section both share one processor pool. The collective
  entry also records its stream alone: `num_messages` asynchronous allreduces of `size_bytes`
  among all ranks took `stream_s`; their time per message over the `allreduce` fit's time for one
  (at most 1) is the factor the engine applies to an allreduce queued behind another on its rank
  (`ProfileCosts.streamed_allreduce_factor`: gloo's worker threads overlap their latencies).
* `PASS_FIT` = `{"intercept_s": >= 0, "per_param_s": >= 0, "num_params": [...], "medians_s": [...]}`:
  one pass over `n` parameters takes `intercept_s + per_param_s x n` (least squares over the
  parameter sets of the optimizer fit, all ranks at once): `stash` copies the weights
  (PipeDream), `predict` computes W - s lr v (SpecTrain), `accumulate` adds a micro-batch's
  weight gradients onto the live ones (every asynchronous kind), `average` divides the reduced
  gradients by the number of replicas G in place (part of the update when G > 1).
* `TOPK_FIT` = `{"intercept_s": >= 0, "per_element_s": >= 0, "elements": [...], "medians_s": [...]}`:
  error feedback and selection on a flat fp32 gradient bucket of `n` elements (residual added,
  top-k of the magnitudes with k = ceil(density x n), the values gathered, the residual zeroed
  there: what the validator's runtime does, `validator.runtime.sparsify`), measured with all
  `world_size` ranks at once and rescaled like the layer fits. Its time grows faster than
  linearly once the bucket leaves the caches, so inside the measured range (`elements`, optional,
  with one `medians_s` each) it is the piecewise-linear interpolation of the medians; outside it,
  `intercept_s + per_element_s x n`. A plan whose density has no fit is an error naming the
  densities profiled.
"""
