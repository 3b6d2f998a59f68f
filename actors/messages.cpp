#include "actors/messages.hpp"

#include <cstring>

#include "net/tensor_codec.hpp"

#include "kernels/kernels.hpp"

#include <cmath>

namespace troupe::actors {

net::reader_limits with_scan(net::reader_limits l, const kernels::context& ctx) {
  l.finite_scan = [](const void* c, const float* data, int64_t n) {
    return kernels::all_finite(*static_cast<const kernels::context*>(c), data, n);
  };
  l.scan_context = &ctx;
  return l;
}


namespace {

[[noreturn]] void reject(net::reject_reason r, const std::string& what) { throw net::message_error(r, what); }

} // namespace

net::message make_pull(const net::address& from, const net::address& shard, bool with_state, uint64_t steps) {
  auto b = net::make_builder();
  auto p = net::init_envelope(*b, from, shard).initPullParams();
  p.setShard(shard.index);
  p.setWithState(with_state);
  p.setSteps(steps);
  return net::message::from_builder(std::move(b));
}

net::message make_control(const net::address& from, const net::address& to, wire::Control::Kind kind,
                          uint32_t amount, const std::string& detail) {
  auto b = net::make_builder(detail.size());
  auto c = net::init_envelope(*b, from, to).initControl();
  c.setKind(kind);
  c.setAmount(amount);
  c.setDetail(detail);
  return net::message::from_builder(std::move(b));
}

float* open_push(net::message& push, const net::address& from, const net::address& shard,
                 const model::shard_range& range, const std::vector<shape>& shapes) {
  capnp::MallocMessageBuilder* b = push.exclusive_builder();
  if (!b) {
    // Backward writes every gradient (model::layer::backward: written, not accumulated), cut tensors' parts are
    // copied in: a large payload need not be zero (net::written_blob).
    const std::size_t values = static_cast<std::size_t>(range.numel()) * sizeof(float);
    auto nb = net::make_builder(net::written_inline_bytes(values) + 64 * shapes.size());
    auto p = net::init_envelope(*nb, from, shard).initPushGradient();
    p.setShard(shard.index);
    std::shared_ptr<const void> keep;
    net::init_flat(*nb, p.initValues(), range.first, range.begin, shapes, keep);
    push = net::message::from_builder(std::move(nb), std::move(keep));
    b = push.exclusive_builder();
  }
  return net::payload(b->getRoot<wire::Envelope>().getPushGradient().getValues());
}

net::message make_metrics(const net::address& from, const net::address& to, const train::step_report& r) {
  auto b = net::make_builder();
  auto m = net::init_envelope(*b, from, to).initMetrics();
  m.setStep(r.step);
  m.setLoss(static_cast<float>(r.loss));
  m.setSamples(r.samples);
  m.setMeanStaleness(static_cast<float>(r.mean_staleness));
  m.setMaxStaleness(r.max_staleness);
  m.setRejected(r.rejected);
  m.setStalenessOnly(r.staleness_only);
  m.setComputeSeconds(r.compute_s);
  m.setGroup(r.group);
  return net::message::from_builder(std::move(b));
}

train::step_report read_metrics(const net::envelope_reader& r) {
  const net::address from = net::read_address(r.root().getSource());
  if (from.role != net::role::worker && from.role != net::role::stage)
    reject(net::reject_reason::malformed, "metrics from a " + net::to_string(from));
  auto m = r.root().getMetrics();
  train::step_report out;
  out.worker = from.index;  // a stage's index: plan::replica_of() makes it its replica's
  out.step = m.getStep();
  out.loss = m.getLoss();
  out.samples = m.getSamples();
  out.mean_staleness = m.getMeanStaleness();
  out.max_staleness = m.getMaxStaleness();
  out.rejected = m.getRejected();
  out.staleness_only = m.getStalenessOnly();
  out.compute_s = m.getComputeSeconds();
  out.group = m.getGroup();
  if (!std::isfinite(out.loss) || !std::isfinite(out.mean_staleness) || !std::isfinite(out.compute_s))
    reject(net::reject_reason::non_finite, "metrics: non-finite loss, staleness or compute time");
  if (out.compute_s < 0) reject(net::reject_reason::malformed, "metrics: negative compute time");
  return out;
}

net::message make_params(const net::address& from, const net::address& to, const held_params& h) {
  int64_t n = 0;
  for (const shape& d : *h.shapes) n += d.numel();
  const std::size_t values = static_cast<std::size_t>(n) * sizeof(float);
  auto b = net::make_builder(net::written_inline_bytes(values) + 64 * h.shapes->size());
  auto p = net::init_envelope(*b, from, to).initParams();
  p.setShard(h.shard);
  p.setVersion(h.version);
  std::shared_ptr<const void> keep;  // a large payload: external, written whole below
  float* dst = net::init_flat(*b, p.initValues(), h.first, h.offset, *h.shapes, keep);
  if (n > 0) std::memcpy(dst, h.values, values);
  if (h.state && !h.state->empty())
    net::encode(*h.state, p.initRuleState(static_cast<unsigned>(h.state->size())));
  return net::message::from_builder(std::move(b), std::move(keep));
}

net::message make_snapshot(const net::address& from, const net::address& to, const snapshot_request& s) {
  auto b = net::make_builder();
  auto m = net::init_envelope(*b, from, to).initSnapshot();
  m.setEpoch(s.epoch);
  m.setEpochsDone(s.epochs_done);
  m.setSteps(s.steps);
  m.setEvaluate(s.evaluate);
  m.setCheckpoint(s.checkpoint);
  m.setPeriodic(s.periodic);
  m.setEpochSamples(s.epoch_samples);
  return net::message::from_builder(std::move(b));
}

snapshot_request read_snapshot(const net::envelope_reader& r) {
  auto m = r.root().getSnapshot();
  return {m.getEpoch(), m.getEpochsDone(), m.getSteps(), m.getEvaluate(), m.getCheckpoint(), m.getPeriodic(),
          m.getEpochSamples()};
}

net::message make_evaluation(const net::address& from, const net::address& to, const evaluation_result& e) {
  auto b = net::make_builder();
  auto m = net::init_envelope(*b, from, to).initEvaluation();
  m.setEpoch(e.epoch);
  m.setTestAccuracy(e.test_accuracy);
  m.setValidationAccuracy(e.validation_accuracy);
  m.setTestLoss(e.test_loss);
  m.setValidationLoss(e.validation_loss);
  if (!e.sample.empty()) m.setSample(capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(e.sample.data()), e.sample.size()));
  m.setCheckpointed(e.checkpointed);
  m.setPeriodic(e.periodic);
  return net::message::from_builder(std::move(b));
}

evaluation_result read_evaluation(const net::envelope_reader& r) {
  auto m = r.root().getEvaluation();
  evaluation_result e;
  e.epoch = m.getEpoch();
  e.test_accuracy = m.getTestAccuracy();
  e.checkpointed = m.getCheckpointed();
  e.periodic = m.getPeriodic();
  e.validation_accuracy = m.getValidationAccuracy();
  e.test_loss = m.getTestLoss();
  e.validation_loss = m.getValidationLoss();
  const auto sample = m.getSample();
  e.sample.assign(reinterpret_cast<const char*>(sample.begin()), sample.size());
  return e;
}

} // namespace troupe::actors
