#!/usr/bin/env python3
"""Draws the placement study (troupe_placement_study --json FILE) as a PNG with gnuplot.

  placement_study.py STUDY.json [OUT.png] [--title T]

OUT defaults to docs/img/placement_study.png. Per placer, its predicted step
time over the optimum's on every instance, sorted (the instances ranked
separately per curve): greedy (the default), greedy's walk alone, and the
median of 100 random placements. Log scale; lines at 1.05 and 1.15 (issue
12's median and worst-case goals for greedy).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

CURVES = [  # field, title, colour
    ("greedy_ratio", "greedy (default)", "#4c72b0"),
    ("greedy_walk_ratio", "greedy, walk alone", "#55a868"),
    ("random_ratio", "random (median of 100)", "#c44e52"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("study")
    ap.add_argument("out", nargs="?", default="docs/img/placement_study.png")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    try:
        rows = [json.loads(line) for line in open(a.study) if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"placement_study: cannot read {a.study}: {e}")
    summary = next((r for r in rows if r.get("summary")), {})
    rows = [r for r in rows if not r.get("summary")]
    if not rows:
        sys.exit(f"placement_study: {a.study} holds no instances")
    with tempfile.TemporaryDirectory() as tmp:
        plots = []
        for i, (field, title, colour) in enumerate(CURVES):
            values = sorted(r[field] for r in rows if field in r)
            path = os.path.join(tmp, f"{i}.dat")
            with open(path, "w") as f:
                f.writelines(f"{rank + 1} {v:.6f}\n" for rank, v in enumerate(values))
            plots.append(f'"{path}" using 1:2 with steps lw 2 lc rgb "{colour}" title "{title}"')
        n = len(rows)
        title = a.title or (f"placement on {n} generated chains: step time / optimum "
                            f"(greedy median {summary.get('greedy_ratio_median', '?')}, "
                            f"worst {summary.get('greedy_ratio_worst', '?')}; "
                            f"random median {summary.get('random_ratio_median', '?')})")
        script = f"""set terminal pngcairo size 1000,600 font ",10"
set output "{a.out}"
set termoption noenhanced
set title "{title}"
set xlabel "instances, sorted per curve"
set ylabel "predicted step time / optimal"
set logscale y
set xrange [1:{n}]
set yrange [0.95:*]
set ytics ("1" 1, "1.05" 1.05, "1.15" 1.15, "1.5" 1.5, "2" 2, "3" 3, "5" 5, "10" 10)
set grid ytics mytics
set key top left
set arrow from graph 0, first 1.05 to graph 1, first 1.05 nohead dt 2 lc rgb "#888888"
set arrow from graph 0, first 1.15 to graph 1, first 1.15 nohead dt 3 lc rgb "#888888"
plot {", ".join(plots)}
"""
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        try:
            subprocess.run(["gnuplot"], input=script.encode(), check=True)
        except FileNotFoundError:
            sys.exit("placement_study: gnuplot is not installed (apt-get install gnuplot-nox)")


if __name__ == "__main__":
    main()
