#!/usr/bin/env bash
# A program answers --help with its usage on stdout, every line at most 80
# columns, and --version with "NAME VERSION"; both exit 0 and do nothing else
# (no training, no file read).
#   program_help.sh PROGRAM VERSION
set -euo pipefail
prog=$1 version=$2
name=$(basename "$prog")
help=$("$prog" --help) || { echo "FAIL: $name --help exited with $?"; exit 1; }
head -n 1 <<<"$help" | grep -q "^usage: $name" || { echo "$help"; echo "FAIL: $name --help does not start with 'usage: $name'"; exit 1; }
wide=$(awk 'length($0) > 80 { print length($0) ": " $0 }' <<<"$help")
[ -z "$wide" ] || { echo "$wide"; echo "FAIL: $name --help has lines over 80 columns"; exit 1; }
v=$("$prog" --version) || { echo "FAIL: $name --version exited with $?"; exit 1; }
[ "$v" = "$name $version" ] || { echo "FAIL: $name --version printed '$v', expected '$name $version'"; exit 1; }
echo "ok: $name --help and --version"
