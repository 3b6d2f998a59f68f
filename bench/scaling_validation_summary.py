#!/usr/bin/env python3
"""The scaling model's error per configuration from bench/scaling_validation.sh's output.

  scaling_validation_summary.py LOG

For each "=== MODEL N RATE" block of bench/allreduce_vs_shards.sh output: each configuration's
prediction from the compute measured alone and from the run's own (the "predicted ... with the
run's" lines) against the median measured samples/s, then how many are within 15 %.
"""
import re
import sys


def main(path):
    text = open(path).read()
    within_alone = within_run = total = 0
    for block in re.split(r"^=== ", text, flags=re.M)[1:]:
        head = " ".join(block.split("\n")[0].split())
        measured = dict(re.findall(r"median netns (.+?): (\d+) samples/s", block))
        for m in re.finditer(r"^(.+?): run's compute [\d.]+ ms a step; predicted (\d+) samples/s .*?, (\d+) with the run's",
                             block, re.M):
            config, alone, run = m.group(1), int(m.group(2)), int(m.group(3))
            if config not in measured:
                continue
            meas = int(measured[config])
            e_alone, e_run = (alone / meas - 1) * 100, (run / meas - 1) * 100
            total += 1
            within_alone += abs(e_alone) <= 15
            within_run += abs(e_run) <= 15
            print(f"{head:16s} {config:18s} {alone:6d} / {meas:6d} ({e_alone:+.0f} %; {e_run:+.0f} %)")
    if total == 0:
        sys.exit(f"scaling_validation_summary.py: no predictions in {path}")
    print(f"within 15 %: {within_alone} of {total} from the compute measured alone, {within_run} from the runs' own")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
