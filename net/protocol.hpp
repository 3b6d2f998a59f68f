#pragma once

// The protocol's message kinds, declared once (net/protocol.cpp's table): each
// kind's name, how envelope_reader validates it, and the roles that accept it.
// Every role checks an opened message against the table once, in its actor
// shell (accepted/require_accepted); docs/protocol.md's table of who accepts
// what is generated from it (protocol_markdown(), compared by a test). A new
// kind is its schema member, its row here and the role that takes it.

#include <string>
#include <vector>

#include "net/message.hpp"

namespace troupe::net {

struct kind_info {
  wire::Envelope::Which kind;
  const char* name;                     ///< the schema's struct: "PushGradient"
  std::vector<wire::Role> accepted_by;  ///< the roles that take it
  /// Follows every pointer of the kind once and checks its tensors (shape,
  /// payload size, finite values as `limits` say); throws message_error.
  void (*validate)(wire::Envelope::Reader root, const reader_limits& limits);
};

/// Every kind, in the schema's order.
const std::vector<kind_info>& protocol_table();
/// The row of `k`; throws message_error (unknown_kind) for a kind this build does not know.
const kind_info& kind_of(wire::Envelope::Which k);
/// "coordinator", "loader", "worker", "shard", "stage", "evaluator", "node".
const char* role_name(wire::Role r);
/// True when role `r` takes messages of kind `k`.
bool accepts(wire::Role r, wire::Envelope::Which k);
/// Throws message_error (unknown_kind) naming `receiver` unless its role takes `m`'s kind.
void require_accepted(wire::Role r, const envelope_reader& m, const std::string& receiver);
/// docs/protocol.md's table "which role accepts which kind", as markdown.
std::string protocol_markdown();

} // namespace troupe::net
