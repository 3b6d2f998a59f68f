#!/usr/bin/env bash
# Every program that a script, a test script or a README command runs comes from a minimal Debian 12
# (debootstrap minbase: the packages of priority "required") or from scripts/setup.sh:
#   * the README's commands and the user's scripts (local_cluster.sh, setup.sh): `scripts/setup.sh`'s own list;
#   * the test scripts (tests/scripts/, scripts/test.sh, scripts/fuzz.sh, scripts/troupe.sbatch):
#     that list or `scripts/setup.sh --test`'s;
# and what only the tests need (Slurm, munge, clang and its fuzzer runtime) is not in the first list.
# A program is a word in a command's position (the start of a line, after | && || ; $( then do ! exec
# timeout env) that names an executable on PATH; dpkg says its package. Prints each program missing.
#   tests/scripts/setup_packages.sh SOURCE_DIR
set -euo pipefail
cd "${1:?usage: setup_packages.sh SOURCE_DIR}"
command -v dpkg-query > /dev/null || { echo "skipped: no dpkg here (not Debian)"; exit 77; }
main=" $(scripts/setup.sh --list | tr '\n' ' ') "
test=" $(scripts/setup.sh --list --test | tr '\n' ' ') "
bad=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# The command words of shell text on stdin (comments and here-documents' text are read too: harmless, a
# word must still name an installed program).
commands() {
  sed -e 's/\(^\|[[:space:]]\)#.*$//' |
    sed -E 's/(\|\||&&|[|;]|\$\(|`|\{ |\bthen\b|\bdo\b|\belse\b|^[[:space:]]*!|\bexec\b|\bif\b|\bwhile\b|\buntil\b)/\n/g' |
    sed -E 's/^[[:space:]]*(! )?//; s/^(env( -[a-z]+)* )?//; s/^([A-Za-z_][A-Za-z0-9_]*=[^[:space:]]* )*//;
            s/^timeout( -[a-z]+ [0-9]+)* [0-9]+ //; s/^sudo //' |
    awk '{ print $1 }' | grep -E '^[a-z][a-z0-9+._-]*$' | sort -u
}
# Installed packages that a list needs: the list and, recursively, what they depend on (Depends, Pre-Depends).
closure() {
  dpkg-query -W -f='${Package} ${Pre-Depends}, ${Depends}\n' 2> /dev/null |
    awk -v roots="$1" '
      { deps[$1] = $0 }
      END {
        n = split(roots, q, " "); for (i = 1; i <= n; i++) seen[q[i]] = 1
        for (i = 1; i <= n; i++) {
          d = deps[q[i]]; sub(/^[^ ]+ /, "", d); m = split(d, alt, /[,|]/)
          for (j = 1; j <= m; j++) {
            p = alt[j]; sub(/^ +/, "", p); sub(/[ :(].*$/, "", p)
            if (p != "" && (p in deps) && !(p in seen)) { seen[p] = 1; q[++n] = p }
          }
        }
        for (p in seen) printf " %s", p; print " "
      }'
}
main_all=$(closure "$main"); test_all=$(closure "$test")

# SCOPE TAB WHAT TAB PROGRAM for every command word of the files. (scripts/setup.sh runs apt-get and dpkg
# only; its package lists are not commands.)
{
  awk '/^```(sh|bash)$/ { f = 1; next } /^```/ { f = 0 } f' README.md | commands | sed 's/^/main\tREADME.md\t/'
  commands < scripts/local_cluster.sh | sed 's/^/main\tscripts\/local_cluster.sh\t/'
  for f in tests/scripts/*.sh scripts/test.sh scripts/fuzz.sh scripts/troupe.sbatch .ci/run; do
    commands < "$f" | sed "s|^|test\t$f\t|"
  done
} > "$tmp/uses0"
# The README's Slurm commands run on the user's cluster, whose Slurm is not this project's to install.
grep -vE "^main	README.md	(srun|sbatch|scontrol)\$" "$tmp/uses0" > "$tmp/uses" || true
# PROGRAM TAB FILE for the programs on PATH, then one dpkg -S for all of them.
for prog in $(cut -f 3 "$tmp/uses" | sort -u); do
  [ "$(type -t "$prog")" = file ] || continue
  p=$(type -P "$prog"); r=$(realpath "$p")
  for f in "$r" "$p" "/usr/bin/$prog" "/bin/$prog" "/usr/sbin/$prog" "/sbin/$prog"; do printf '%s\t%s\n' "$prog" "$f"; done
done | sort -u > "$tmp/paths"
cut -f 2 "$tmp/paths" | xargs -r dpkg -S 2> /dev/null | grep -v '^diversion' | sed 's/, [^:]*:/:/' > "$tmp/owners" || true
# PROGRAM TAB PACKAGE
awk -F '\t' 'NR == FNR { split($0, a, ": "); sub(/:.*/, "", a[1]); owner[a[2]] = a[1]; next }
             ($2 in owner) && !($1 in pkg) { pkg[$1] = owner[$2]; print $1 "\t" owner[$2] }' "$tmp/owners" "$tmp/paths" > "$tmp/pkgs"
while IFS=$'\t' read -r scope what prog; do
  pkg=$(awk -F '\t' -v p="$prog" '$1 == p { print $2 }' "$tmp/pkgs")
  [ -n "$pkg" ] || continue
  prio=$(dpkg-query -W -f='${Priority}' "$pkg" 2> /dev/null || true)
  [ "$prio" = required ] && continue
  if [ "$scope" = main ]; then have=$main_all; list="scripts/setup.sh's list"; else have=$test_all; list="scripts/setup.sh --test's list"; fi
  [[ "$have" == *" $pkg "* ]] || { echo "$what runs $prog ($pkg, priority $prio): neither in $list nor needed by it"; bad=$(( bad + 1 )); }
done < "$tmp/uses"
# Python helpers the README runs: gnuplot for bench/trace_timeline.py.
if grep -q gnuplot bench/trace_timeline.py && [[ "$main_all" != *" gnuplot-nox "* ]]; then
  echo "bench/trace_timeline.py runs gnuplot: not in scripts/setup.sh's list"; bad=$(( bad + 1 ))
fi
# Test-only packages stay out of the user's first command.
for pkg in slurm-wlm munge clang libclang-rt-14-dev; do
  [[ "$main" != *" $pkg "* ]] || { echo "$pkg (tests only) is in scripts/setup.sh's own list"; bad=$(( bad + 1 )); }
  [[ "$test" == *" $pkg "* ]] || { echo "$pkg is not in scripts/setup.sh --test's list"; bad=$(( bad + 1 )); }
done
[ "$bad" = 0 ] || { echo "FAILED: $bad program(s) or package(s) out of place"; exit 1; }
echo "ok: every program the scripts, tests and README run is in minbase or scripts/setup.sh"
