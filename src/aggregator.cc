#include "src/aggregator.h"

#include "base/errors.h"
#include "base/wire.h"

namespace qccl {

namespace {
constexpr size_t kMaxFrame = 1 << 20;
constexpr int32_t kMaxAggregatorRanks = 1 << 20;  // the transport's (its tag layout's) limit
constexpr size_t kMaxAddress = 64 * 1024;

void check_preamble(ByteReader& r, const std::string& from, const char* what) {
  const uint32_t magic = r.get<uint32_t>();
  const uint16_t version = r.get<uint16_t>();
  if (magic != kAggregatorMagic || version != kAggregatorVersion)
    fail(qcclRemoteError, "%s sent a %s with magic 0x%08x version %u (expected 0x%08x version %u): not a qccl "
         "aggregator, or another version", from.c_str(), what, magic, version, kAggregatorMagic, kAggregatorVersion);
}
}  // namespace

std::vector<uint8_t> AggregatorHello::serialize() const {
  ByteWriter w;
  w.put<uint32_t>(kAggregatorMagic);
  w.put<uint16_t>(kAggregatorVersion);
  w.put<uint64_t>(job);
  w.put<int32_t>(rank);
  w.put<int32_t>(nranks);
  w.put<int32_t>(index);
  w.put<uint64_t>(max_message);
  w.put_bytes(address.data(), address.size());
  return w.bytes();
}

AggregatorHello AggregatorHello::parse(const std::vector<uint8_t>& bytes, const std::string& from) {
  ByteReader r(bytes.data(), bytes.size(), "aggregator hello");
  check_preamble(r, from, "hello");
  AggregatorHello h;
  h.job = r.get<uint64_t>();
  h.rank = r.get<int32_t>();
  h.nranks = r.get<int32_t>();
  h.index = r.get<int32_t>();
  h.max_message = r.get<uint64_t>();
  h.address = r.get_bytes(kMaxAddress);
  if (h.nranks < 1 || h.nranks > kMaxAggregatorRanks || h.rank < 0 || h.rank >= h.nranks || h.index < 0 ||
      h.address.empty())
    fail(qcclRemoteError, "%s sent a hello with rank %d of %d, index %d, a %zu-byte address", from.c_str(), h.rank,
         h.nranks, h.index, h.address.size());
  return h;
}

std::vector<uint8_t> AggregatorReply::serialize() const {
  ByteWriter w;
  w.put<uint32_t>(kAggregatorMagic);
  w.put<uint16_t>(kAggregatorVersion);
  w.put<int32_t>(status);
  w.put_string(message);
  w.put_bytes(address.data(), address.size());
  return w.bytes();
}

AggregatorReply AggregatorReply::parse(const std::vector<uint8_t>& bytes, const std::string& from) {
  ByteReader r(bytes.data(), bytes.size(), "aggregator reply");
  check_preamble(r, from, "reply");
  AggregatorReply a;
  a.status = r.get<int32_t>();
  a.message = r.get_string(4096);
  a.address = r.get_bytes(kMaxAddress);
  return a;
}

void send_frame(net::Socket& socket, const std::vector<uint8_t>& bytes, const net::Deadline& deadline) {
  ByteWriter w;
  w.put<uint32_t>(static_cast<uint32_t>(bytes.size()));
  socket.send_all(w.bytes().data(), w.bytes().size(), deadline);
  socket.send_all(bytes.data(), bytes.size(), deadline);
}

std::vector<uint8_t> recv_frame(net::Socket& socket, const net::Deadline& deadline, const std::string& from) {
  uint8_t prefix[4];
  socket.recv_all(prefix, sizeof(prefix), deadline);
  ByteReader r(prefix, sizeof(prefix), "frame length");
  const uint32_t n = r.get<uint32_t>();
  if (n > kMaxFrame) fail(qcclRemoteError, "%s sent a frame of %u bytes (at most %zu)", from.c_str(), n, kMaxFrame);
  std::vector<uint8_t> bytes(n);
  socket.recv_all(bytes.data(), n, deadline);
  return bytes;
}

bool take_frame(std::vector<uint8_t>& buffer, std::vector<uint8_t>* frame, const std::string& from) {
  if (buffer.size() < 4) return false;
  ByteReader r(buffer.data(), 4, "frame length");
  const uint32_t n = r.get<uint32_t>();
  if (n > kMaxFrame) fail(qcclRemoteError, "%s sent a frame of %u bytes (at most %zu)", from.c_str(), n, kMaxFrame);
  if (buffer.size() < 4 + size_t{n}) return false;
  frame->assign(buffer.begin() + 4, buffer.begin() + 4 + n);
  buffer.erase(buffer.begin(), buffer.begin() + 4 + n);
  return true;
}

std::vector<net::Address> parse_aggregator_list(const std::string& text) {
  std::vector<net::Address> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = text.find(',', at);
    const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (item.empty()) fail(qcclInvalidArgument, "QCCL_AGGREGATORS = '%s' has an empty entry", text.c_str());
    out.push_back(net::Address::parse(item, "QCCL_AGGREGATORS"));
    for (size_t k = 0; k + 1 < out.size(); ++k)  // the two would be one aggregator, told two indexes
      if (out[k].to_string() == out.back().to_string())
        fail(qcclInvalidArgument, "QCCL_AGGREGATORS = '%s' names %s twice", text.c_str(), item.c_str());
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

std::vector<AggregatorLink> register_with_aggregators(const std::string& list, const AggregatorHello& hello,
                                                      const net::Deadline& deadline) {
  const std::vector<net::Address> addresses = parse_aggregator_list(list);
  std::vector<AggregatorLink> links(addresses.size());
  // Hellos to all first, then the replies: an aggregator answers only when every rank has said hello.
  for (size_t k = 0; k < addresses.size(); ++k) {
    AggregatorLink& link = links[k];
    link.name = "aggregator " + std::to_string(k) + " (" + addresses[k].to_string() + ")";
    link.socket = net::Socket::connect(addresses[k], deadline);
    AggregatorHello mine = hello;
    mine.index = static_cast<int32_t>(k);
    send_frame(link.socket, mine.serialize(), deadline);
  }
  for (AggregatorLink& link : links) {
    const AggregatorReply reply = AggregatorReply::parse(recv_frame(link.socket, deadline, link.name), link.name);
    if (reply.status != 0) fail(qcclInvalidUsage, "%s refused this rank: %s", link.name.c_str(), reply.message.c_str());
    if (reply.address.empty()) fail(qcclRemoteError, "%s sent no UCX address", link.name.c_str());
    link.address = reply.address;
  }
  return links;
}

}  // namespace qccl
