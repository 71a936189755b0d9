"""Where a validation run's CPU went, from `thread_monitor.py`'s samples: per launch (the four rank
processes that have a gloo thread, in start order), in 0.5 s bins, each rank's main thread on a core
and runnable-but-waiting (in cores), the rank processes' other threads on a core (gloo's
communication threads), and the host's busy cores (of 2). Ranks are in pid order, which is rank
order for the spawn launcher. Prints; writes nothing.

    python reports/diagnostics/message_threads/thread_cpu_bins.py OUT.json
"""
import json, sys, collections, numpy as np
d = json.load(open(sys.argv[1]))
procs = collections.defaultdict(dict)
for key, rec in d['threads'].items():
    pid, tid = key.split('/'); procs[int(pid)][int(tid)] = rec
# rank processes: those with a gloo thread
ranks = sorted([p for p, th in procs.items() if any(r['name'].startswith('gloo') for r in th.values())])
t0 = min(s[0] for p in ranks for s in procs[p][p]['samples'])
launches = []
for p in ranks:
    smp = procs[p][p]['samples']; launches.append((smp[0][0], p))
launches.sort()
groups = [launches[i:i+4] for i in range(0, len(launches), 4)]
sysarr = np.array(d['system'])
def rate(samples, a, b, col):
    s = np.array(samples); 
    if s[0,0] > a or s[-1,0] < b: return np.nan
    return (np.interp(b, s[:,0], s[:,col]) - np.interp(a, s[:,0], s[:,col])) / 1e9 / (b - a)
for g in groups:
    pids = [p for _, p in g]
    start = max(procs[p][p]['samples'][0][0] for p in pids); end = min(procs[p][p]['samples'][-1][0] for p in pids)
    print('launch pids', pids, 'common life %.2f s' % (end - start))
    bins = np.arange(start, end, 0.5)
    for a, b in zip(bins[:-1], bins[1:]):
        main_run = [rate(procs[p][p]['samples'], a, b, 1) for p in pids]
        main_wait = [rate(procs[p][p]['samples'], a, b, 2) for p in pids]
        others = sum(np.nan_to_num(rate(r['samples'], a, b, 1)) for p in pids for t, r in procs[p].items() if t != p)
        tot = np.interp(b, sysarr[:,0], sysarr[:,1]) - np.interp(a, sysarr[:,0], sysarr[:,1])
        idle = np.interp(b, sysarr[:,0], sysarr[:,2]) - np.interp(a, sysarr[:,0], sysarr[:,2])
        print('  t=%5.1f main run %s sum %.2f | wait %s sum %.2f | other thr %.2f | sys busy %.2f cores' % (
            a - start, ' '.join('%.2f' % x for x in main_run), np.nansum(main_run), ' '.join('%.2f' % x for x in main_wait),
            np.nansum(main_wait), others, 2 * (1 - idle / tot)))
