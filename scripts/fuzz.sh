#!/usr/bin/env bash
# Builds a libFuzzer target with clang++ -fsanitize=fuzzer,address and runs it
# for a bounded time: `frame` (tests/fuzz/frame_fuzz.cpp: the frame reader, the
# envelope reader, the handshake decoders) or `collective`
# (tests/fuzz/collective_fuzz.cpp: a group's collective cores, their messages
# reordered and altered). Cap'n Proto and OpenSSL come from the system (built
# by g++); troupe's own sources are compiled again with clang and instrumented.
#   scripts/fuzz.sh BUILD_DIR [SECONDS] [frame | collective]
# BUILD_DIR is a configured and built tree (it holds the generated
# *.capnp.c++). Exits 77 (CTest: skipped) when clang++ or libFuzzer is missing:
#   scripts/setup.sh --test --no-build     (clang libclang-rt-14-dev)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: fuzz.sh BUILD_DIR [SECONDS] [frame | collective]}" && pwd)
seconds=${2:-20}
target=${3:-frame}
case "$target" in
  frame) sources=(net/address.cpp net/message.cpp net/protocol.cpp net/tensor_codec.cpp net/buffer_pool.cpp net/frame.cpp
                  net/frame_cipher.cpp net/auth.cpp tensor/tensor.cpp tests/fuzz/frame_fuzz.cpp)
         libs=(-lcapnp -lkj -lcrypto -lpthread) max_len=65536 ;;
  collective) sources=(actors/collective_core.cpp tensor/error.cpp tests/fuzz/collective_fuzz.cpp)
              libs=() max_len=4096 ;;
  *) echo "fuzz.sh: no target '$target' (frame or collective)" >&2; exit 2 ;;
esac
out=$build/fuzz
clang=${CLANGXX:-clang++}

if ! command -v "$clang" >/dev/null; then
  echo "fuzz: $clang not found: skipped (scripts/setup.sh --test installs clang, libclang-rt-14-dev)"
  exit 77
fi
mkdir -p "$out/include"
probe=$out/probe.cpp
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' > "$probe"
if ! "$clang" -fsanitize=fuzzer,address "$probe" -o "$out/probe" 2>"$out/probe.log"; then
  echo "fuzz: $clang cannot build a libFuzzer target: skipped (scripts/setup.sh --test installs libclang-rt-14-dev)"
  sed 's/^/  /' "$out/probe.log" | head -5
  exit 77
fi

# The NaN scan's OpenMP calls run single-threaded here: no libomp needed, no threads in the fuzzer.
cat > "$out/include/omp.h" <<'EOF'
#pragma once
static inline int omp_get_max_threads(void) { return 1; }
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
EOF

flags=(-std=c++17 -O1 -g -fsanitize=fuzzer-no-link,address -fno-omit-frame-pointer -Wno-unknown-pragmas
       -I"$out/include" -I"$root" -I"$root/include" -I"$build")
objects=()
# An object is rebuilt when its source or any header it may include is newer (a header that changes a
# class's layout must not leave objects of two layouts in one binary).
newest_header=$(find "$root/net" "$root/tensor" "$root/actors" "$root/tests/fuzz" "$build/net" -name '*.h' -o -name '*.hpp' 2>/dev/null |
                xargs ls -t 2>/dev/null | head -n 1)
for s in "${sources[@]}"; do
  o=$out/$(echo "$s" | tr / _).o
  if [ ! -f "$o" ] || [ "$root/$s" -nt "$o" ] || { [ -n "$newest_header" ] && [ "$newest_header" -nt "$o" ]; }; then
    "$clang" "${flags[@]}" -c "$root/$s" -o "$o"
  fi
  objects+=("$o")
done
if [ "$target" = frame ]; then
  for g in "$build"/net/*.capnp.c++; do
    o=$out/$(basename "$g").o
    if [ ! -f "$o" ] || [ "$g" -nt "$o" ]; then "$clang" "${flags[@]}" -c "$g" -o "$o"; fi
    objects+=("$o")
  done
fi
"$clang" -fsanitize=fuzzer,address "${objects[@]}" -o "$out/${target}_fuzz" "${libs[@]}"

echo "fuzz: running $out/${target}_fuzz for ${seconds}s"
# The corpus persists in the build tree between runs; a crash leaves crash-* in $out. A finding exits 1:
# libFuzzer's own default (77) is CTest's code for a skipped test here.
mkdir -p "$out/corpus_$target"
cd "$out"
exec "./${target}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" \
  -error_exitcode=1 -timeout_exitcode=1 \
  -print_final_stats=1 "corpus_$target"
