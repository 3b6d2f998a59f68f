#!/usr/bin/env bash
# The README quotes figures without their history, and the code's comments
# carry no measurements' history either: no "session N" (figures and their
# history live in docs/benchmarks.md and docs/experiments.md).
#   no_history.sh SOURCE_DIR
set -euo pipefail
cd "$1"
hits=$(grep -n -i -E '\bsessions? [0-9]+' README.md || true)
code=$(grep -rn -i -E '\bsessions? [0-9]+' --include='*.cpp' --include='*.hpp' --include='*.cu' \
         tensor kernels model data net train actors samples include || true)
if [ -n "$hits$code" ]; then
  echo "session numbers where only current facts belong:"
  printf '%s\n' "$hits" "$code" | sed '/^$/d'
  exit 1
fi
echo "ok: no history in the README or the code"
