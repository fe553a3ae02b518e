"""64 node processes doing gossip on this machine (lesson 04).

Starts ``Cluster(64, graph=G)`` (Pipes only along G's edges; works under a file-descriptor
soft limit of 1024) for a ring, a 2-D torus and a hypercube, runs 50 synchronous gossip steps
of a 16-number vector, and reports: start time, run time, time per gossip step, messages
per second, and whether the run equals the single-process matrix iteration bit for bit.
On 2 cores the 64 processes take turns, so a step costs about 64 x (degree) context switches.
"""
from __future__ import annotations

import time

N, STEPS, DIM = 64, 50, 16
TOPOLOGIES = ("ring", "torus", "hypercube")


def measure(start_method: str | None = None) -> list[dict]:
    import numpy as np

    import course_lib.gossip as gs
    from course_lib import Cluster

    out = []
    x0 = np.random.default_rng(0).standard_normal((N, DIM))
    for name in TOPOLOGIES:
        G = gs.make_topology(name, N)
        t0 = time.perf_counter()
        with Cluster(N, graph=G, start_method=start_method) as c:
            t1 = time.perf_counter()
            run = gs.run_gossip(G, x0, STEPS, cluster=c)
            t2 = time.perf_counter()
        t3 = time.perf_counter()
        exact = np.array_equal(run.traj, gs.gossip_reference(gs.metropolis_hastings(G), x0, STEPS, G))
        out.append({"topology": name, "edges": G.number_of_edges(), "start": t1 - t0, "run": t2 - t1,
                    "stop": t3 - t2, "per_step": run.wall_time / STEPS,
                    "msgs_per_s": run.stats.total_messages / run.wall_time, "exact": exact})
    return out


def run() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"{N} node processes, {STEPS} gossip steps of {DIM} float64 each; fd soft limit {soft}")
    print(f"{'topology':10s} {'edges':>5s} {'start s':>8s} {'run s':>7s} {'stop s':>7s} "
          f"{'ms/step':>8s} {'msgs/s':>8s}  equals reference")
    for r in measure():
        print(f"{r['topology']:10s} {r['edges']:5d} {r['start']:8.2f} {r['run']:7.2f} {r['stop']:7.2f} "
              f"{1e3 * r['per_step']:8.2f} {r['msgs_per_s']:8.0f}  {r['exact']}")


if __name__ == "__main__":
    run()
