#!/usr/bin/env bash
# docs/protocol.md's frame header table says what net/ accepts: the destination role's bound and names
# (net::role, net::roles in net/address.hpp), the frame kinds and their numbers (net::frame_kind), the
# header size, the segment limit and the handshake body limit (net/frame.hpp). Prints each disagreement.
#   tests/scripts/protocol_table.sh SOURCE_DIR
set -euo pipefail
cd "${1:?usage: protocol_table.sh SOURCE_DIR}"
doc=docs/protocol.md
bad=0
differ() { echo "$doc disagrees with net/: $1"; echo "  doc:  $2"; echo "  code: $3"; bad=$(( bad + 1 )); }
row() { grep -E "^\\| $1 \\|" "$doc" | head -n 1 || true; }
pairs() { grep -oE '[0-9]+ [a-z_]+' || true; }  # "3 shard" pairs of a table cell

# Roles: "< N (`net::role`: 0 coordinator, 1 loader, ...)" against the enum and its count.
roles=$(sed -n 's/^enum class role : uint8_t { *\(.*\) *};.*/\1/p' net/address.hpp | tr -d ' ')
count=$(sed -n 's/^constexpr int roles = \([0-9]*\);.*/\1/p' net/address.hpp)
[ -n "$roles" ] && [ -n "$count" ] || { echo "FAILED: net::role or net::roles not found in net/address.hpp"; exit 1; }
[ "$count" = "$(echo "$roles" | tr ',' '\n' | grep -c .)" ] || differ "net::roles is not the enum's size" "" "$count: $roles"
r=$(row 44)
doc_bound=$(echo "$r" | sed -n 's/.*message, message_ref: < \([0-9]*\).*/\1/p')
[ "$doc_bound" = "$count" ] || differ "the destination role's bound" "< $doc_bound" "< $count (net::roles)"
doc_roles=$(echo "$r" | pairs | awk '{print $2}' | paste -sd, -)
code_roles=$(echo "$roles" | tr ',' '\n' | awk '{print $1}' | paste -sd, -)
doc_numbers=$(echo "$r" | pairs | awk '{print $1}' | paste -sd, -)
[ "$doc_roles" = "$code_roles" ] && [ "$doc_numbers" = "$(seq -s, 0 $(( count - 1 )))" ] ||
  differ "the roles and their numbers" "$(echo "$r" | pairs | paste -sd, -)" "$code_roles from 0"

# Kinds: "1 message, 2 heartbeat, ..." against enum class frame_kind.
code_kinds=$(sed -n '/^enum class frame_kind/,/^};/s/^ *\([a-z_]*\) = \([0-9]*\),.*/\2 \1/p' net/frame.hpp | paste -sd, -)
doc_kinds=$(row 5 | pairs | paste -sd, -)
[ -n "$code_kinds" ] && [ "$doc_kinds" = "$code_kinds" ] || differ "the frame kinds" "$doc_kinds" "$code_kinds"

# Sizes and limits.
num() { sed -n "s/^constexpr [a-z0-9_:]* $1 = \\([0-9]*\\);.*/\\1/p" net/frame.hpp; }
grep -q "fixed $(num frame_header_bytes)-byte header" "$doc" || differ "the header size" "$(grep -o 'fixed [0-9]*-byte header' "$doc")" "$(num frame_header_bytes)"
row 8 | grep -q "message, message_ref: 1\\.\\.$(num max_frame_segments);" || differ "the segment limit" "$(row 8)" "1..$(num max_frame_segments)"
row 32 | grep -q "refuse, lane_offer, lane_accept: 1\\.\\.$(num max_control_body) |" || differ "the handshake body limit" "$(row 32)" "1..$(num max_control_body)"

[ "$bad" = 0 ] || { echo "FAILED: $bad disagreement(s)"; exit 1; }
echo "ok: the frame header table of $doc agrees with net/"
