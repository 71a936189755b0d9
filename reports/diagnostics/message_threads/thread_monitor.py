"""Run a command and sample, every 20 ms, every thread of its descendant processes: the Linux
scheduler's /proc/PID/task/TID/schedstat (ns on a CPU, ns runnable but waiting for one) stamped on
the monotonic clock, and the host's /proc/stat busy and idle ticks. Writes OUT.json for
`thread_cpu_bins.py`. Linux only; the sampler itself takes a few percent of a core.

    python reports/diagnostics/message_threads/thread_monitor.py OUT.json -- ghpsim validate ...
"""
import json, os, subprocess, sys, time
out = sys.argv[1]; cmd = sys.argv[sys.argv.index('--') + 1:]
def parents():
    m = {}
    for pid in os.listdir('/proc'):
        if pid.isdigit():
            try:
                st = open(f'/proc/{pid}/stat').read()
            except OSError:
                continue
            m[int(pid)] = int(st[st.rindex(')') + 2:].split()[1])
    return m
def descendants(root):
    m = parents(); found, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in m.items() if pp in frontier and p not in found}; found |= frontier
    return found
proc = subprocess.Popen(cmd)
series = {}   # "pid/tid" -> {"name":..., "samples": [[t, run_ns, wait_ns], ...]}
system = []   # [t, total_ticks, idle_ticks]
known = set(); last_scan = 0
while proc.poll() is None:
    now = time.perf_counter()
    if now - last_scan > 0.5:
        known = descendants(proc.pid); last_scan = now
    f = list(map(int, open('/proc/stat').readline().split()[1:]))
    system.append([now, sum(f), f[3] + f[4]])
    for pid in list(known):
        try:
            tids = os.listdir(f'/proc/{pid}/task')
        except OSError:
            continue
        for tid in tids:
            try:
                run_ns, wait_ns, _ = map(int, open(f'/proc/{pid}/task/{tid}/schedstat').read().split())
                name = open(f'/proc/{pid}/task/{tid}/comm').read().strip()
            except (OSError, ValueError):
                continue
            rec = series.setdefault(f'{pid}/{tid}', {'name': name, 'samples': []})
            rec['name'] = name; rec['samples'].append([now, run_ns, wait_ns])
    time.sleep(0.02)
json.dump({'threads': series, 'system': system}, open(out, 'w'))
sys.exit(proc.returncode)
