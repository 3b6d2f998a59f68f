#!/usr/bin/env bash
# Collective bandwidth (issue 23), as nccl-tests reports it: troupe's ring and
# recursive-doubling allreduce and its broadcast among N node processes
# (troupe_collective_bench, one process per member), for each link and N; one
# markdown table of rank 0's rows on stdout, then a summary: the bandwidth of
# each link, the sizes at which recursive doubling beats the ring, the best
# piece size.
#   bench/collective_bench.sh [BUILD_DIR]     (default build/)
# Links (LINKS, default "loopback 1gbit 200mbit"): loopback is 127.0.0.1; a rate
# puts each process in a network namespace of its own, joined by veth pairs to
# a bridge in another namespace, with tbf at that rate on each process's link, both ways
# (as scripts/local_cluster.sh does with TROUPE_NETNS=1 TROUPE_NETNS_RATE):
# root only, skipped otherwise. The namespaces (cb<tag>n<i>, cb<tag>br, with
# addresses 10.78.<tag % 250>.<i + 1> inside them only) are removed at the end,
# also when interrupted.
# Environment: NS ("2 3 4"), LINKS, SIZES (4K..4M by 2, 16M, 64M), ALGS
# (ring,doubling,broadcast; also tree), PIECES (16384,65536,262144: the ring and the
# broadcast at PIECE_SIZE, 16M, with each piece size; "none" to skip), TARGET_S (2:
# the timed iterations of a point take about this long), MIN_ITERS (3), MAX_ITERS (20),
# WARMUP (1), TAG (default from the pid), GLOO (0; 1: PyTorch's Gloo allreduce too,
# bench/gloo_bench.py on the same links and sizes, right after troupe's, and a table of
# troupe's ring busbw over Gloo's per size), LANE_MB (the same-host lanes' region per
# peer, troupe_collective_bench --lane-mb; 0: loopback through the sockets only). Node logs go to a temporary directory,
# kept (and named on stderr) when a process fails.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bench=$build/bench/troupe_collective_bench
[ -x "$bench" ] || { echo "collective_bench.sh: $bench not built (cmake --build $build --target troupe_collective_bench)" >&2; exit 1; }
ns_list=${NS:-2 3 4}
links=${LINKS:-loopback 1gbit 200mbit}
sizes=${SIZES:-4K,8K,16K,32K,64K,128K,256K,512K,1M,2M,4M,16M,64M}
algs=${ALGS:-ring,doubling,broadcast}
pieces=${PIECES:-16384,65536,262144}
piece_size=${PIECE_SIZE:-16M}
tag=${TAG:-$(( $$ % 10000 ))}
[[ "$tag" =~ ^[0-9]{1,4}$ ]] || { echo "collective_bench.sh: TAG must be a number below 10000" >&2; exit 2; }
subnet=10.78.$(( tag % 250 ))
work=$(mktemp -d)
keep=0
opts=(--sizes "$sizes" --algorithms "$algs" --target-s "${TARGET_S:-2}" --min-iters "${MIN_ITERS:-3}"
      --max-iters "${MAX_ITERS:-20}" --warmup "${WARMUP:-1}")
[ "$pieces" = none ] || opts+=(--pieces "$pieces" --piece-size "$piece_size")
[ -z "${LANE_MB:-}" ] || opts+=(--lane-mb "$LANE_MB")

# ---- network namespaces: cb<tag>n<i> for process i, the bridge in cb<tag>br ----
# shellcheck source=scripts/netns.sh
source scripts/netns.sh
up_n=0
netns_down() {
  [ "$up_n" -gt 0 ] && netns_remove "cb${tag}" "$up_n"
  up_n=0
}
netns_up() {  # N RATE
  up_n=$1
  netns_create "cb${tag}" "$1" "$subnet" "$2"
}
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  netns_down
  if [ "$keep" = 1 ]; then echo "collective_bench.sh: the processes' logs are in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM


