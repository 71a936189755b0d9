"""What-if `busy_neighbour` (thirty-fifth session): a memory-bound pass (a rank's update or weight pass)
pays its at-once slowdown s while any other rank on its host runs a pass of its own, a forward or a
backward included, not only while another rank's memory-bound pass runs
(`simulator.host_sharing.HostPool._contention_slowdown`, the model since the twenty-eighth session).

Why: on the AMD EPYC host the runtime's stash ran 1.48 / 1.63x its calibrated cost in a 2-stage MLP
PipeDream run, where the other stage computes nearly all the time; a loop probe's stash beside the
other stage's loop ran 5-12 % slower than alone (`../runtime_pass_gap/results.md`). The at-once
timing stands in for a pass beside a forward or backward: nothing timed that.

Message work on a rank's thread is not a pass and slows nothing. Patches this process only.
"""

import simulator.engine as engine
import simulator.host_sharing as host_sharing

_MESSAGE = object()
"""`_rank_work`'s default: the message path calls it without a contention argument."""


def patch_busy_neighbour() -> None:
    original_run = host_sharing.HostPool.run

    def run(self, work_s, kind, threads, memory_contention=None):
        done = original_run(self, work_s, kind, threads, memory_contention)
        is_pass, self._next_is_pass = getattr(self, "_next_is_pass", False), False
        if is_pass and work_s > 0 and threads:  # a job was started: its id is the last one given
            self.__dict__.setdefault("_pass_ids", set()).add(self._next_id - 1)
            self._reschedule({host for host, _ in threads})
        return done

    def contention_slowdown(self, job) -> float:
        if job.contention is None or job.contention <= 1.0:
            return 1.0
        pass_ids = self.__dict__.get("_pass_ids", set())
        others = max(sum(1 for job_id in self._jobs[host] if job_id in pass_ids and job_id != job.id)
                     for host, _ in job.threads)
        return 1.0 + (job.contention - 1.0) * min(1.0, others / max(1, self.contention_ranks - 1))

    def rank_work(self, rank, seconds, memory_contention=_MESSAGE):
        if self.host_parallelism is None:
            yield self.env.timeout(seconds)
            return
        is_pass = memory_contention is not _MESSAGE
        self.hosts._next_is_pass = is_pass
        yield self._host_job(seconds, [rank], 1, engine.COMPUTE, None if not is_pass else memory_contention)

    host_sharing.HostPool.run = run
    host_sharing.HostPool._contention_slowdown = contention_slowdown
    engine.Engine._rank_work = rank_work
