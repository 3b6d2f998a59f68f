#!/usr/bin/env python3
"""Renders a troupe trace (--trace FILE) as a PNG timeline with gnuplot.

  trace_timeline.py TRACE OUT.png [--from-ms A] [--to-ms B] [--title T]

One row per track (actor), one box per span coloured by its name (forward,
backward, update, push, apply, load; waits are left out), the micro-batch id
written in boxes wide enough to hold it. Times are in ms from the first span.
"""
import argparse
import json
import subprocess
import sys

COLOURS = {
    "forward": "#4c72b0", "backward": "#dd8452", "update": "#55a868", "apply": "#55a868",
    "push": "#c44e52", "pull": "#8172b3", "load": "#937860", "compute": "#4c72b0",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--from-ms", type=float, default=0.0)
    ap.add_argument("--to-ms", type=float, default=None)
    ap.add_argument("--title", default=None)
    ap.add_argument("--width", type=int, default=1200)
    a = ap.parse_args()
    try:
        doc = json.load(open(a.trace))
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"trace_timeline: cannot read {a.trace}: {e}")
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X" and e["name"] != "wait"]
    if not spans:
        sys.exit(f"trace_timeline: {a.trace} holds no spans")
    t0 = min(s["ts"] for s in spans)
    end = a.to_ms if a.to_ms is not None else max(s["ts"] + s["dur"] - t0 for s in spans) / 1000
    tracks = sorted({(s["pid"], s["tid"]) for s in spans})
    row = {t: i for i, t in enumerate(tracks)}
    lines = []
    used = set()
    for s in spans:
        b, e = (s["ts"] - t0) / 1000, (s["ts"] + s["dur"] - t0) / 1000
        if e < a.from_ms or b > end:
            continue
        y = len(tracks) - 1 - row[(s["pid"], s["tid"])]
        colour = COLOURS.get(s["name"], "#999999")
        used.add(s["name"])
        lines.append(f'set object rect from {b:.3f},{y - 0.35} to {e:.3f},{y + 0.35} '
                     f'fc rgb "{colour}" fs solid 0.9 border lc rgb "white"')
        mb = s.get("args", {}).get("micro_batch")
        if mb is not None and (e - b) > (end - a.from_ms) / 60:
            lines.append(f'set label "{mb}" at {(b + e) / 2:.3f},{y} center front tc rgb "white" font ",8"')
    ytics = ", ".join(f'"{names.get(t, str(t))}" {len(tracks) - 1 - row[t]}' for t in tracks)
    step = 0.6 / max(3, len(tracks) + 1) / max(1, len(used)) * 2
    keys = "".join(f'set object rect from screen 0.905,{0.80 - step * i} to screen 0.92,{0.80 - step * i + step * 0.6} '
                   f'fc rgb "{COLOURS.get(n, "#999999")}" fs solid\n'
                   f'set label "{n}" at screen 0.925,{0.80 - step * i + step * 0.3} font ",9"\n'
                   for i, n in enumerate(sorted(used)))
    script = f"""set terminal pngcairo size {a.width},{120 + 60 * len(tracks)} font ",10"
set output "{a.out}"
set termoption noenhanced
set title "{a.title or a.trace}"
set xlabel "ms"
set xrange [{a.from_ms}:{end}]
set yrange [-0.6:{len(tracks) - 0.4}]
set ytics ({ytics})
set tmargin 3
set rmargin 14
unset key
{keys}
{chr(10).join(lines)}
plot NaN notitle
"""
    try:
        subprocess.run(["gnuplot"], input=script.encode(), check=True)
    except FileNotFoundError:
        sys.exit("trace_timeline: gnuplot is not installed (apt-get install gnuplot-nox)")


if __name__ == "__main__":
    main()
