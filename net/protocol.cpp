#include "net/protocol.hpp"

#include <algorithm>
#include <cstdint>

namespace troupe::net {

namespace {

/// Throws message_error (non_finite) when data[0, n) holds a NaN or Inf:
/// with the receiver's scan (its kernel threads) when it gave one.
void check_finite(const float* data, int64_t n, const std::string& what, const reader_limits& l) {
  bool finite = true;
  if (l.finite_scan) {
    finite = l.finite_scan(l.scan_context, data, n);
  } else {
    // The floats whose exponent bits are all ones, by blocks: an integer
    // reduction over the bits vectorizes where std::isfinite does not.
    const auto* bits = reinterpret_cast<const uint32_t*>(data);
    for (int64_t b = 0; b < n && finite; b += 4096) {
      uint32_t bad = 0;
      for (int64_t i = b, e = std::min<int64_t>(n, b + 4096); i < e; ++i)
        bad |= static_cast<uint32_t>((bits[i] & 0x7f800000u) == 0x7f800000u);
      finite = bad == 0;
    }
  }
  if (!finite) throw message_error(reject_reason::non_finite, what + ": NaN or Inf in the payload");
}

void check_tensor(wire::Tensor::Reader r, const std::string& what, const reader_limits& l) {
  tensor_view v = view(r, what);
  if (l.check_finite) check_finite(v.data, v.numel(), what, l);
}

void check_flat(wire::FlatTensors::Reader r, const std::string& what, const reader_limits& l) {
  flat_view v = view(r, what);
  if (l.check_finite) check_finite(v.data, v.numel, what, l);
}

/// Images (or windows of tokens) and one label per image (per token).
void validate_batch(wire::Envelope::Reader root, const reader_limits& l) {
  auto b = root.getBatch();
  check_tensor(b.getImages(), "batch images", l);
  auto v = view(b.getImages(), "batch images");
  if (labels_per_row(v.dims, b.getLabels().size()) == 0)
    throw message_error(reject_reason::wrong_shape,
                        "batch: " + std::to_string(b.getLabels().size()) + " labels for images " + v.dims.to_string());
}

void validate_params(wire::Envelope::Reader root, const reader_limits& l) {
  auto p = root.getParams();
  check_flat(p.getValues(), "params", l);
  for (auto t : p.getRuleState()) {
    (void)t.getName();  // a Text: its bounds and NUL are checked here, not in the receiver
    check_tensor(t.getTensor(), "params rule state", l);
  }
}

/// A tensor and, when any, one label per row (per position of a sequence).
void validate_activation(wire::Envelope::Reader root, const reader_limits& l) {
  auto a = root.getActivation();
  check_tensor(a.getTensor(), "activation", l);
  auto v = view(a.getTensor(), "activation");
  const std::size_t labels = a.getLabels().size();
  if (labels != 0 && labels_per_row(v.dims, labels) == 0)
    throw message_error(reject_reason::wrong_shape,
                        "activation: " + std::to_string(labels) + " labels for " + v.dims.to_string());
}

void validate_push(wire::Envelope::Reader root, const reader_limits& l) {
  check_flat(root.getPushGradient().getValues(), "push_gradient", l);
}
void validate_gradient(wire::Envelope::Reader root, const reader_limits& l) {
  check_tensor(root.getGradient().getTensor(), "gradient", l);
}
// Every pointer a receiver follows is followed here once, so that a bad one is
// a message_error now and not a kj::Exception in the receiver.
void validate_pull(wire::Envelope::Reader root, const reader_limits&) { (void)root.getPullParams(); }
void validate_control(wire::Envelope::Reader root, const reader_limits&) { (void)root.getControl().getDetail(); }
void validate_metrics(wire::Envelope::Reader root, const reader_limits&) { (void)root.getMetrics(); }
void validate_snapshot(wire::Envelope::Reader root, const reader_limits&) { (void)root.getSnapshot(); }
void validate_evaluation(wire::Envelope::Reader root, const reader_limits&) { (void)root.getEvaluation(); }

void validate_regroup(wire::Envelope::Reader root, const reader_limits&) {
  auto g = root.getRegroup();
  if (g.getPhase() > 2) throw message_error(reject_reason::malformed, "regroup: unknown phase");
  (void)g.getMembers();
  (void)g.getJoiners();
}

/// A payload of whole elements; float32 ones finite.
void validate_collective(wire::Envelope::Reader root, const reader_limits& l) {
  auto c = root.getCollective();
  const auto data = c.getPayload();
  const std::size_t element = c.getBf16() ? 2 : 4;
  if (data.size() % element != 0)
    throw message_error(reject_reason::bad_tensor, "collective: a payload of " + std::to_string(data.size()) +
                                                       " bytes is not whole " + std::to_string(element) +
                                                       "-byte elements");
  if (c.getKind() > 2) throw message_error(reject_reason::malformed, "collective: unknown operation kind");
  if (!c.getBf16() && l.check_finite)
    check_finite(reinterpret_cast<const float*>(data.begin()), static_cast<int64_t>(data.size() / 4), "collective", l);
}

} // namespace

const std::vector<kind_info>& protocol_table() {
  using w = wire::Envelope;
  using r = wire::Role;
  static const std::vector<kind_info> table{
      {w::BATCH, "Batch", {r::WORKER, r::STAGE}, validate_batch},
      {w::PULL_PARAMS, "PullParams", {r::SHARD, r::STAGE, r::WORKER}, validate_pull},
      {w::PARAMS, "Params", {r::WORKER, r::STAGE, r::EVALUATOR}, validate_params},
      {w::PUSH_GRADIENT, "PushGradient", {r::SHARD}, validate_push},
      {w::ACTIVATION, "Activation", {r::STAGE}, validate_activation},
      {w::GRADIENT, "Gradient", {r::STAGE}, validate_gradient},
      {w::CONTROL,
       "Control",
       {r::COORDINATOR, r::LOADER, r::WORKER, r::SHARD, r::STAGE, r::EVALUATOR, r::NODE},
       validate_control},
      {w::METRICS, "Metrics", {r::COORDINATOR}, validate_metrics},
      {w::SNAPSHOT, "Snapshot", {r::EVALUATOR}, validate_snapshot},
      {w::EVALUATION, "Evaluation", {r::COORDINATOR}, validate_evaluation},
      {w::COLLECTIVE, "Collective", {r::WORKER, r::STAGE}, validate_collective},
      {w::REGROUP, "Regroup", {r::WORKER, r::COORDINATOR}, validate_regroup},
  };
  return table;
}

const kind_info& kind_of(wire::Envelope::Which k) {
  for (const kind_info& i : protocol_table())
    if (i.kind == k) return i;
  throw message_error(reject_reason::unknown_kind, "unknown message kind " + std::to_string(static_cast<int>(k)));
}

const char* role_name(wire::Role r) {
  switch (r) {
    case wire::Role::COORDINATOR: return "coordinator";
    case wire::Role::LOADER: return "loader";
    case wire::Role::WORKER: return "worker";
    case wire::Role::SHARD: return "shard";
    case wire::Role::STAGE: return "stage";
    case wire::Role::EVALUATOR: return "evaluator";
    case wire::Role::NODE: return "node";
  }
  return "unknown role";
}

bool accepts(wire::Role r, wire::Envelope::Which k) {
  for (const kind_info& i : protocol_table())
    if (i.kind == k)
      for (wire::Role a : i.accepted_by)
        if (a == r) return true;
  return false;
}

void require_accepted(wire::Role r, const envelope_reader& m, const std::string& receiver) {
  const wire::Envelope::Which k = m.root().which();
  if (!accepts(r, k))
    throw message_error(reject_reason::unknown_kind,
                        receiver + ": a " + kind_of(k).name + " is not for a " + role_name(r));
}

std::string protocol_markdown() {
  const std::vector<wire::Role> roles{wire::Role::COORDINATOR, wire::Role::NODE,  wire::Role::LOADER,
                                      wire::Role::WORKER,      wire::Role::SHARD, wire::Role::STAGE,
                                      wire::Role::EVALUATOR};
  std::string head = "| message |", rule = "|---|";
  for (wire::Role r : roles) {
    head += std::string(" ") + role_name(r) + " |";
    rule += ":-:|";
  }
  std::string out = head + "\n" + rule + "\n";
  for (const kind_info& i : protocol_table()) {
    out += std::string("| `") + i.name + "` |";
    for (wire::Role r : roles) out += accepts(r, i.kind) ? " x |" : "   |";
    out += "\n";
  }
  return out;
}

} // namespace troupe::net
