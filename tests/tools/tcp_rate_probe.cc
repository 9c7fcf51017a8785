// tests/tools/tcp_rate_probe.cc: a two-rank TCP throughput probe for qcclrun --netem tests.
//   qcclrun --netem 100mbit -n 2 -- tcp_rate_probe BYTES
// Rank 1 connects to QCCL_ROOT and sends BYTES; rank 0 (listening there) prints
//   rate_bits=<bit/s> bytes=<n> seconds=<s>
// The rate is timed from the first byte received to the last, without the first read, so the time
// to connect and the first tbf burst do not count. Other ranks do nothing.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

[[noreturn]] void die(const char* what) {
  fprintf(stderr, "tcp_rate_probe: %s: %s\n", what, strerror(errno));
  exit(1);
}

sockaddr_in root_address() {
  const char* root = getenv("QCCL_ROOT");
  std::string s = root ? root : "";
  size_t colon = s.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (colon == std::string::npos || inet_pton(AF_INET, s.substr(0, colon).c_str(), &addr.sin_addr) != 1) {
    fprintf(stderr, "tcp_rate_probe: QCCL_ROOT='%s' is not IPv4:port\n", s.c_str());
    exit(1);
  }
  addr.sin_port = htons(static_cast<uint16_t>(atoi(s.c_str() + colon + 1)));
  return addr;
}

int receive(const sockaddr_in& addr) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(ls, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) die("bind");
  if (listen(ls, 1) != 0) die("listen");
  int s = accept(ls, nullptr, nullptr);
  if (s < 0) die("accept");
  std::vector<char> buf(1 << 20);
  size_t total = 0, first = 0;
  double t_first = 0, t_last = 0;
  for (;;) {
    ssize_t n = read(s, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) die("read");
    if (n == 0) break;
    t_last = now_s();
    if (total == 0) {
      t_first = t_last;
      first = n;
    }
    total += n;
  }
  double seconds = t_last - t_first;
  if (total <= first || seconds <= 0) {
    fprintf(stderr, "tcp_rate_probe: too little data to time (%zu bytes)\n", total);
    return 1;
  }
  printf("rate_bits=%.0f bytes=%zu seconds=%.4f\n", (total - first) * 8.0 / seconds, total, seconds);
  return 0;
}

int send_bytes(const sockaddr_in& addr, size_t bytes) {
  int s = -1;
  for (double deadline = now_s() + 10;;) {  // rank 0 may not be listening yet
    s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) break;
    close(s);
    if (now_s() > deadline) die("connect");
    usleep(10000);
  }
  std::vector<char> buf(1 << 16, 'x');
  for (size_t sent = 0; sent < bytes;) {
    ssize_t n = write(s, buf.data(), std::min(buf.size(), bytes - sent));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) die("write");
    sent += n;
  }
  close(s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = argc > 1 ? strtoull(argv[1], nullptr, 10) : 3000000;
  const char* rank = getenv("QCCL_RANK");
  int r = rank ? atoi(rank) : -1;
  if (r == 0) return receive(root_address());
  if (r == 1) return send_bytes(root_address(), bytes);
  return 0;
}
