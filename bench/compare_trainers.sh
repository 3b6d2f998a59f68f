#!/usr/bin/env bash
# Compares two troupe_trainer binaries (e.g. before and after a change),
# interleaved in one invocation: per repetition, A sequential, A on actors
# (ASGD, 1 worker), B sequential, B on actors; prints each run's samples/s and
# the actors / sequential ratio of each binary, then the medians.
#   bench/compare_trainers.sh OLD_TRAINER NEW_TRAINER [MODEL] [STEPS] [REPS]
set -euo pipefail
a=$1 b=$2 model=${3:-mlp} steps=${4:-600} reps=${5:-7}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
run() {  # binary, extra options -> samples/s of the run
  "$1" --model "$model" --epochs 1 --max-steps "$steps" --progress none $2 --metrics-out "$tmp/m.jsonl" > /dev/null 2>&1
  grep -o '"samples_per_s":[0-9.]*' "$tmp/m.jsonl" | cut -d: -f2
}
for i in $(seq 1 "$reps"); do
  echo "$(run "$a" "") $(run "$a" "--algorithm asgd --workers 1") $(run "$b" "") $(run "$b" "--algorithm asgd --workers 1")"
done | awk '
  function median(v, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
                                     return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
  { n++; as[n] = $1; aa[n] = $2; bs[n] = $3; ba[n] = $4; ar[n] = $2 / $1; br[n] = $4 / $3
    printf "A: sequential %.0f, actors %.0f, ratio %.3f | B: sequential %.0f, actors %.0f, ratio %.3f\n", $1, $2, $2 / $1, $3, $4, $4 / $3 }
  END { printf "medians (%d reps): A sequential %.0f actors %.0f ratio %.3f | B sequential %.0f actors %.0f ratio %.3f\n",
               n, median(as, n), median(aa, n), median(ar, n), median(bs, n), median(ba, n), median(br, n) }'
