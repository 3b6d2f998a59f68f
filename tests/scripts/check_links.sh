#!/usr/bin/env bash
# Every relative link of README.md and docs/*.md leads to a file inside the repository:
#   * markdown links [text](path), [text](path#anchor), [text](#anchor) and reference definitions
#     [name]: path (http(s) and mailto links are not checked): the path, relative to the document,
#     must be an existing file or folder inside the repository; an anchor must be a heading of the
#     target document (GitHub's slug: lower case, punctuation dropped, spaces as hyphens);
#   * paths quoted as code (`samples/trainer.cpp`) whose first folder is one of the repository's
#     top-level folders (build/ excepted: it is made, not kept) must exist too.
# Fenced code blocks are not read. Prints each dead link as FILE:LINE: TARGET (why) and fails.
#   tests/scripts/check_links.sh SOURCE_DIR [FILE.md...]     (default: README.md docs/*.md)
#   tests/scripts/check_links.sh --self-test                 (fails on planted dead links, passes good ones)
set -euo pipefail
if [ "${1:-}" = --self-test ]; then
  t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
  mkdir -p "$t/repo/docs" "$t/repo/samples" "$t/repo/build"
  touch "$t/outside.md" "$t/repo/samples/here.cpp"
  printf '# Title\n\n## A section: (with) `code`\n\n[ok](#a-section-with-code) [ok](../samples/here.cpp)\n' > "$t/repo/docs/a.md"
  cat > "$t/repo/README.md" <<'MD'
# R
[good](docs/a.md) [good](docs/a.md#a-section-with-code) `samples/here.cpp` `build/made_here` [web](https://x.org/y)
[dead](docs/missing.md) and [dead anchor](docs/a.md#no-such-section) and [outside](../outside.md)
`samples/gone.cpp` is quoted, [ref]: docs/gone.md
[ref2]: docs/gone_too.md
```
[in a fence](not/checked.md) `samples/not_checked.cpp`
```
MD
  status=0; "$0" "$t/repo" > "$t/out" 2>&1 || status=$?
  cat "$t/out"
  [ "$status" = 1 ] || { echo "FAILED: exit status $status on dead links, not 1"; exit 1; }
  want="README.md:3: docs/missing.md (no such file)
README.md:3: docs/a.md#no-such-section (no heading '#no-such-section' in docs/a.md)
README.md:3: ../outside.md (outside the repository: $(cd "$t" && pwd -P)/outside.md)
README.md:4: \`samples/gone.cpp\` (no such file in the repository)
README.md:5: docs/gone_too.md (no such file)
FAILED: 5 dead link(s) of 10 in README.md docs/a.md"
  [ "$(cat "$t/out")" = "$want" ] || { echo "FAILED: the report is not the expected one:"; echo "$want"; exit 1; }
  echo "ok: check_links finds the planted dead links"
  exit 0
fi
root=$(cd "${1:?usage: check_links.sh SOURCE_DIR [FILE.md...]}" && pwd -P)
shift
cd "$root"
if [ $# -gt 0 ]; then files=("$@"); else files=(README.md docs/*.md); fi

# FILE TAB LINE TAB KIND TAB TARGET for every link (KIND link) and code span (KIND code) outside fences.
extract() {
  awk '
    /^[ \t]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    {
      line = $0
      while (match(line, /`[^`]+`/)) {
        print FILENAME "\t" FNR "\tcode\t" substr(line, RSTART + 1, RLENGTH - 2)
        line = substr(line, 1, RSTART - 1) " " substr(line, RSTART + RLENGTH)
      }
      if (match(line, /^ ? ? ?\[[^]]+\]:[ \t]*[^ \t]+/)) {
        t = substr(line, RSTART, RLENGTH); sub(/^[^]]*\]:[ \t]*/, "", t)
        print FILENAME "\t" FNR "\tlink\t" t
      }
      while (match(line, /\]\([^)]*\)/)) {
        t = substr(line, RSTART + 2, RLENGTH - 3); sub(/^[ \t]*/, "", t); sub(/[ \t].*$/, "", t)
        gsub(/^<|>$/, "", t)
        print FILENAME "\t" FNR "\tlink\t" t
        line = substr(line, RSTART + RLENGTH)
      }
    }' "$@"
}

# The anchors of a markdown file's headings, one a line (duplicates get -1, -2, ... as on GitHub).
anchors() {
  awk '
    /^[ \t]*(```|~~~)/ { fence = !fence; next }
    fence || !/^#+[ \t]/ { next }
    {
      h = $0; sub(/^#+[ \t]+/, "", h); sub(/[ \t]+#+[ \t]*$/, "", h); sub(/[ \t]+$/, "", h)
      h = tolower(h); gsub(/[^a-z0-9 _-]/, "", h); gsub(/ /, "-", h)
      if (h in seen) { seen[h]++; print h "-" seen[h] } else { seen[h] = 0; print h }
    }' "$1"
}

top=" $(find . -mindepth 1 -maxdepth 1 -type d ! -name '.*' ! -name build -printf '%f ') "
dead=0 checked=0
report() { echo "$1:$2: $3 ($4)"; dead=$(( dead + 1 )); }
while IFS=$'\t' read -r file line kind target; do
  [ -n "$target" ] || continue
  if [ "$kind" = code ]; then
    [[ "$target" =~ ^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+/?$ ]] || continue
    [[ "$top" == *" ${target%%/*} "* ]] || continue
    checked=$(( checked + 1 ))
    [ -e "$target" ] || [ -e "$(dirname "$file")/$target" ] || report "$file" "$line" "\`$target\`" "no such file in the repository"
    continue
  fi
  case "$target" in http://*|https://*|mailto:*) continue ;; esac
  checked=$(( checked + 1 ))
  path=${target%%#*}
  anchor=; [[ "$target" == *"#"* ]] && anchor=${target#*#}
  if [ -z "$path" ]; then dest=$file; else dest=$(dirname "$file")/$path; fi
  if [ ! -e "$dest" ]; then report "$file" "$line" "$target" "no such file"; continue; fi
  real=$(realpath "$dest")
  case "$real/" in "$root"/*) ;; *) report "$file" "$line" "$target" "outside the repository: $real"; continue ;; esac
  if [ -n "$anchor" ]; then
    if [ ! -f "$dest" ] || [[ "$dest" != *.md ]]; then report "$file" "$line" "$target" "an anchor into a file that is not markdown"
    elif ! anchors "$dest" | grep -qxF -- "$anchor"; then report "$file" "$line" "$target" "no heading '#$anchor' in $path"; fi
  fi
done < <(extract "${files[@]}")

if [ "$dead" -gt 0 ]; then echo "FAILED: $dead dead link(s) of $checked in ${files[*]}"; exit 1; fi
echo "ok: $checked relative links and paths in ${#files[@]} files lead inside the repository"
