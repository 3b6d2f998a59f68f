#include "net/message.hpp"

#include "net/tensor_codec.hpp"

#include <capnp/serialize.h>
#include <kj/exception.h>

#include <omp.h>

#include <atomic>
#include <cmath>
#include <cstring>

namespace troupe::net {

const char* to_string(reject_reason r) {
  switch (r) {
    case reject_reason::malformed: return "malformed";
    case reject_reason::too_large: return "too_large";
    case reject_reason::unknown_version: return "unknown_version";
    case reject_reason::unknown_kind: return "unknown_kind";
    case reject_reason::bad_tensor: return "bad_tensor";
    case reject_reason::non_finite: return "non_finite";
    case reject_reason::wrong_shape: return "wrong_shape";
  }
  return "unknown";
}

struct message::state {
  std::unique_ptr<capnp::MallocMessageBuilder> builder;  // built in process, or
  kj::Array<capnp::word> words;                          // bytes from outside
  kj::Array<kj::ArrayPtr<const capnp::word>> segs;
  bool framed = false;  // words carry the stream framing (segment table first)
};

message message::from_builder(std::unique_ptr<capnp::MallocMessageBuilder> b) {
  auto s = std::make_shared<state>();
  auto out = b->getSegmentsForOutput();
  s->segs = kj::heapArray<kj::ArrayPtr<const capnp::word>>(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) s->segs[i] = out[i];
  s->builder = std::move(b);
  message m;
  m.state_ = std::move(s);
  return m;
}

message message::from_bytes(const void* data, std::size_t bytes) {
  auto s = std::make_shared<state>();
  s->words = kj::heapArray<capnp::word>((bytes + 7) / 8);
  std::memset(s->words.begin(), 0, s->words.size() * 8);
  if (bytes) std::memcpy(s->words.begin(), data, bytes);
  s->segs = kj::heapArray<kj::ArrayPtr<const capnp::word>>(1);
  s->segs[0] = s->words.asPtr();
  s->framed = true;
  message m;
  m.state_ = std::move(s);
  return m;
}

std::size_t message::bytes() const {
  std::size_t n = 0;
  if (state_)
    for (auto& s : state_->segs) n += s.size() * sizeof(capnp::word);
  return n;
}

bool message::framed() const { return state_ && state_->framed; }

std::unique_ptr<capnp::MallocMessageBuilder> make_builder(std::size_t payload_bytes) {
  // Headers: a few words per tensor (its pointer, shape and struct); 64 per 8 KiB is ample.
  const std::size_t words = payload_bytes / 8 + payload_bytes / 1024 + 1024;
  return std::make_unique<capnp::MallocMessageBuilder>(static_cast<unsigned>(std::min<std::size_t>(words, 1u << 28)));
}

capnp::MallocMessageBuilder* message::exclusive_builder() {
  if (!state_ || !state_->builder || state_.use_count() != 1) return nullptr;
  // The holder that let go last did so with an acquire-release decrement that
  // this fence pairs with: its reads happen before the writes that follow.
  std::atomic_thread_fence(std::memory_order_acquire);
  return state_->builder.get();
}

kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> message::segments() const {
  if (!state_) return nullptr;
  return state_->segs.asPtr();
}

uint64_t reject_counter::total() const {
  uint64_t t = 0;
  for (auto& c : counts_) t += c.load(std::memory_order_relaxed);
  return t;
}

tensor_view view(wire::Tensor::Reader r, const std::string& what) {
  if (r.getDtype() != wire::DType::F32)
    throw message_error(reject_reason::bad_tensor, what + ": unknown dtype " + std::to_string(int(r.getDtype())));
  std::vector<int64_t> dims;
  int64_t numel = 1;
  for (int64_t d : r.getShape()) {
    if (d < 0 || (d > 0 && numel > (int64_t(1) << 40) / d))
      throw message_error(reject_reason::bad_tensor, what + ": invalid dimension " + std::to_string(d));
    dims.push_back(d);
    numel *= d;
  }
  auto data = r.getData();
  if (data.size() != static_cast<std::size_t>(numel) * sizeof(float))
    throw message_error(reject_reason::bad_tensor, what + ": payload of " + std::to_string(data.size()) +
                                                       " bytes does not match shape " + shape(dims).to_string() +
                                                       " (" + std::to_string(numel * sizeof(float)) + " bytes)");
  return {shape(dims), reinterpret_cast<const float*>(data.begin())};
}

void require_shapes(capnp::List<wire::Tensor>::Reader list, const std::vector<shape>& expected,
                    const std::string& what) {
  if (list.size() != expected.size())
    throw message_error(reject_reason::wrong_shape, what + ": " + std::to_string(list.size()) + " tensors, expected " +
                                                        std::to_string(expected.size()));
  for (unsigned i = 0; i < list.size(); ++i) {
    auto dims = list[i].getShape();
    bool ok = dims.size() == expected[i].rank();
    for (unsigned j = 0; ok && j < dims.size(); ++j) ok = dims[j] == expected[i][j];
    if (!ok) {
      std::vector<int64_t> got;
      for (int64_t d : dims) got.push_back(d);
      throw message_error(reject_reason::wrong_shape, what + ": tensor " + std::to_string(i) + " has shape " +
                                                          shape(got).to_string() + ", expected " +
                                                          expected[i].to_string());
    }
  }
}

namespace {

/// Nonzero when bits[0, n) holds a NaN or Inf: the floats whose exponent bits
/// are all ones. An integer reduction over the bits vectorizes where
/// std::isfinite does not.
uint32_t non_finite_bits(const uint32_t* bits, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= static_cast<uint32_t>((bits[i] & 0x7f800000u) == 0x7f800000u);
  return bad;
}

/// Throws message_error (non_finite) when data[0, n) holds a NaN or Inf.
/// Large arrays are scanned by every kernel thread, one range each: the ranges
/// of the kernels' parallel loops (same grain), so that each thread reads
/// mostly what it wrote last, e.g. a shard's update of these parameters.
void check_finite(const float* data, int64_t n, const std::string& what) {
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(data);
  uint32_t bad = 0;
  constexpr int64_t grain = int64_t(1) << 15;  // kernels::detail::parallel_grain
#pragma omp parallel reduction(| : bad) if (n > grain)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t begin = n * t / nt, end = n * (t + 1) / nt;
    bad |= non_finite_bits(bits + begin, end - begin);
  }
  if (bad) throw message_error(reject_reason::non_finite, what + ": NaN or Inf in the payload");
}

void check_tensor(wire::Tensor::Reader r, const std::string& what, bool finite) {
  tensor_view v = view(r, what);
  if (finite) check_finite(v.data, v.numel(), what);
}

void check_list(capnp::List<wire::Tensor>::Reader l, const std::string& what, bool finite) {
  // Adjacent payloads (as troupe lays them out) are scanned as one array.
  const float* flat = flat_payload(l, what);
  if (flat && finite) {
    int64_t n = 0;
    for (auto t : l) n += view(t, what).numel();
    try {
      check_finite(flat, n, what);
      return;
    } catch (const message_error&) {
      // Name the tensor below.
    }
  }
  for (unsigned i = 0; i < l.size(); ++i) check_tensor(l[i], what + " tensor " + std::to_string(i), finite);
}

} // namespace

