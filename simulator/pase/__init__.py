"""PaSE strategy search (Elango, IPDPS 2021): per-layer configurations over iteration spaces,
PaSE's cost, GENERATESEQ and the dynamic program; data-parallel and expert baselines.

graph.py (graphs, configurations) · graphs.py (builders) · cost.py (the cost function) ·
search.py (GENERATESEQ, DP, brute force, baselines) · run.py (scenario glue, engine runs) ·
cli.py (`ghpsim search`).
"""
