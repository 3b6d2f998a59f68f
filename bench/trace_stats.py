#!/usr/bin/env python3
"""Utilization and pipeline bubble from a troupe trace (--trace FILE).

  trace_stats.py TRACE [--only TEXT] [--micro-batches M] [--stages K] [--json OUT]

Reads the Chrome trace event file troupe writes (one track per actor, "X"
spans named forward, backward, update, push, apply, load, wait, ...), and
prints per track:

  busy      the time in spans other than "wait" (and other than --idle names)
  util      busy / the run's window (the first span's start to the last's end,
            over every track)
  idle      1 - util: for a pipeline stage, its bubble

With --micro-batches M, spans that carry a micro-batch id are grouped by
mini-batch (id // M) and each mini-batch gets its own window (its first span
to its last, over every track): the per-mini-batch bubble, without the gaps
between mini-batches. With --stages K the ideal bubble (K-1)/(N+K-1) is
printed next to it, N being M per mini-batch, and the number of micro-batches
of the whole run for the window of the run.

--only TEXT keeps the tracks whose name holds TEXT (e.g. "stage", "worker"):
the window is theirs alone.

The output is a table, and with --json a JSON object a tool can read.
"""
import argparse
import collections
import json
import sys


def load(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        sys.exit(f"trace_stats: cannot read {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        sys.exit(f"trace_stats: {path} is not JSON ({e})")
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    names = {}
    spans = []
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e.get("ph") == "X":
            spans.append(e)
    if not spans:
        sys.exit(f"trace_stats: {path} holds no spans (was the run traced with --trace?)")
    return names, spans


def busy_by_track(spans, idle_names):
    busy = collections.defaultdict(float)
    for s in spans:
        if s["name"] not in idle_names:
            busy[(s["pid"], s["tid"])] += s["dur"]
    return busy


def window(spans):
    return min(s["ts"] for s in spans), max(s["ts"] + s["dur"] for s in spans)


def ideal(stages, n):
    return (stages - 1) / (n + stages - 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--micro-batches", type=int, default=0, help="M: group spans by mini-batch")
    ap.add_argument("--stages", type=int, default=0, help="K: print the ideal bubble")
    ap.add_argument("--idle", action="append", default=["wait"], help="span names that are not work (default: wait)")
    ap.add_argument("--json", help="also write the figures as JSON to this file")
    ap.add_argument("--only", help="only the tracks whose name holds this text")
    a = ap.parse_args()

    names, spans = load(a.trace)
    if a.only:
        spans = [s for s in spans if a.only in names.get((s["pid"], s["tid"]), "")]
        if not spans:
            sys.exit(f"trace_stats: no track of {a.trace} has '{a.only}' in its name")
    idle_names = set(a.idle)
    tracks = sorted({(s["pid"], s["tid"]) for s in spans})
    label = {t: names.get(t, f"pid {t[0]} tid {t[1]}") for t in tracks}
    t0, t1 = window(spans)
    run_us = t1 - t0
    busy = busy_by_track(spans, idle_names)
    out = {"trace": a.trace, "window_ms": run_us / 1000, "tracks": []}
    micro = sorted({s["args"]["micro_batch"] for s in spans if "micro_batch" in s.get("args", {})})
    if a.stages and micro:
        out["ideal_idle_run"] = ideal(a.stages, len(micro))

    per_batch = {}
    if a.micro_batches > 0:
        groups = collections.defaultdict(list)
        for s in spans:
            mb = s.get("args", {}).get("micro_batch")
            if mb is not None:
                groups[mb // a.micro_batches].append(s)
        for b, g in sorted(groups.items()):
            w0, w1 = window(g)
            per_batch[b] = (w1 - w0, busy_by_track(g, idle_names))
        if a.stages:
            out["ideal_idle_mini_batch"] = ideal(a.stages, a.micro_batches)

    print(f"{a.trace}: {len(spans)} spans on {len(tracks)} tracks, window {run_us / 1000:.1f} ms")
    header = f"{'track':<28} {'busy ms':>9} {'util':>6} {'idle':>6}"
    if per_batch:
        header += f" {'idle/mini-batch':>16}"
    print(header)
    for t in tracks:
        u = busy[t] / run_us if run_us > 0 else 0.0
        row = {"track": label[t], "busy_ms": busy[t] / 1000, "utilization": u, "idle": 1 - u}
        line = f"{label[t]:<28} {busy[t] / 1000:>9.1f} {u:>6.3f} {1 - u:>6.3f}"
        if per_batch:
            fr = [1 - bb.get(t, 0.0) / w for w, bb in per_batch.values() if w > 0]
            mean = sum(fr) / len(fr) if fr else 0.0
            row["idle_per_mini_batch"] = mean
            line += f" {mean:>16.3f}"
        out["tracks"].append(row)
        print(line)
    if "ideal_idle_run" in out:
        print(f"ideal bubble over the run ({len(micro)} micro-batches, {a.stages} stages): {out['ideal_idle_run']:.3f}")
    if "ideal_idle_mini_batch" in out:
        print(f"ideal bubble per mini-batch ({a.micro_batches} micro-batches, {a.stages} stages): "
              f"{out['ideal_idle_mini_batch']:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
