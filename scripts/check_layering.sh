#!/usr/bin/env bash
# Enforces the layering table of DESIGN.md on every #include of troupe's
# sources: a lower folder never includes a higher one, and every third-party
# header (CAF, Cap'n Proto, Asio, OpenSSL, OpenMP, BLAS, Eigen, zlib, toml++,
# CLI11, JSON, CUDA) stays in the folders allowed to use it.
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
# third-party header family -> the folders that may include it (tests/ and bench/ may include anything).
declare -A users=(
  [caf]="actors"
  [capnp]="net train actors"
  [kj]="net train actors"
  [asio]="net"
  [boost]="net"
  [openssl]="net"
  [omp]="kernels"
  [blas]="kernels"
  [eigen]="tensor kernels"
  [zlib]="data"
  [tomlpp]="train"
  [cli11]="train"
  [json]="train"
  [cuda]="kernels/cuda"
)
project="tensor kernels model data net train actors samples bench tests include"

family() {  # the third-party family of an include path, or nothing
  case "$1" in
    caf/*) echo caf ;;
    capnp/*) echo capnp ;;
    kj/*) echo kj ;;
    boost/asio*|asio.hpp|asio/*) echo asio ;;
    boost/*) echo boost ;;
    openssl/*) echo openssl ;;
    omp.h) echo omp ;;
    cblas.h|openblas*|lapacke*) echo blas ;;
    Eigen/*|eigen3/*|unsupported/Eigen/*) echo eigen ;;
    zlib.h) echo zlib ;;
    toml++/*) echo tomlpp ;;
    CLI/*) echo cli11 ;;
    nlohmann/*) echo json ;;
    cuda*|cublas*|cudnn*|thrust/*|cub/*) echo cuda ;;
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
        ok=0
        for user in ${users[$fam]}; do [[ "$file" == "$user"/* ]] && ok=1; done
        [ "$ok" = 1 ] ||
          report "$file:$line: includes <$path>: $fam headers belong to ${users[$fam]}/ only, not $folder/ (DESIGN.md, layering)"
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
