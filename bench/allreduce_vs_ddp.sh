#!/usr/bin/env bash
# troupe's --algorithm allreduce against PyTorch DDP with the Gloo backend
# (bench/ddp_baseline.py), interleaved in one invocation: the same model, N
# processes with the same threads each (scripts/local_cluster.sh launches both,
# one node or rank per process), per-process batch 64, the same global steps;
# on loopback and, as root, in network namespaces whose links tbf limits to
# each RATE. With BUCKETS="0.25 0.5 1 4 25" troupe runs once per bucket size
# (--bucket-mb) in each round: the bucket-size sweep. Prints each run, then the
# medians per link and configuration and the ratio troupe / DDP.
#   bench/allreduce_vs_ddp.sh [MODEL] [N] [STEPS] [REPS] [RATES]
#   bench/allreduce_vs_ddp.sh cnn 2 200 3 200mbit,1gbit
#   BUCKETS="0.25 0.5 1 4 25" bench/allreduce_vs_ddp.sh mlp 2 200 3 200mbit
# Environment: BUCKETS (troupe's --bucket-mb values, default "1"), LINKS ("loopback"
# plus the rates, default; e.g. LINKS=200mbit for the rate-limited link alone),
# DDP=0 (troupe alone), DDP_WARMUP (10: DDP steps left out of its samples/s;
# troupe's samples_per_s covers every step, so this leans towards DDP),
# COMPRESS=1 (also troupe with --allreduce-dtype bf16, buckets of the first
# BUCKETS value, against DDP with its fp16 compression hook: half the bytes
# each; DDP's bf16 hook needs CUDA and NCCL).
set -euo pipefail
model=${1:-mlp} n=${2:-2} steps=${3:-200} reps=${4:-3} rates=${5:-200mbit}
here=$(cd "$(dirname "$0")" && pwd)
cluster=$here/../scripts/local_cluster.sh
trainer=${TROUPE_TRAINER:-$here/../build/troupe_trainer}
[ -x "$trainer" ] || { echo "allreduce_vs_ddp.sh: no trainer at $trainer (build first)" >&2; exit 2; }
/usr/bin/python3 -c 'import torch.distributed as d; assert d.is_gloo_available()' 2> /dev/null ||
  { echo "allreduce_vs_ddp.sh: /usr/bin/python3 has no torch with Gloo (scripts/setup.sh --bench)" >&2; exit 2; }
buckets=${BUCKETS:-1}
links=${LINKS:-loopback ${rates//,/ }}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# The configurations of a round, in order: "troupe BUCKET_MB DTYPE" or "ddp COMPRESS".
configs=()
for b in $buckets; do configs+=("troupe $b f32"); done
[ "${DDP:-1}" = 1 ] && configs+=("ddp none")
if [ "${COMPRESS:-0}" = 1 ]; then
  configs+=("troupe ${buckets%% *} bf16")
  [ "${DDP:-1}" = 1 ] && configs+=("ddp fp16")
fi
label() {  # CONFIG -> its name in the tables
  set -- $1
  case "$1 ${3:-}" in
    "troupe f32") echo "troupe, buckets of $2 MB" ;;
    "troupe bf16") echo "troupe, buckets of $2 MB, bf16 gradients" ;;
    *) if [ "$2" = none ]; then echo ddp; else echo "ddp, $2 hook"; fi ;;
  esac
}

net_env() {  # LINK -> the environment local_cluster.sh needs for it
  [ "$1" = loopback ] || echo "TROUPE_NETNS=1 TROUPE_NETNS_RATE=$1"
}
# One run: prints "samples/s loss accuracy" (the DDP line adds its samples/s over all steps), or "0 - -".
troupe_run() {  # LINK BUCKET_MB DTYPE
  env $(net_env "$1") TROUPE_TRAINER="$trainer" "$cluster" "$n" --model "$model" --epochs 1 --max-steps $((steps * n)) \
    --workers "$n" --algorithm allreduce --bucket-mb "$2" --allreduce-dtype "$3" --progress none \
    --metrics-out "$tmp/m.jsonl" > "$tmp/run.log" 2>&1 || { echo "0 - -"; return; }
  /usr/bin/python3 -c 'import json, sys; m = json.loads(open(sys.argv[1]).readline())
print(m["samples_per_s"], m["train_loss"], m["test_accuracy"])' "$tmp/m.jsonl"
}
ddp_run() {  # LINK COMPRESS
  env $(net_env "$1") MALLOC_MMAP_THRESHOLD_=1000000000 MALLOC_TRIM_THRESHOLD_=1000000000 \
    TROUPE_TRAINER="$here/ddp_baseline.py" "$cluster" "$n" --model "$model" --steps "$steps" \
    --warmup "${DDP_WARMUP:-10}" --compress "$2" > "$tmp/run.log" 2>&1 || { echo "0 - -"; return; }
  grep '^{"impl"' "$tmp/run.log" | /usr/bin/python3 -c 'import json, sys; m = json.loads(sys.stdin.readline())
print(m["samples_per_s"], m["train_loss"], m["test_accuracy"], m["samples_per_s_all"])'
}

