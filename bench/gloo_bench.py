#!/usr/bin/env python3
"""PyTorch's Gloo allreduce timed as troupe_collective_bench times troupe's, one
process per member, its rows in the same table (algorithm "allreduce gloo"):
bench/collective_bench.sh runs it beside troupe's with GLOO=1.

  gloo_bench.py --rank R --nodes H:P,H:P,... [--sizes 64K,1M,...] [--label L]
                [--target-s S] [--min-iters N] [--max-iters N] [--warmup N]

Time of one allreduce: the median over the iterations of (barrier, allreduce,
barrier) on rank 0 less the median of a bare (barrier, barrier), as troupe's
broadcast is timed; busbw = bytes / time * 2(N-1)/N. One thread per process;
GLOO_SOCKET_IFNAME names the interface (the caller sets it)."""
import argparse
import statistics
import sys
import time

from tuned_malloc import rerun_with_tuned_malloc


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip()
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def size_text(n):
    if n >= (1 << 20) and n % (1 << 20) == 0:
        return "%d MiB" % (n >> 20)
    if n >= 1024 and n % 1024 == 0:
        return "%d KiB" % (n >> 10)
    return "%d B" % n


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--nodes", required=True, help="host:port of every member, rank order; rank 0's is the rendezvous")
    p.add_argument("--sizes", default="64K,256K,1M,4M,16M,64M")
    p.add_argument("--label", default="")
    p.add_argument("--target-s", type=float, default=2.0)
    p.add_argument("--min-iters", type=int, default=3)
    p.add_argument("--max-iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=1)
    a = p.parse_args()
    rerun_with_tuned_malloc()  # MALLOC_MMAP_THRESHOLD_ raised, as a fair PyTorch baseline runs (bench/tuned_malloc.py)
    nodes = a.nodes.split(",")
    n = len(nodes)
    if not 0 <= a.rank < n:
        sys.exit("gloo_bench.py: --rank %d outside the %d nodes" % (a.rank, n))
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    host, port = nodes[0].rsplit(":", 1)
    dist.init_process_group("gloo", init_method="tcp://%s:%s" % (host, port), rank=a.rank, world_size=n,
                            timeout=__import__("datetime").timedelta(seconds=120))

    def timed(op, iters):
        out = []
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            op()
            dist.barrier()
            out.append(time.perf_counter() - t0)
        return out

    bare = statistics.median(timed(lambda: None, 20))
    for s in a.sizes.split(","):
        nbytes = parse_size(s)
        x = torch.ones(nbytes // 4, dtype=torch.float32)
        op = lambda: dist.all_reduce(x)
        timed(op, a.warmup)
        once = statistics.median(timed(op, 1))
        iters = max(a.min_iters, min(a.max_iters, int(a.target_s / max(once, 1e-6))))
        # Every rank must run the same count: rank 0's decides.
        k = torch.tensor([iters])
        dist.broadcast(k, 0)
        ts = [max(t - bare, 1e-9) for t in timed(op, int(k.item()))]
        if a.rank == 0:
            med = statistics.median(ts)
            algbw = nbytes / med / 1e6
            print("| %s | %d | allreduce gloo | 0 | %s | %d | %.3f | %.3f | %.3f | %.1f | %.1f |" % (
                a.label, n, size_text(nbytes), len(ts), med * 1e3, min(ts) * 1e3, max(ts) * 1e3, algbw,
                algbw * 2 * (n - 1) / n), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
