#!/usr/bin/env python3
"""Tables and curves of bench/ddc_protocol.sh's runs (issue 14's fair protocol).

  ddc_protocol_report.py OUT_DIR EPOCHS > report.md

Runs are OUT_DIR/{model}_{setting}_{rule}_{lr}_{seed}.jsonl (+ .log). For each
model, setting and rule, the lr is the one of the highest mean final
validation accuracy over the seeds every lr was run with (the sweep); the
tables give the test accuracy of all seeds at that lr. A run whose loss
became non-finite counts as diverged (validation accuracy 0 in the choice).
Curves: OUT_DIR/curves_{model}_{setting}.png, drawn with gnuplot.
"""
import collections
import glob
import json
import math
import os
import statistics
import subprocess
import sys

RULES = ["asgd", "dc-asgd-a", "ddc-v1", "ddc-v2"]
SETTINGS = ["n4", "n8", "n16", "hetero8", "straggler8"]
TARGET = {"mlp": 0.85, "cnn": 0.88}  # accuracy for "updates and time to target"


def load(path, epochs):
    """(epoch records, workers summary or None, diverged)"""
    recs, summary = [], None
    if os.path.exists(path):
        for line in open(path):
            j = json.loads(line)
            if "epoch" in j:
                recs.append(j)
            elif "workers_summary" in j:
                summary = j["workers_summary"]
    log = path[:-len(".jsonl")] + ".log"
    text = open(log).read() if os.path.exists(log) else ""
    diverged = "not finite" in text or "NaN or Inf" in text or len(recs) < epochs \
        or any(r["train_loss"] is None for r in recs)
    return recs, summary, diverged