# Gloo's allreduce on the links run_one set up: N processes of bench/gloo_bench.py, glibc's
# mmap threshold raised as a fair PyTorch baseline needs (bench/tuned_malloc.py).
tuned_malloc=(MALLOC_MMAP_THRESHOLD_=1000000000 MALLOC_TRIM_THRESHOLD_=1000000000)
run_gloo() {  # LINK N
  local link=$1 n=$2 gnodes="" i iface port
  if [ "$link" = loopback ]; then port=$(free_ports 1); else port=29600; fi
  for i in $(seq 0 $(( n - 1 ))); do
    if [ "$link" = loopback ]; then gnodes+="${gnodes:+,}127.0.0.1:$port"; else gnodes+="${gnodes:+,}$subnet.$(( i + 1 )):$port"; fi
  done
  local gopts=(--nodes "$gnodes" --label "$link" --sizes "$sizes" --target-s "${TARGET_S:-2}"
               --min-iters "${MIN_ITERS:-3}" --max-iters "${MAX_ITERS:-20}" --warmup "${WARMUP:-1}")
  for i in $(seq 1 $(( n - 1 ))); do
    iface=lo; [ "$link" = loopback ] || iface=cb${tag}v$i
    run_on "$i" env GLOO_SOCKET_IFNAME="$iface" "${tuned_malloc[@]}" /usr/bin/python3 bench/gloo_bench.py --rank "$i" "${gopts[@]}" \
      > "$work/$link-n$n-gloo$i.log" 2>&1 &
    pids+=($!)
  done
  iface=lo; [ "$link" = loopback ] || iface=cb${tag}v0
  local status=0
  run_on 0 env GLOO_SOCKET_IFNAME="$iface" "${tuned_malloc[@]}" /usr/bin/python3 bench/gloo_bench.py --rank 0 "${gopts[@]}" \
    2> "$work/$link-n$n-gloo0.log" | tee "$work/$link-n$n-gloo.rows" || status=1
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  pids=()
  [ "$status" = 0 ] || cat "$work/$link-n$n-gloo"*.log >&2
  return "$status"
}

# One run: N processes on LINK; rank 0's rows go to stdout. Fails when any process fails.
run_one() {  # LINK N
  local link=$1 n=$2 nodes="" i
  if [ "$link" = loopback ]; then
    local ports
    read -r -a ports <<< "$(free_ports "$n")"
    for i in $(seq 0 $(( n - 1 ))); do nodes+="${nodes:+,}127.0.0.1:${ports[$i]}"; done
  else
    netns_up "$n" "$link" || { echo "collective_bench.sh: cannot make network namespaces" >&2; return 1; }
    for i in $(seq 0 $(( n - 1 ))); do nodes+="${nodes:+,}$subnet.$(( i + 1 )):29500"; done
  fi
  head -c 32 /dev/urandom > "$work/secret"
  chmod 600 "$work/secret"
  run_on() { if [ "$link" = loopback ]; then "${@:2}"; else ip netns exec "cb${tag}n$1" "${@:2}"; fi; }
  pids=()
  for i in $(seq 1 $(( n - 1 ))); do
    run_on "$i" "$bench" --rank "$i" --nodes "$nodes" --secret-file "$work/secret" --label "$link" "${opts[@]}" \
      > "$work/$link-n$n-rank$i.log" 2>&1 &
    pids+=($!)
  done
  local status=0
  run_on 0 "$bench" --rank 0 --nodes "$nodes" --secret-file "$work/secret" --label "$link" "${opts[@]}" \
    2> "$work/$link-n$n-rank0.log" | tee "$work/$link-n$n.rows" || status=1
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  pids=()
  [ "${GLOO:-0}" = 1 ] && [ "$status" = 0 ] && { run_gloo "$link" "$n" || status=1; }
  [ "$link" = loopback ] || netns_down
  if [ "$status" != 0 ]; then
    keep=1
    echo "collective_bench.sh: a process failed on $link with N = $n:" >&2
    cat "$work/$link-n$n-rank"*.log >&2
  fi
  return "$status"
}

echo "# Collective bandwidth"
echo
echo "command: \`$0 $*\`, NS=\"$ns_list\" LINKS=\"$links\" SIZES=$sizes ALGS=$algs PIECES=$pieces PIECE_SIZE=$piece_size" \
     "TARGET_S=${TARGET_S:-2} MIN_ITERS=${MIN_ITERS:-3} MAX_ITERS=${MAX_ITERS:-20} WARMUP=${WARMUP:-1}"
echo
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name:\s*//p' | head -n 1); date $(date -u +%Y-%m-%dT%H:%MZ)," \
     "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo
echo "time: median over the iterations (min, max) of one operation in ms (an allreduce: until its last member is done;" \
     "a broadcast: on its root, up to a barrier after it, less a bare barrier); algbw = bytes / time," \
     "busbw = algbw * 2(N-1)/N for an allreduce (algbw for a broadcast), MB/s = 10^6 bytes/s."
