// IntSGD's aggregators (agg=switch, collectives/allreduce_intsgd_switch.cc): how a communicator's
// ranks register with aggregator processes (tools/qccl_aggregator.cc), and the registration messages
// both sides speak.
//
// Each rank opens a TCP connection to every aggregator named in QCCL_AGGREGATORS (host:port, comma-
// separated; their order numbers them 0 .. K-1) and sends a hello {magic, version, job, rank, nranks,
// index, largest message, its UCX worker address}. An aggregator answers a job once all nranks ranks
// of it have said hello: {magic, version, status, message, its UCX worker address}; a refusal
// (another rank count, a duplicate rank) carries a non-zero status and a sentence. Aggregator k then
// talks to the job as transport peer nranks + k. The TCP connections stay open: a closed one tells the
// aggregator that the job ended (or that a rank died), and it drops the job's slots.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/socket.h"

namespace qccl {

constexpr uint32_t kAggregatorMagic = 0x47414351;  // "QCAG"
constexpr uint16_t kAggregatorVersion = 1;

struct AggregatorHello {
  uint64_t job = 0;           // the communicator's identity, the same on its ranks and on no other communicator
  int32_t rank = 0;
  int32_t nranks = 0;
  int32_t index = 0;          // this aggregator's number k in QCCL_AGGREGATORS
  uint64_t max_message = 0;   // the largest chunk a rank will send (header included)
  std::vector<uint8_t> address;

  std::vector<uint8_t> serialize() const;
  // Throws Error(qcclRemoteError) naming `from` when the bytes do not parse.
  static AggregatorHello parse(const std::vector<uint8_t>& bytes, const std::string& from);
};

struct AggregatorReply {
  int32_t status = 0;  // 0: accepted
  std::string message;
  std::vector<uint8_t> address;

  std::vector<uint8_t> serialize() const;
  static AggregatorReply parse(const std::vector<uint8_t>& bytes, const std::string& from);
};

// Length-prefixed frames on a registration connection.
void send_frame(net::Socket& socket, const std::vector<uint8_t>& bytes, const net::Deadline& deadline);
std::vector<uint8_t> recv_frame(net::Socket& socket, const net::Deadline& deadline, const std::string& from);
// A whole frame from the front of `buffer` (bytes read so far) into *frame, which it removes: false
// while it is incomplete. Throws qcclRemoteError for a frame longer than any.
bool take_frame(std::vector<uint8_t>& buffer, std::vector<uint8_t>* frame, const std::string& from);

// QCCL_AGGREGATORS' addresses ("host:port,host:port"); throws Error(qcclInvalidArgument) naming a bad one.
std::vector<net::Address> parse_aggregator_list(const std::string& text);

// A rank's registration with one aggregator (the connection is kept open for the job's lifetime).
struct AggregatorLink {
  net::Socket socket;
  std::string name;              // "aggregator 0 (host:port)"
  std::vector<uint8_t> address;  // its UCX worker address
};
// Registers with every aggregator: returns them in QCCL_AGGREGATORS order. Throws Error(qcclTimeout,
// qcclSystemError, qcclRemoteError, qcclInvalidArgument) that names the aggregator and what failed.
std::vector<AggregatorLink> register_with_aggregators(const std::string& list, const AggregatorHello& hello,
                                                      const net::Deadline& deadline);

}  // namespace qccl