echo "# allreduce against PyTorch DDP (Gloo)"
echo
echo "command: \`BUCKETS=\"$buckets\" COMPRESS=${COMPRESS:-0} $0 $model $n $steps $reps $rates\`; LINKS=\"$links\""
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name:\s*//p' | head -n 1)" \
     "(cpu family $(lscpu | sed -n 's/^CPU family:\s*//p' | head -n 1)); date $(date -u +%Y-%m-%dT%H:%MZ);" \
     "commit $(git -C "$here" rev-parse --short HEAD 2> /dev/null || echo unknown);" \
     "torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')"
echo "model $model, $n processes (threads each: ${TROUPE_NODE_THREADS:-$(( $(nproc) / n > 0 ? $(nproc) / n : 1 ))})," \
     "batch 64 per process, $steps global steps, $reps rounds"
echo
echo "| link | round | configuration | samples/s | loss | accuracy | wall |"
echo "|---|---|---|---|---|---|---|"
for link in $links; do
  if [ "$link" != loopback ] && [ "$(id -u)" != 0 ]; then
    echo "allreduce_vs_ddp.sh: $link needs root (network namespaces); skipped" >&2
    continue
  fi
  for rep in $(seq 1 "$reps"); do
    for c in "${configs[@]}"; do
      started=$SECONDS
      read -r -a w <<< "$c"
      if [ "${w[0]}" = troupe ]; then r=$(troupe_run "$link" "${w[1]}" "${w[2]}"); else r=$(ddp_run "$link" "${w[1]}"); fi
      echo "run|$link|$rep|$(label "$c")|$r|$(( SECONDS - started ))"
    done
  done
done | tee "$tmp/runs" | awk -F'|' '{ split($5, v, " "); printf "| %s | %s | %s | %s | %s | %s | %s s |\n", $2, $3, $4, v[1], v[2], v[3], $6 }'
echo
/usr/bin/python3 - "$tmp/runs" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    _, link, rep, config, values, seconds = line.rstrip("\n").split("|")
    v = values.split()
    runs.setdefault(link, {}).setdefault(config, []).append([float(v[0])] + [float(x) if x != "-" else None for x in v[1:]])
print("| link | configuration | runs | median samples/s | troupe / DDP | median loss | median accuracy |")
print("|---|---|---|---|---|---|---|")
def med(rows, i):
    xs = [r[i] for r in rows if len(r) > i and r[i] is not None and r[0] > 0]
    return statistics.median(xs) if xs else None
for link, configs in runs.items():
    for config, rows in configs.items():
        s = med(rows, 0)
        if config.startswith("ddp"):  # its samples/s over every step, as troupe's
            ratio = "(all steps: %.0f)" % med(rows, 3) if med(rows, 3) else ""
        else:  # against DDP sending the same bytes: with its compression hook when troupe sends bf16
            ddp = med(next((r for c, r in configs.items() if c.startswith("ddp") and
                            ("hook" in c) == ("bf16" in config)), []), 0)
            ratio = "%.2f" % (s / ddp) if s and ddp else "-"
        fmt = lambda x, f: f % x if x is not None else "-"
        print("| %s | %s | %d | %s | %s | %s | %s |" % (link, config, len(rows), fmt(s, "%.0f"), ratio,
              fmt(med(rows, 1), "%.4f"), fmt(med(rows, 2), "%.4f")))
EOF
