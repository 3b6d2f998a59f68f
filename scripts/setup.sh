#!/usr/bin/env bash
# Installs every Debian package troupe needs (idempotent), then configures and builds.
#   scripts/setup.sh            packages to build, train and run the README's commands + build
#   scripts/setup.sh --test     also what only the tests need (scripts/test.sh passes it)
#   scripts/setup.sh --bench    also the libtorch baseline (large), PyTorch DDP's and iperf3, used by bench/
#   scripts/setup.sh --no-build packages only
#   scripts/setup.sh --list     print the packages (with --test, --bench: theirs too) and do nothing else
set -euo pipefail
cd "$(dirname "$0")/.."

with_bench=0; with_test=0; build=1; list=0
for a in "$@"; do
  case "$a" in
    --bench) with_bench=1 ;;
    --test) with_test=1 ;;
    --no-build) build=0 ;;
    --list) list=1 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$a' (see --help)" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake pkg-config ninja-build
  libcaf-dev capnproto libcapnp-dev libssl-dev
  libeigen3-dev libboost-dev catch2 zlib1g-dev
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev
  libopenblas0-openmp libopenblas-openmp-dev
  dataset-fashion-mnist
  # the language model's default corpus (troupe_trainer --model gpt): /usr/share/games/fortunes
  fortunes
  # programs that scripts and the README's commands run: bench/trace_stats.py and trace_timeline.py
  # (python3, gnuplot), scripts/local_cluster.sh (ss; ip and tc with TROUPE_NETNS)
  python3 gnuplot-nox iproute2
)
# Only the tests: a one-machine Slurm (tests/scripts/slurm.sh: slurmctld, slurmd, munged, srun; pgrep),
# the libFuzzer targets' clang (scripts/fuzz.sh).
test_packages=(slurm-wlm munge procps clang libclang-rt-14-dev)
[ "$with_test" = 1 ] && packages+=("${test_packages[@]}")
# bench/: the libtorch baseline, PyTorch with Gloo for the DDP baseline (bench/ddp_baseline.py, /usr/bin/python3), iperf3.
[ "$with_bench" = 1 ] && packages+=(libtorch-dev python3-torch iperf3)
if [ "$list" = 1 ]; then printf '%s\n' "${packages[@]}"; exit 0; fi

sudo_cmd=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "setup.sh: not root and sudo is missing; run as root" >&2; exit 1; }
  sudo_cmd=(sudo)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup.sh: all packages present"
fi

if [ "$build" = 1 ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
  cmake --build build -j2
fi
