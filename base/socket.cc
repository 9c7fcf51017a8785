#include "base/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "base/errors.h"

namespace qccl::net {

Deadline Deadline::after(double seconds) {
  Deadline d;
  if (seconds > 0 && seconds <= kForeverSeconds) {
    d.infinite_ = false;
    d.at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }
  return d;
}

Deadline Deadline::sooner(double seconds) const {
  const Deadline d = after(seconds);
  return !infinite_ && (d.infinite_ || at_ < d.at_) ? *this : d;
}

Deadline Deadline::later(double seconds) const {
  Deadline d = *this;
  if (!infinite_) d.at_ += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  return d;
}

int Deadline::poll_ms() const {
  if (infinite_) return -1;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left + 1, 1 << 30));
}

Address Address::parse(const std::string& host_port, const std::string& what) {
  std::string host, port;
  if (!host_port.empty() && host_port[0] == '[') {
    size_t close = host_port.find(']');
    if (close == std::string::npos || close + 1 >= host_port.size() || host_port[close + 1] != ':')
      fail(qcclInvalidArgument, "%s = '%s' is not host:port or [ipv6]:port", what.c_str(), host_port.c_str());
    host = host_port.substr(1, close - 1);
    port = host_port.substr(close + 2);
  } else {
    size_t colon = host_port.rfind(':');
    if (colon == std::string::npos || colon == 0)
      fail(qcclInvalidArgument, "%s = '%s' is not host:port", what.c_str(), host_port.c_str());
    host = host_port.substr(0, colon);
    port = host_port.substr(colon + 1);
  }
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end || p < 0 || p > 65535)
    fail(qcclInvalidArgument, "%s = '%s': port '%s' is not in 0..65535", what.c_str(), host_port.c_str(),
         port.c_str());
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0 || !result)
    fail(qcclInvalidArgument, "%s = '%s': cannot resolve host '%s' (%s)", what.c_str(), host_port.c_str(),
         host.c_str(), gai_strerror(rc));
  Address a = from_sockaddr(result->ai_addr, result->ai_addrlen);
  freeaddrinfo(result);
  return a;
}

Address Address::from_sockaddr(const sockaddr* sa, socklen_t len) {
  Address a;
  if (len > sizeof(a.storage_)) len = sizeof(a.storage_);
  std::memcpy(&a.storage_, sa, len);
  a.len_ = len;
  return a;
}

std::string Address::to_string() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(port());
  }
  if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(port());
  }
  return "(no address)";
}

uint16_t Address::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
  return 0;
}

void Address::set_port(uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage_)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage_)->sin6_port = htons(port);
}

Address local_address(const std::string& ifname) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) fail(qcclSystemError, "getifaddrs failed: %s", errno_string(errno).c_str());
  Address found;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    if (!ifname.empty() ? ifname != i->ifa_name : (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    found = Address::from_sockaddr(i->ifa_addr, sizeof(sockaddr_in));
    break;
  }
  freeifaddrs(list);
  if (found.valid()) return found;
  if (!ifname.empty())
    fail(qcclInvalidArgument, "QCCL_SOCKET_IFNAME = '%s': no such interface with an IPv4 address that is up",
         ifname.c_str());
  return Address::parse("127.0.0.1:0", "loopback");
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    peer_ = other.peer_;
    other.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Socket Socket::listen(const Address& bind_to, int backlog) {
  Socket s(::socket(bind_to.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) fail(qcclSystemError, "socket() failed: %s", errno_string(errno).c_str());
  int one = 1;
  setsockopt(s.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(s.fd_, bind_to.sa(), bind_to.len()) != 0)
    fail(qcclSystemError, "cannot listen on %s: bind failed: %s", bind_to.to_string().c_str(),
         errno_string(errno).c_str());
  if (::listen(s.fd_, backlog) != 0)
    fail(qcclSystemError, "cannot listen on %s: %s", bind_to.to_string().c_str(), errno_string(errno).c_str());
  return s;
}

namespace {

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
}

// Waits until fd is ready for `events`; false on deadline.
bool wait_ready(int fd, short events, const Deadline& deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, deadline.poll_ms());
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) fail(qcclSystemError, "poll failed: %s", errno_string(errno).c_str());
  }
}

}  // namespace