echo
echo "| link | N | algorithm | piece | size | iters | time ms | min ms | max ms | algbw MB/s | busbw MB/s |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
failed=0
for link in $links; do
  if [ "$link" != loopback ] && [ "$(id -u)" != 0 ]; then
    echo "collective_bench.sh: $link needs root (network namespaces); skipped" >&2
    continue
  fi
  for n in $ns_list; do
    started=$SECONDS
    run_one "$link" "$n" || failed=1
    echo "collective_bench.sh: $link, N = $n: $(( SECONDS - started )) s" >&2
  done
done
echo
cat "$work"/*.rows 2>/dev/null | python3 -c '
import sys, collections
rows = []
for line in sys.stdin:
    f = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(f) != 11: continue
    rows.append(dict(link=f[0], n=int(f[1]), alg=f[2], piece=int(f[3]), size=f[4], t=float(f[6]),
                     algbw=float(f[9]), busbw=float(f[10])))
last = {}
for r in rows:  # a point measured twice (the piece sweep at a size of the sweep): the later one
    last[(r["link"], r["n"], r["alg"], r["piece"], r["size"])] = r
rows = list(last.values())
def nbytes(s):
    v, u = s.split()
    return int(v) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}[u]
default = collections.Counter(r["piece"] for r in rows if r["alg"] != "allreduce gloo").most_common(1)[0][0] if rows else 0
keys = sorted({(r["link"], r["n"]) for r in rows}, key=lambda k: (k[0] != "loopback", k[0], k[1]))
print("## Summary")
print()
print("Per link and N: busbw of the ring allreduce and algbw of the broadcast chain at the largest size (MB/s;")
print("small sizes can pass a tbf link faster than its rate, on the token bucket burst);")
print("the sizes at which recursive doubling took less time than the ring (piece %d); the largest size" % default)
print("up to which it won at every size (the small-buffer threshold to use: below the next size);")
print("the piece size with the least time at the piece-sweep size.")
print()
print("| link | N | ring busbw | broadcast algbw | doubling wins at | wins up to | best piece: ring | best piece: broadcast |")
print("|---|---|---|---|---|---|---|---|")
for link, n in keys:
    sel = [r for r in rows if r["link"] == link and r["n"] == n]
    main = [r for r in sel if r["piece"] == default]
    ring = {r["size"]: r for r in main if r["alg"] == "allreduce ring"}
    dbl = {r["size"]: r for r in main if r["alg"] == "allreduce doubling"}
    common = sorted(set(ring) & set(dbl), key=nbytes)
    wins = [s for s in common if dbl[s]["t"] < ring[s]["t"]]
    upto = "-"
    for s in common:
        if s not in wins: break
        upto = s
    def at_largest(alg, key):
        c = [r for r in main if r["alg"] == alg]
        return "%s at %s" % (max(c, key=lambda r: nbytes(r["size"]))[key], max(c, key=lambda r: nbytes(r["size"]))["size"]) if c else "-"
    sweep = [r for r in sel if len({x["piece"] for x in sel if x["size"] == r["size"] and x["alg"] == r["alg"]}) > 1]
    def best_piece(alg):
        c = [r for r in sweep if r["alg"] == alg]
        if not c: return "-"
        b = min(c, key=lambda r: r["t"])
        return "%d (%s, %.3f ms)" % (b["piece"], b["size"], b["t"])
    print("| %s | %d | %s | %s | %s | %s | %s | %s |" % (link, n, at_largest("allreduce ring", "busbw"),
          at_largest("broadcast chain", "algbw"), ", ".join(wins) or "none", upto,
          best_piece("allreduce ring"), best_piece("broadcast chain")))
gloo = [r for r in rows if r["alg"] == "allreduce gloo"]
if gloo:
    print()
    print("The ring allreduce of troupe (piece %d) against the allreduce of PyTorch Gloo, busbw MB/s per size:" % default)
    print()
    print("| link | N | size | troupe busbw | Gloo busbw | troupe / Gloo |")
    print("|---|---|---|---|---|---|")
    ring = {(r["link"], r["n"], r["size"]): r for r in rows if r["alg"] == "allreduce ring" and r["piece"] == default}
    for g in sorted(gloo, key=lambda r: (r["link"] != "loopback", r["link"], r["n"], nbytes(r["size"]))):
        t = ring.get((g["link"], g["n"], g["size"]))
        if t:
            print("| %s | %d | %s | %.1f | %.1f | %.2f |" % (g["link"], g["n"], g["size"], t["busbw"], g["busbw"],
                  t["busbw"] / g["busbw"]))
'
exit "$failed"