def mean_sd(xs):
    if not xs:
        return float("nan"), float("nan")
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def main():
    out, epochs = sys.argv[1], int(sys.argv[2])
    runs = collections.defaultdict(dict)  # (model, setting, rule) -> {(lr, seed): run}
    for f in glob.glob(os.path.join(out, "*.jsonl")):
        model, setting, rule, lr, seed = os.path.basename(f)[:-len(".jsonl")].split("_")
        runs[(model, setting, rule)][(lr, seed)] = load(f, epochs)
    for f in glob.glob(os.path.join(out, "*.log")):  # runs that stopped before writing a record
        model, setting, rule, lr, seed = os.path.basename(f)[:-len(".log")].split("_")
        runs[(model, setting, rule)].setdefault((lr, seed), ([], None, True))

    print(f"Runs in `{out}`, {epochs} epochs each; lr chosen on the validation set (the last 10 % of the "
          "training set); test accuracy at the chosen lr.\n")
    verdicts = []
    for model in ("mlp", "cnn"):
        settings = [s for s in SETTINGS if any((model, s, r) in runs for r in RULES)]
        if not settings:
            continue
        target = TARGET[model]
        print(f"## {model.upper()}\n")
        print(f"| setting | rule | lr sweep: mean final validation accuracy % | chosen lr | seeds | "
              f"final test accuracy % (mean ± sd) | test accuracy per epoch (mean) | "
              f"updates to {100 * target:.0f} % | seconds to {100 * target:.0f} % | mean staleness |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        staleness_rows, curves = [], collections.defaultdict(dict)
        for s in settings:
            best = {}
            for rule in RULES:
                cell = runs.get((model, s, rule))
                if not cell:
                    continue
                lrs = sorted({lr for lr, _ in cell}, key=float)
                seeds_of = {lr: {seed for l, seed in cell if l == lr} for lr in lrs}
                swept = set.intersection(*seeds_of.values())
                sweep = {}
                for lr in lrs:
                    vals = [0.0 if cell[(lr, sd)][2] else 100 * (cell[(lr, sd)][0][-1].get("validation_accuracy") or 0)
                            for sd in sorted(swept)]
                    sweep[lr] = statistics.mean(vals)
                    if all(cell[(lr, sd)][2] for sd in swept):
                        sweep[lr] = -1.0  # every run diverged
                lr = max(lrs, key=lambda x: sweep[x])
                chosen = [cell[(lr, sd)] for sd in sorted(seeds_of[lr])]
                ok = [c for c in chosen if not c[2]]
                acc = [100 * c[0][-1]["test_accuracy"] for c in ok]
                m, sd = mean_sd(acc)
                per_epoch = [statistics.mean(100 * c[0][e]["test_accuracy"] for c in ok) for e in range(epochs)] if ok else []
                reach = [next((r for r in c[0] if r["test_accuracy"] >= target), None) for c in ok]
                hit = [r for r in reach if r]
                upd = f"{statistics.mean(r['steps'] for r in hit):.0f}" if hit else "-"
                secs = f"{statistics.mean(r['wall_s'] for r in hit):.1f}" if hit else "-"
                if len(hit) < len(chosen):
                    upd += f" ({len(hit)}/{len(chosen)} reached)"
                tau = statistics.mean(statistics.mean(r["mean_staleness"] for r in c[0]) for c in ok) if ok else float("nan")
                div = len(chosen) - len(ok)
                print(f"| {s} | {rule} | {' / '.join(f'{x}: ' + (f'{sweep[x]:.2f}' if sweep[x] >= 0 else 'diverged') for x in lrs)} | {lr} | "
                      f"{len(chosen)}{f' ({div} diverged)' if div else ''} | {m:.2f} ± {sd:.2f} | "
                      f"{' / '.join(f'{x:.2f}' for x in per_epoch)} | {upd} | {secs} | {tau:.2f} |")
                best[rule] = (m, sd)
                curves[s][rule] = per_epoch
                summ = [c[1] for c in ok if c[1]]
                if summ:
                    n = len(summ[0])
                    w_tau = [statistics.mean(x[i]["mean_staleness"] for x in summ) for i in range(n)]
                    w_p90 = [statistics.mean(x[i]["p90_staleness"] for x in summ) for i in range(n)]
                    w_upd = [statistics.mean(x[i]["updates"] for x in summ) for i in range(n)]
                    total = sum(w_upd)
                    staleness_rows.append(
                        f"| {s} | {rule} | {' / '.join(f'{x:.1f}' for x in w_tau)} | "
                        f"{' / '.join(f'{x:.0f}' for x in w_p90)} | "
                        f"{' / '.join(f'{100 * x / total:.1f}' for x in w_upd)} |")
            if all(r in best for r in ("asgd", "dc-asgd-a", "ddc-v2")):
                rival = max(("asgd", "dc-asgd-a"), key=lambda r: best[r][0])
                (v, vsd), (b, bsd) = best["ddc-v2"], best[rival]
                verdicts.append((model, s, v, vsd, rival, b, bsd, v >= b, v - b > max(vsd, bsd)))
            png = os.path.join(out, f"curves_{model}_{s}.png")
            plot(png, f"{model.upper()} {s}: test accuracy, each rule at its chosen lr", curves[s])
        print()
        print(f"Per-worker staleness of the {model.upper()} runs at the chosen lr (mean over seeds), "
              "worker 0 first; the share of the updates each worker made.\n")
        print("| setting | rule | mean staleness per worker | p90 staleness per worker | % of the updates per worker |")
        print("|---|---|---|---|---|")
        for row in staleness_rows:
            print(row)
        print()
    print("## DDC-ASGD v2 against the better of ASGD and DC-ASGD-a\n")
    print("| model | setting | ddc-v2 % | better rival | its % | v2 >= rival | ahead by > 1 sd |")
    print("|---|---|---|---|---|---|---|")
    for model, s, v, vsd, rival, b, bsd, ge, ahead in verdicts:
        print(f"| {model} | {s} | {v:.2f} ± {vsd:.2f} | {rival} | {b:.2f} ± {bsd:.2f} | "
              f"{'yes' if ge else 'no'} | {'yes' if ahead else 'no'} |")


def plot(png, title, curves):
    if not curves:
        return
    dat = png[:-len(".png")] + ".dat"
    rules = [r for r in RULES if curves.get(r)]
    with open(dat, "w") as f:
        for e in range(max(len(curves[r]) for r in rules)):
            f.write(f"{e + 1} " + " ".join(f"{curves[r][e]:.3f}" if e < len(curves[r]) else "?" for r in rules) + "\n")
    lines = ", ".join(f"'{dat}' using 1:{i + 2} with linespoints title '{r}'" for i, r in enumerate(rules))
    script = (f"set terminal pngcairo size 800,500; set output '{png}'; set title '{title}'; "
              f"set xlabel 'epoch'; set xtics 1; set ylabel 'test accuracy %'; set key bottom right; set grid; plot {lines}")
    try:
        subprocess.run(["gnuplot", "-e", script], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"(no plot {png}: {e})", file=sys.stderr)


if __name__ == "__main__":
    main()