Socket Socket::connect(const Address& to, const Deadline& deadline) {
  int last_errno = 0;
  for (int attempt = 0;; ++attempt) {
    Socket s(::socket(to.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s.valid()) fail(qcclSystemError, "socket() failed: %s", errno_string(errno).c_str());
    int rc = ::connect(s.fd_, to.sa(), to.len());
    if (rc != 0 && errno == EINPROGRESS) {
      if (wait_ready(s.fd_, POLLOUT, deadline)) {
        socklen_t len = sizeof(last_errno);
        getsockopt(s.fd_, SOL_SOCKET, SO_ERROR, &last_errno, &len);
        rc = last_errno == 0 ? 0 : -1;
      } else {
        last_errno = ETIMEDOUT;
      }
    } else if (rc != 0) {
      last_errno = errno;
    }
    if (rc == 0) {
      int flags = fcntl(s.fd_, F_GETFL);
      fcntl(s.fd_, F_SETFL, flags & ~O_NONBLOCK);
      tune(s.fd_);
      s.peer_ = to;
      return s;
    }
    bool retry = last_errno == ECONNREFUSED || last_errno == ETIMEDOUT || last_errno == EHOSTUNREACH ||
                 last_errno == ENETUNREACH || last_errno == ECONNRESET || last_errno == EAGAIN;
    if (!retry || deadline.expired())
      fail(retry ? qcclTimeout : qcclSystemError, "cannot connect to %s: %s", to.to_string().c_str(),
           errno_string(last_errno).c_str());
    // Back off a little: the root may still be starting.
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, 5 * (attempt + 1))));
  }
}

Socket Socket::accept(const Deadline& deadline) {
  for (;;) {
    if (!wait_ready(fd_, POLLIN, deadline)) return Socket();
    sockaddr_storage from{};
    socklen_t from_len = sizeof(from);
    int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&from), &from_len, SOCK_CLOEXEC);
    if (fd >= 0) {
      tune(fd);
      Socket s(fd);
      s.peer_ = Address::from_sockaddr(reinterpret_cast<sockaddr*>(&from), from_len);
      return s;
    }
    // Linux reports through accept() the network errors already pending on the new connection, to
    // be retried like EAGAIN (accept(2)): they are that connection's, not the listener's.
    const int err = errno;
    const bool connection_error = err == ECONNABORTED || err == EPROTO || err == ENETDOWN || err == ENOPROTOOPT ||
                                  err == EHOSTDOWN || err == ENONET || err == EHOSTUNREACH || err == EOPNOTSUPP ||
                                  err == ENETUNREACH;
    if (err != EINTR && err != EAGAIN && !connection_error)
      fail(qcclSystemError, "accept on %s failed: %s", local_address().to_string().c_str(), errno_string(err).c_str());
  }
}

void Socket::send_all(const void* data, size_t bytes, const Deadline& deadline) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::send(fd_, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_ready(fd_, POLLOUT, deadline))
        fail(qcclTimeout, "sending to %s timed out", peer_address().to_string().c_str());
      continue;
    }
    fail(qcclRemoteError, "sending to %s failed: %s", peer_address().to_string().c_str(),
         errno_string(errno).c_str());
  }
}

void Socket::recv_all(void* data, size_t bytes, const Deadline& deadline) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    if (!wait_ready(fd_, POLLIN, deadline))
      fail(qcclTimeout, "receiving from %s timed out", peer_address().to_string().c_str());
    long n = read_some(p, bytes);
    if (n == 0) fail(qcclRemoteError, "%s closed the connection", peer_address().to_string().c_str());
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
    }
  }
}

long Socket::read_some(void* data, size_t bytes) {
  for (;;) {
    ssize_t n = ::recv(fd_, data, bytes, MSG_DONTWAIT);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if (errno == EAGAIN) return -1;
    if (errno == ECONNRESET) return 0;
    fail(qcclRemoteError, "receiving from %s failed: %s", peer_address().to_string().c_str(),
         errno_string(errno).c_str());
  }
}

Address Socket::local_address() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  return Address::from_sockaddr(reinterpret_cast<sockaddr*>(&ss), len);
}

Address Socket::peer_address() const {
  if (peer_.valid()) return peer_;
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return Address();
  return Address::from_sockaddr(reinterpret_cast<sockaddr*>(&ss), len);
}

}  // namespace qccl::net