envelope_reader::envelope_reader(const message& m, const reader_limits& limits) : m_(m) {
  if (m.empty()) throw message_error(reject_reason::malformed, "empty message");
  if (m.bytes() > limits.max_bytes)
    throw message_error(reject_reason::too_large, "message of " + std::to_string(m.bytes()) + " bytes exceeds the " +
                                                      std::to_string(limits.max_bytes) + "-byte limit");
  capnp::ReaderOptions opts;
  // The message's own size bounds traversal: validation reads each word once
  // or twice, the receiver once more; a cyclic or amplified message stops here.
  opts.traversalLimitInWords = 4 * (m.bytes() / sizeof(capnp::word)) + 256;
  opts.nestingLimit = limits.nesting_limit;
  try {
    if (m.framed()) {
      reader_ = std::make_unique<capnp::FlatArrayMessageReader>(m.segments()[0], opts);
    } else {
      reader_ = std::make_unique<capnp::SegmentArrayMessageReader>(m.segments(), opts);
    }
    root_ = reader_->getRoot<wire::Envelope>();
    if (root_.getSchemaVersion() != wire::SCHEMA_VERSION)
      throw message_error(reject_reason::unknown_version,
                          "schema version " + std::to_string(root_.getSchemaVersion()) + ", this build speaks " +
                              std::to_string(wire::SCHEMA_VERSION));
    const bool fin = limits.check_finite;
    switch (root_.which()) {
      case wire::Envelope::BATCH: {
        auto b = root_.getBatch();
        check_tensor(b.getImages(), "batch images", fin);
        auto v = view(b.getImages(), "batch images");
        if (v.dims.rank() == 0 || v.dims[0] != static_cast<int64_t>(b.getLabels().size()))
          throw message_error(reject_reason::wrong_shape, "batch: " + std::to_string(b.getLabels().size()) +
                                                              " labels for images " + v.dims.to_string());
        break;
      }
      case wire::Envelope::PULL_PARAMS: break;
      case wire::Envelope::PARAMS: check_list(root_.getParams().getTensors(), "params", fin); break;
      case wire::Envelope::PUSH_GRADIENT: check_list(root_.getPushGradient().getTensors(), "push_gradient", fin); break;
      case wire::Envelope::ACTIVATION: check_tensor(root_.getActivation().getTensor(), "activation", fin); break;
      case wire::Envelope::GRADIENT: check_tensor(root_.getGradient().getTensor(), "gradient", fin); break;
      case wire::Envelope::CONTROL: break;
      case wire::Envelope::METRICS: break;
      default:
        throw message_error(reject_reason::unknown_kind, "unknown message kind " + std::to_string(int(root_.which())));
    }
  } catch (const kj::Exception& e) {
    std::string d = e.getDescription().cStr();
    bool big = d.find("traversal limit") != std::string::npos;
    throw message_error(big ? reject_reason::too_large : reject_reason::malformed, "malformed message: " + d);
  }
}

envelope_reader::~envelope_reader() = default;

} // namespace troupe::net
