#include "actors/shard_core.hpp"
#include "net/protocol.hpp"

#include <algorithm>
#include <cstring>
#include <ostream>

#include "actors/messages.hpp"
#include "kernels/kernels.hpp"
#include "net/tensor_codec.hpp"

namespace troupe::actors {

namespace {

[[noreturn]] void reject(net::reject_reason r, const std::string& what) { throw net::message_error(r, what); }

} // namespace

shard_core::shard_core(const train::shard_plan& p, const std::vector<named_tensor>& tensors,
                       const model::update_config& rule, model::lr_schedule schedule, int64_t total_updates,
                       const kernels::context& ctx, net::reader_limits limits)
    : p_(p), cfg_(rule), schedule_(schedule), total_updates_(total_updates), limits_(limits), stats_(rule.workers) {
  const std::string who = net::to_string(p.address);
  if (tensors.empty()) throw error(who + " holds no tensors");
  if (tensors.size() != p.range.last - p.range.first)
    throw error(who + ": " + std::to_string(tensors.size()) + " tensors for the range [" +
                std::to_string(p.range.first) + ", " + std::to_string(p.range.last) + ")");
  std::vector<float> flat;
  std::vector<shape> shapes;
  for (const auto& t : tensors) {
    names_.push_back(t.name);
    shapes.push_back(t.value.shape());
    flat.insert(flat.end(), t.value.data(), t.value.data() + t.value.numel());
  }
  n_ = static_cast<int64_t>(flat.size());
  if (p.clients.size() != static_cast<std::size_t>(rule.workers))
    throw error(who + ": " + std::to_string(p.clients.size()) + " clients for an update rule of " +
                std::to_string(rule.workers) + " workers");
  if (n_ != p.range.numel())
    throw error(who + ": " + std::to_string(n_) + " parameters for a range of " + std::to_string(p.range.numel()));
  holder_ = std::make_unique<param_holder>(p_.address, id(), p_.range, std::move(shapes), flat.data(), ctx);
  ctx_ = ctx;
  rule_ = model::make_update_rule(cfg_, n_, ctx_);
}

std::vector<named_tensor> shard_core::snapshot() const {
  std::vector<named_tensor> out;
  const float* src = holder_->values();
  for (std::size_t i = 0; i < names_.size(); ++i) {
    tensor t = tensor::empty(holder_->shapes()[i]);
    std::memcpy(t.data(), src, t.numel() * sizeof(float));
    src += t.numel();
    out.push_back({names_[i], std::move(t)});
  }
  return out;
}

std::vector<named_tensor> shard_core::rule_state() const {
  std::vector<named_tensor> out = rule_->state();
  std::sort(out.begin(), out.end(), [](const named_tensor& a, const named_tensor& b) { return a.name < b.name; });
  return out;
}

void shard_core::restore(uint64_t version, const std::vector<named_tensor>& rule_state) {
  rule_->load_state(rule_state);
  holder_->set_version(version);
  pushes_ = model::traits(cfg_.rule).synchronous ? version * static_cast<uint64_t>(cfg_.workers) : version;
}

int shard_core::worker_of(const net::address& from) const {
  const auto it = std::find(p_.clients.begin(), p_.clients.end(), from);
  return it == p_.clients.end() ? -1 : static_cast<int>(it - p_.clients.begin());
}

uint32_t shard_core::worker_index(const net::address& from, const char* what) const {
  const int w = worker_of(from);
  if (w < 0)
    reject(net::reject_reason::malformed,
           std::string(what) + " from " + net::to_string(from) + ", not one of the " + std::to_string(cfg_.workers) +
               (p_.stage >= 0 ? " pipeline replicas' stage " + std::to_string(p_.stage) : std::string(" workers")));
  return static_cast<uint32_t>(w);
}

std::vector<shard_core::reply> shard_core::on_pull(const net::envelope_reader& r, const net::address& from) {
  auto p = r.root().getPullParams();
  if (p.getShard() != id()) reject(net::reject_reason::wrong_shape, "pull for shard " + std::to_string(p.getShard()));
  if (from.role == net::role::worker || from.role == net::role::stage)
    rule_->on_send(holder_->values(), n_, static_cast<int>(worker_index(from, "pull")));
  // A hybrid's snapshot: a pipeline replica reports a mini-batch before its
  // stages have pushed it, so the pull waits for the pushes of the mini-batches it counts.
  if (p_.stage >= 0 && p.getSteps() > pushes_) {
    holder_->keep(p.getSteps(), {from, p.getWithState()});
    return {};
  }
  return {answer_pull(from, p.getWithState())};
}

shard_core::reply shard_core::answer_pull(const net::address& to, bool with_state) {
  return {to, with_state ? holder_->reply_with_state(to, rule_->state()) : holder_->reply(to)};
}

std::vector<shard_core::reply> shard_core::on_push(const net::envelope_reader& r, const net::address& from) {
  const uint32_t w = worker_index(from, "push");
  auto p = r.root().getPushGradient();
  if (p.getShard() != id()) reject(net::reject_reason::wrong_shape, "push for shard " + std::to_string(p.getShard()));
  const uint64_t version = holder_->version();
  if (p.getBaseVersion() > version)
    reject(net::reject_reason::malformed, "push: base version " + std::to_string(p.getBaseVersion()) +
                                              " is ahead of the shard's " + std::to_string(version));
  const net::flat_view g = net::view(p.getValues(), "push");
  net::require_range(g, p_.range.first, p_.range.begin, holder_->shapes(), "push to shard " + std::to_string(id()));
  const uint64_t tau = version - p.getBaseVersion();
  rule_->set_lr(model::scheduled_lr(cfg_.lr, schedule_, static_cast<int64_t>(version), total_updates_, cfg_.warmup));
  const bool updated = rule_->apply(holder_->writable(), g.data, n_, static_cast<int>(w), static_cast<int64_t>(tau));
  stats_.record(static_cast<int>(w), static_cast<int64_t>(tau));
  ++pushes_;
  if (updated) holder_->bump();
  std::vector<reply> out;
  if (!model::traits(cfg_.rule).synchronous) {
    out.push_back({from, holder_->reply(from, tau)});
  } else {
    // SSGD: every worker of the round gets the same, once-built message.
    waiting_.emplace_back(from, tau);
    if (updated) {
      net::message params = holder_->reply(from);
      for (auto& [worker, t] : waiting_) out.push_back({worker, params});
      waiting_.clear();
    }
  }
  answer_due_pulls(out);
  return out;
}

void shard_core::answer_due_pulls(std::vector<reply>& out) {
  holder_->answer_due(pushes_, [&](const param_holder::pull& k) { out.push_back(answer_pull(k.from, k.with_state)); });
}

std::vector<shard_core::reply> shard_core::handle(const net::message& m) {
  std::unique_ptr<net::envelope_reader> r;
  try {
    // Opened and validated once, with the receiver's scan: the handlers read the checked view.
    r = std::make_unique<net::envelope_reader>(m, with_scan(limits_, ctx_));
  } catch (const net::message_error& e) {
    return rejected(m, e);
  }
  const net::address from = net::read_address(r->root().getSource());
  bool push = false;
  try {
    net::require_accepted(wire::Role::SHARD, *r, "shard " + std::to_string(id()));
    switch (r->root().which()) {
      case wire::Envelope::PULL_PARAMS: return on_pull(*r, from);
      case wire::Envelope::PUSH_GRADIENT: {
        push = true;
        train::trace_span span(trace_.get(), track_, "apply");
        return on_push(*r, from);
      }
      default:  // Control: a stop ends the shard; the others are not for it
        stop_ = stop_ || r->root().getControl().getKind() == wire::Control::Kind::STOP;
        return {};
    }
  } catch (const net::message_error& e) {
    return answer_rejected(from, e.reason(), e.what(), push);
  } catch (const error& e) {  // e.g. SSGD: two gradients of one worker in a round
    return answer_rejected(from, net::reject_reason::malformed, e.what(), push);
  }
}

std::vector<shard_core::reply> shard_core::rejected(const net::message& m, const net::message_error& e) {
  // Its header may still name a worker that waits for an answer (a second, lenient look: bad messages only).
  try {
    const net::header h = net::read_header(m);
    return answer_rejected(h.source, e.reason(), e.what(), false);
  } catch (const net::message_error&) {
    rejects_.count(e.reason());
    last_error_ = e.what();
    return {};
  }
}

std::vector<shard_core::reply> shard_core::answer_rejected(const net::address& from, net::reject_reason why,
                                                           const std::string& what, bool push) {
  rejects_.count(why);
  last_error_ = what;
  // A worker still waits for an answer: the current parameters, flagged. It
  // trains on them, so they are what it holds now (DC rules: w_bak).
  const int w = worker_of(from);
  if (w < 0) return {};
  rule_->on_send(holder_->values(), n_, w);
  std::vector<reply> out{{from, holder_->reply(from, 0, true)}};
  // A rejected push counts for a snapshot that waits for it: it will not come again.
  if (push) {
    ++pushes_;
    answer_due_pulls(out);
  }
  return out;
}

void resume_shard(shard_core& shard, const train::holder_start& h, std::ostream& log) {
  const std::string fresh = "shard " + std::to_string(shard.id()) + ": the update rule's state starts fresh: ";
  if (!h.fresh.empty()) {
    log << fresh << h.fresh << "\n";
    return;
  }
  try {
    shard.restore(h.version, h.state);
    log << "shard " << shard.id() << ": resumed at version " << shard.version() << ", rule state digest " << std::hex
        << net::state_digest(shard.rule_state()) << std::dec << (h.recut.empty() ? "" : " (" + h.recut + ")") << "\n";
  } catch (const error& e) {
    log << fresh << e.what() << "\n";
  }
}

} // namespace troupe::actors
