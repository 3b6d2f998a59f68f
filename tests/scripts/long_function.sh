#!/usr/bin/env bash
# The function length check fails, naming the file, the line, the function and its length, when a
# library function is over 60 lines: a 70-line function planted in a copy of the tree (with braces in
# its strings, characters, raw string and comments, which must not end it early), then a tree of one
# file where 60 lines pass and 61 do not.
set -euo pipefail
src=$1
check=$src/scripts/check_function_length.py
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cp -r "$src"/{tensor,kernels,model,data,net,train,actors,include} "$tmp"/

# planted NAME LINES: a function of LINES lines in all, signature and closing brace included.
planted() {
  echo "int $1(int x) {"
  echo '  const char* s = "}}"; char c = '"'}'"'; const char* r = R"(} })"; // }'
  for i in $(seq 5 "$2"); do echo "  x += $i;  /* } */"; done
  echo "  return x + s[0] + c + r[0];"
  echo "}"
}
line=$(( $(wc -l < "$tmp/model/layout.cpp") + 2 ))
{ echo; planted planted_function 70; } >> "$tmp/model/layout.cpp"
if out=$(python3 "$check" "$tmp"); then
  echo "check_function_length.py passed a tree with a 70-line function"; exit 1
fi
echo "$out"
grep -qx "model/layout.cpp:$line: function planted_function is 70 lines (limit 60)" <<<"$out" ||
  { echo "the planted function is not reported as model/layout.cpp:$line, 70 lines"; exit 1; }

mkdir -p "$tmp/one/tensor"
planted at_the_limit 60 > "$tmp/one/tensor/f.cpp"
out=$(python3 "$check" "$tmp/one") || { echo "$out"; echo "a 60-line function must pass"; exit 1; }
echo "$out"
planted over_the_limit 61 >> "$tmp/one/tensor/f.cpp"
if out=$(python3 "$check" "$tmp/one"); then
  echo "check_function_length.py passed a 61-line function"; exit 1
fi
echo "$out"
grep -qx "tensor/f.cpp:61: function over_the_limit is 61 lines (limit 60)" <<<"$out"
python3 "$check" "$tmp/one" 61 > /dev/null || { echo "with a limit of 61 the function must pass"; exit 1; }
echo "ok: long functions are caught"
