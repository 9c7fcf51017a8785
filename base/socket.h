// TCP sockets for the bootstrap and the control plane (never for payload: that is UCX's job).
// Every blocking call takes a deadline and throws Error(qcclTimeout / qcclSystemError /
// qcclRemoteError) that says which address and what went wrong.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace qccl::net {

using Clock = std::chrono::steady_clock;

// A point in time after which blocking calls give up; `never()` waits forever.
class Deadline {
 public:
  static Deadline after(double seconds);  // seconds <= 0: never; past kForeverSeconds, never too
  static Deadline never() { return Deadline(); }
  // The earlier of this deadline and `seconds` from now (an expired deadline stays expired).
  Deadline sooner(double seconds) const;
  // This deadline `seconds` later (never stays never).
  Deadline later(double seconds) const;
  static constexpr double kForeverSeconds = 1e9;  // 31 years; the clock's nanoseconds overflow past 9e9
  bool expired() const { return !infinite_ && Clock::now() >= at_; }
  // Milliseconds left for poll(): -1 for never, else >= 0.
  int poll_ms() const;

 private:
  bool infinite_ = true;
  Clock::time_point at_{};
};

class Address {
 public:
  Address() = default;
  // "host:port" or "[v6addr]:port"; host may be a name. `what` names the source in errors.
  static Address parse(const std::string& host_port, const std::string& what);
  static Address from_sockaddr(const sockaddr* sa, socklen_t len);
  std::string to_string() const;
  uint16_t port() const;
  void set_port(uint16_t port);
  bool valid() const { return len_ > 0; }
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage_); }
  socklen_t len() const { return len_; }
  int family() const { return storage_.ss_family; }

 private:
  sockaddr_storage storage_{};
  socklen_t len_ = 0;
};

// The address this host should listen on and advertise: the IPv4 address of QCCL_SOCKET_IFNAME when
// given (an error if that interface has none), else the first non-loopback IPv4 interface that is
// up, else 127.0.0.1. Port 0.
Address local_address(const std::string& ifname);

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept : fd_(other.fd_), peer_(other.peer_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // Listens on `bind_to` (port 0 picks a free port), SO_REUSEADDR on.
  static Socket listen(const Address& bind_to, int backlog = 128);
  // Connects, retrying refused or unreachable attempts until the deadline (the peer may not be
  // listening yet). TCP_NODELAY and keepalive on.
  static Socket connect(const Address& to, const Deadline& deadline);

  // Waits for a connection until the deadline; an invalid Socket on timeout. A connection that failed
  // before it was accepted is skipped; the rest (out of descriptors, buffers or memory: EMFILE,
  // ENFILE, ENOBUFS, ENOMEM) throw Error(qcclSystemError), and the listener stays good.
  Socket accept(const Deadline& deadline);
  void send_all(const void* data, size_t bytes, const Deadline& deadline);
  void recv_all(void* data, size_t bytes, const Deadline& deadline);
  // Reads what is available without blocking: >0 bytes read, 0 on orderly EOF, -1 if nothing yet.
  // Throws on errors.
  long read_some(void* data, size_t bytes);

  Address local_address() const;
  // The peer as connect() or accept() knew it: after a reset, getpeername no longer says.
  Address peer_address() const;
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();

 private:
  int fd_ = -1;
  Address peer_;
};

}  // namespace qccl::net
