#!/usr/bin/env bash
# Enforces the layering table of DESIGN.md on every #include of troupe's
# sources: a lower folder never includes a higher one, and third-party
# headers (CAF, Cap'n Proto, Asio, CUDA) stay in the folders allowed to use them.
#   scripts/check_layering.sh [ROOT]     (default: the repository)
# Prints every violation as FILE:LINE: what; exits 1 when there is one.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

# folder -> the project folders it may include (itself included).
declare -A allowed=(
  [tensor]="tensor"
  [kernels]="tensor kernels"
  [model]="tensor kernels model"
  [data]="tensor data"
  [net]="tensor net"
  [train]="tensor kernels model data net train"
  [actors]="tensor kernels model data net train actors"
  [include]="tensor kernels model data net train actors"
  [samples]=""
)
# folder -> third-party header families it must not include.
declare -A forbidden=(
  [tensor]="caf capnp kj asio cuda"
  [kernels]="caf capnp kj asio"
  [model]="caf capnp kj asio cuda"
  [data]="caf capnp kj asio cuda"
  [net]="caf cuda"
  [train]="caf cuda"
  [actors]="cuda"
  [include]="caf cuda"
  [samples]="caf capnp kj asio cuda"
)
project="tensor kernels model data net train actors samples bench tests include"

family() {  # the third-party family of an include path, or nothing
  case "$1" in
    caf/*) echo caf ;;
    capnp/*) echo capnp ;;
    kj/*) echo kj ;;
    boost/asio*|asio.hpp|asio/*) echo asio ;;
    cuda*|cublas*|thrust/*|cub/*) echo cuda ;;
  esac
}

violations=0
report() { echo "$1"; violations=$((violations + 1)); }

for folder in "${!allowed[@]}"; do
  [ -d "$folder" ] || continue
  while IFS= read -r -d '' file; do
    while IFS=: read -r line path; do
      path=${path#troupe/}
      top=${path%%/*}
      fam=$(family "$path")
      if [ -n "$fam" ]; then
        # CUDA is allowed inside kernels/cuda only.
        if [[ " ${forbidden[$folder]} " == *" $fam "* ]] || { [ "$fam" = cuda ] && [[ "$file" != kernels/cuda/* ]]; }; then
          report "$file:$line: includes <$path>: $fam headers are not allowed in $folder/ (DESIGN.md, layering)"
        fi
        continue
      fi
      [[ " $project " == *" $top "* ]] || continue  # the standard library, Eigen, toml++, ...
      if [ "$folder" = samples ]; then
        # Samples use the public API only: the one umbrella header.
        [ "$path" = troupe.hpp ] || report "$file:$line: includes \"$path\": samples/ use the public API only (#include <troupe/troupe.hpp>)"
        continue
      fi
      [ "$top" = include ] && top=include
      if [[ " ${allowed[$folder]} " != *" $top "* ]]; then
        report "$file:$line: includes \"$path\": $folder/ may include only ${allowed[$folder]} (DESIGN.md, layering)"
      fi
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]' "$file" |
             sed -E 's/^([0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]([^>"]+)[>"].*/\1:\2/')
  done < <(find "$folder" -type f \( -name '*.hpp' -o -name '*.h' -o -name '*.cpp' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) -print0)
done

if [ "$violations" -gt 0 ]; then
  echo "layering: $violations violation(s)"
  exit 1
fi
echo "layering: every include of $(echo "${!allowed[@]}" | wc -w) folders keeps the table"
