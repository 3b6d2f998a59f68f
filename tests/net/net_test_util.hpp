#pragma once

// Helpers of the net/ tests: tensor messages with a checkable pattern, free
// loopback ports, and waiting for a condition with a deadline.

#include <boost/asio.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "net/message.hpp"

namespace troupe::testing {

/// An Activation envelope whose tensor holds `bytes` bytes (a multiple of 4)
/// of a pattern derived from `seed`.
inline net::message tensor_message(const net::address& source, const net::address& destination, std::size_t bytes,
                                   uint32_t seed) {
  auto b = net::make_builder(bytes);
  auto env = net::init_envelope(*b, source, destination);
  auto a = env.initActivation();
  a.setMicroBatch(seed);
  auto t = a.initTensor();
  t.setDtype(wire::DType::F32);
  t.initShape(1).set(0, static_cast<int64_t>(bytes / 4));
  auto data = t.initData(static_cast<unsigned>(bytes));
  float* f = reinterpret_cast<float*>(data.begin());
  for (std::size_t i = 0; i < bytes / 4; ++i) f[i] = static_cast<float>((i * 2654435761u + seed) % 100003);
  return net::message::from_builder(std::move(b));
}

/// Whether `m` is a tensor_message() of `bytes` bytes made with its micro-batch
/// as seed, read and validated by net::envelope_reader, its payload intact.
inline bool tensor_message_intact(const net::message& m, std::size_t bytes) {
  net::envelope_reader r(m, net::peer_limits());
  if (r.root().which() != wire::Envelope::ACTIVATION) return false;
  auto a = r.root().getActivation();
  auto v = net::view(a.getTensor(), "test");
  if (static_cast<std::size_t>(v.numel()) * 4 != bytes) return false;
  const uint32_t seed = static_cast<uint32_t>(a.getMicroBatch());
  for (std::size_t i = 0; i < bytes / 4; ++i)
    if (v.data[i] != static_cast<float>((i * 2654435761u + seed) % 100003)) return false;
  return true;
}

/// `n` loopback ports that were free a moment ago.
inline std::vector<uint16_t> free_ports(std::size_t n) {
  boost::asio::io_context io;
  std::vector<boost::asio::ip::tcp::acceptor> held;
  std::vector<uint16_t> ports;
  for (std::size_t i = 0; i < n; ++i) {
    held.emplace_back(io, boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
    ports.push_back(held.back().local_endpoint().port());
  }
  return ports;
}

/// Polls `done` until it holds or `timeout` passes; returns whether it held.
inline bool wait_until(const std::function<bool()>& done,
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

} // namespace troupe::testing
