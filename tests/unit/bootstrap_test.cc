// Bootstrap and communicator creation, with ranks as threads of this process: strangers at the root
// (garbage, a wrong magic, a silent connection) are refused without disturbing the communicator
// being built, and bad ids, ranks and rank counts are clear errors.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/errors.h"
#include "base/wire.h"
#include "include/qccl.h"
#include "src/aggregator.h"
#include "src/bootstrap.h"
#include "src/control.h"
#include "transports/ucx_transport.h"

namespace qccl::test {
namespace {

// Sends `bytes` to the root and returns what it answers before closing (the refusal).
std::string talk_to_root(const qcclUniqueId& id, const std::vector<uint8_t>& bytes) {
  BootstrapId b = decode_unique_id(id);
  net::Socket s = net::Socket::connect(b.root, net::Deadline::after(10));
  s.send_all(bytes.data(), bytes.size(), net::Deadline::after(10));
  std::string reply;
  char buf[512];
  const auto deadline = net::Deadline::after(15);
  for (;;) {
    pollfd p{s.fd(), POLLIN, 0};
    if (::poll(&p, 1, deadline.poll_ms()) <= 0) break;
    long n = s.read_some(buf, sizeof(buf));
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
  }
  return reply;
}

std::vector<uint8_t> hello(uint64_t magic, int rank, int nranks) {
  ByteWriter w;
  w.put<uint32_t>(0x4c484351);  // "QCHL"
  w.put<uint32_t>(3);  // the protocol version (src/bootstrap.cc)
  w.put<uint64_t>(magic);
  w.put<int32_t>(rank);
  w.put<int32_t>(nranks);
  w.put<int32_t>(-1);  // the rank's time left: none
  w.put<uint32_t>(0);
  return w.bytes();
}

// Entries of a /proc directory: this process's descriptors or threads.
int proc_entries(const char* dir) {
  int n = 0;
  DIR* d = opendir(dir);
  if (!d) return -1;
  while (const dirent* e = readdir(d)) n += e->d_name[0] != '.' ? 1 : 0;
  closedir(d);
  return n;
}

// Ranks 0 and 1 join from threads (timeout 5 s); rank 2's hello is `forged`, sent through the root by
// another thread that then leaves. Returns ranks 0 and 1's results and messages.
std::vector<qcclResult_t> join_beside_forged_rank(const PeerInfo& forged, std::vector<std::string>* messages) {
  qcclUniqueId id;
  REQUIRE(qcclGetUniqueId(&id) == qcclSuccess);
  std::thread forger([&] {
    try {
      exchange_through_root(decode_unique_id(id), 2, 3, forged.serialize(), net::Deadline::after(10));
    } catch (const Error&) {
    }
  });
  std::vector<qcclResult_t> results(2);
  messages->assign(2, "");
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      qcclConfig_t config = QCCL_CONFIG_INITIALIZER;
      config.timeoutSeconds = 5;
      qcclComm_t comm = nullptr;
      results[r] = qcclCommInitRankConfig(&comm, 3, id, r, &config);
      (*messages)[r] = qcclGetLastError(nullptr);
      if (comm) qcclCommDestroy(comm);
    });
  for (auto& t : ranks) t.join();
  forger.join();
  return results;
}

// What a rank of this build tells the others, as far as the other ranks check it.
PeerInfo plausible_peer() {
  PeerInfo p;
  p.hostname = "forged", p.boot_id = "x", p.pid = 99999, p.cpus = 1;
  p.chunk_bytes = Config::resolve(nullptr).chunk_bytes;
  p.transport_version = transport::UcxTransport::library_version();
  return p;
}

// Every thread joins as one rank (declaring declared[r] ranks, by default nranks), then all-reduces
// its rank; returns each rank's result code, and its error message in *messages.
std::vector<qcclResult_t> run_ranks(const qcclUniqueId& id, int nranks, std::vector<int> declared = {},
                                    double timeout = 20, std::vector<std::string>* messages = nullptr) {
  std::vector<qcclResult_t> results(nranks, qcclSuccess);
  if (messages) messages->assign(nranks, "");
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      qcclConfig_t config = QCCL_CONFIG_INITIALIZER;
      config.timeoutSeconds = timeout;
      qcclComm_t comm = nullptr;
      const int n = declared.empty() ? nranks : declared[r];
      results[r] = qcclCommInitRankConfig(&comm, n, id, r, &config);
      if (messages) (*messages)[r] = qcclGetLastError(nullptr);
      if (results[r] != qcclSuccess) return;
      int64_t in = r, out = -1;
      results[r] = qcclAllReduce(&in, &out, 1, qcclInt64, qcclSum, comm);
      if (results[r] == qcclSuccess && out != static_cast<int64_t>(nranks) * (nranks - 1) / 2)
        results[r] = qcclInternalError;
      qcclResult_t destroyed = qcclCommDestroy(comm);
      if (results[r] == qcclSuccess) results[r] = destroyed;
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace

TEST_CASE("strangers at the bootstrap root are refused and the communicator still forms", "[bootstrap]") {
  qcclUniqueId id;
  REQUIRE(qcclGetUniqueId(&id) == qcclSuccess);
  const BootstrapId b = decode_unique_id(id);

  // A connection that says nothing stays open while the real ranks join.
  net::Socket silent = net::Socket::connect(b.root, net::Deadline::after(10));
  const std::string garbage = talk_to_root(id, std::vector<uint8_t>{'G', 'E', 'T', ' ', '/', ' ', 'H', 'T'});
  CHECK_THAT(garbage, Catch::Contains("not a qccl hello"));
  const std::string wrong_magic = talk_to_root(id, hello(b.magic ^ 1, 0, 3));
  CHECK_THAT(wrong_magic, Catch::Contains("wrong magic"));

  for (qcclResult_t r : run_ranks(id, 3)) CHECK(r == qcclSuccess);
}

TEST_CASE("ranks that disagree on the rank count: one is refused with the reason, the other times out",
          "[bootstrap]") {
  qcclUniqueId id;
  REQUIRE(qcclGetUniqueId(&id) == qcclSuccess);
  // Rank 1 claims 3 ranks. Whichever hello reaches the root first fixes the count; the other rank is
  // refused and says why, and the first waits for a partner that never comes (timeout of 3 s).
  std::vector<std::string> messages;
  std::vector<qcclResult_t> results = run_ranks(id, 2, {2, 3}, 3.0, &messages);
  int refused = 0, timed_out = 0;
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << messages[r]);
    if (results[r] == qcclInvalidArgument) {
      ++refused;
      CHECK_THAT(messages[r], Catch::Contains("refused") && Catch::Contains("nranks"));
    } else {
      ++timed_out;
      CHECK(results[r] == qcclTimeout);
    }
  }
  CHECK(refused == 1);
  CHECK(timed_out == 1);
}

TEST_CASE("the unique id is binary, round-trips IPv4 and IPv6 roots, and leaves room in 128 bytes",
          "[bootstrap]") {
  for (const char* root : {"10.1.2.3:4567", "127.0.0.1:1", "[fe80::1:2:3:4]:65535", "[::1]:80"}) {
    INFO(root);
    BootstrapId b;
    b.magic = 0x0123456789abcdefull;
    b.root = net::Address::parse(root, "test");
    for (const bool root_at_init : {false, true}) {
      b.root_at_init = root_at_init;
      qcclUniqueId id;
      encode_unique_id(b, &id);
      size_t used = sizeof(id.internal);
      while (used > 0 && id.internal[used - 1] == 0) --used;
      CHECK(used <= 40);  // NCCL's ncclUniqueId is the same 128 bytes: the rest is room to spare
      uint32_t version;
      std::memcpy(&version, id.internal + 4, 4);
      CHECK(version == (root_at_init ? 3u : 2u));  // a plain id is what an older qccl reads
      const BootstrapId back = decode_unique_id(id);
      CHECK(back.magic == b.magic);
      CHECK(back.root.to_string() == b.root.to_string());
      CHECK(back.root.port() == b.root.port());
      CHECK(back.root_at_init == root_at_init);
    }
  }
  BootstrapId b;
  b.magic = 1;
  b.root = net::Address::parse("10.0.0.1:5", "test");
  qcclUniqueId id;
  encode_unique_id(b, &id);
  id.internal[16] = 9;  // the family byte
  CHECK_THROWS_WITH(decode_unique_id(id), Catch::Contains("address family 9"));
}

TEST_CASE("an id from an address: the same in every process, its root started by rank 0's init", "[bootstrap]") {
  // A free port on loopback.
  net::Socket probe = net::Socket::listen(net::Address::parse("127.0.0.1:0", "probe"));
  const std::string address = "127.0.0.1:" + std::to_string(probe.local_address().port());
  probe.close();
  qcclUniqueId id, again;
  REQUIRE(qcclGetUniqueIdFromAddress(address.c_str(), &id) == qcclSuccess);
  REQUIRE(qcclGetUniqueIdFromAddress(address.c_str(), &again) == qcclSuccess);
  CHECK(std::memcmp(&id, &again, sizeof id) == 0);
  const BootstrapId b = decode_unique_id(id);
  CHECK(b.root_at_init);
  CHECK(b.root.to_string() == address);
  // Nothing listens until rank 0 joins; then twice in a row on the one port.
  for (int round = 0; round < 2; ++round) {
    INFO("round " << round);
    for (qcclResult_t r : run_ranks(id, 3)) CHECK(r == qcclSuccess);
  }
  // A plain id does not carry the flag; one that does round-trips it.
  qcclUniqueId plain;
  REQUIRE(qcclGetUniqueId(&plain) == qcclSuccess);
  CHECK_FALSE(decode_unique_id(plain).root_at_init);
  // A rank 0 whose init fails after its root started: the root gives up after the timeout (it
  // waited for ever, and the port stayed taken), and a second try listens there again.
  {
    qcclConfig_t config = QCCL_CONFIG_INITIALIZER;
    config.timeoutSeconds = 1;
    qcclComm_t comm = nullptr;
    REQUIRE(setenv("QCCL_NODE_MAP", "0,0", 1) == 0);  // two ranks' nodes for a communicator of one
    CHECK(qcclCommInitRankConfig(&comm, 1, id, 0, &config) == qcclInvalidArgument);
    REQUIRE(unsetenv("QCCL_NODE_MAP") == 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    REQUIRE(qcclCommInitRankConfig(&comm, 1, id, 0, &config) == qcclSuccess);
    CHECK(qcclCommDestroy(comm) == qcclSuccess);
  }
  // An address that is not this host's: rank 0 fails at once, naming it (every rank timed out).
  {
    qcclUniqueId elsewhere;
    REQUIRE(qcclGetUniqueIdFromAddress("192.0.2.1:4791", &elsewhere) == qcclSuccess);  // TEST-NET-1
    qcclComm_t comm = nullptr;
    CHECK(qcclCommInitRank(&comm, 2, elsewhere, 0) == qcclSystemError);
    CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("cannot listen on 192.0.2.1:4791"));
  }
  // Bad arguments.
  CHECK(qcclGetUniqueIdFromAddress(nullptr, &id) == qcclInvalidArgument);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("address = NULL"));
  CHECK(qcclGetUniqueIdFromAddress(address.c_str(), nullptr) == qcclInvalidArgument);
  CHECK(qcclGetUniqueIdFromAddress("127.0.0.1", &id) == qcclInvalidArgument);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("'127.0.0.1' is not host:port"));
  CHECK(qcclGetUniqueIdFromAddress("127.0.0.1:0", &id) == qcclInvalidArgument);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("port 0 cannot be the root's port"));
}

TEST_CASE("bad ids, ranks and counts are rejected before anything is sent", "[bootstrap]") {
  qcclUniqueId garbage;
  std::memset(&garbage, 0x5a, sizeof(garbage));
  qcclComm_t comm = nullptr;
  CHECK(qcclCommInitRank(&comm, 2, garbage, 0) == qcclInvalidArgument);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("not made by qcclGetUniqueId"));

  qcclUniqueId id;
  REQUIRE(qcclGetUniqueId(&id) == qcclSuccess);
  CHECK(qcclCommInitRank(&comm, 2, id, 2) == qcclInvalidArgument);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("rank = 2"));
  CHECK(qcclCommInitRank(&comm, 0, id, 0) == qcclInvalidArgument);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("nranks = 0"));
  CHECK(qcclCommInitRank(nullptr, 1, id, 0) == qcclInvalidArgument);
  CHECK(comm == nullptr);  // outputs are written only on success

  qcclConfig_t config = QCCL_CONFIG_INITIALIZER;
  config.magic = 0;
  CHECK(qcclCommInitRankConfig(&comm, 1, id, 0, &config) == qcclInvalidArgument);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("QCCL_CONFIG_INITIALIZER"));
  config = QCCL_CONFIG_INITIALIZER;
  config.pipelineDepth = 0;
  CHECK(qcclCommInitRankConfig(&comm, 1, id, 0, &config) == qcclInvalidArgument);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("pipelineDepth = 0"));
}

TEST_CASE("a silent connection cannot hold the control hub past its deadline, which names who is missing",
          "[bootstrap]") {
  net::Socket listener = net::Socket::listen(net::Address::parse("127.0.0.1:0", "loopback"));
  net::Socket silent = net::Socket::connect(listener.local_address(), net::Deadline::after(5));
  // Accepted once the deadline has passed: its hello was then read without a limit.
  const net::Deadline deadline = net::Deadline::after(0.05);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::promise<void> finished;
  std::thread unblock([&silent, done = finished.get_future()] {  // so that the old code fails, not hangs
    if (done.wait_for(std::chrono::seconds(5)) == std::future_status::timeout) ::shutdown(silent.fd(), SHUT_RDWR);
  });
  ControlPlane hub(0, 3, 42, {"rank 0 (a:1)", "rank 1 (b:2)", "rank 2 (c:3)"}, [](const Failure&) {});
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(hub.accept_peers(listener, deadline),
                    Catch::Contains("2 of 2 ranks did not connect") && Catch::Contains("rank 1 (b:2), rank 2 (c:3)"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
  finished.set_value();
  unblock.join();
}

TEST_CASE("a socket's errors name its peer also after the peer reset the connection", "[bootstrap]") {
  net::Socket listener = net::Socket::listen(net::Address::parse("127.0.0.1:0", "loopback"));
  const std::string where = listener.local_address().to_string();
  net::Socket client = net::Socket::connect(listener.local_address(), net::Deadline::after(5));
  net::Socket served = listener.accept(net::Deadline::after(5));
  REQUIRE(served.valid());
  const std::string client_address = client.local_address().to_string();
  const linger reset{1, 0};  // close with a reset: getpeername fails on the other end from then on
  REQUIRE(::setsockopt(client.fd(), SOL_SOCKET, SO_LINGER, &reset, sizeof reset) == 0);
  client.close();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  uint8_t byte = 0;
  CHECK_THROWS_WITH(served.recv_all(&byte, 1, net::Deadline::after(5)), Catch::Contains(client_address));
  net::Socket again = net::Socket::connect(listener.local_address(), net::Deadline::after(5));
  net::Socket closing = listener.accept(net::Deadline::after(5));
  REQUIRE(::setsockopt(closing.fd(), SOL_SOCKET, SO_LINGER, &reset, sizeof reset) == 0);
  closing.close();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_THROWS_WITH(again.recv_all(&byte, 1, net::Deadline::after(5)), Catch::Contains(where));
}

TEST_CASE("a root service told when its first rank comes gives up after that, closing its port", "[bootstrap]") {
  // (A split's child root, which its own process joins at once unless the split failed.)
  net::Socket listener = net::Socket::listen(net::Address::parse("127.0.0.1:0", "loopback"));
  const net::Address where = listener.local_address();
  start_root_service(std::move(listener), 42, 2, 30, net::Deadline::after(0.2));
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  CHECK_THROWS_WITH(net::Socket::connect(where, net::Deadline::after(0.3)), Catch::Contains("cannot connect"));
}

TEST_CASE("a unique id waits for its first rank however late, and a root without a port is refused",
          "[bootstrap]") {
  qcclUniqueId id;
  ::setenv("QCCL_TIMEOUT", "1", 1);  // the root's: it used to give up 1 s after the id was made
  REQUIRE(qcclGetUniqueId(&id) == qcclSuccess);
  ::unsetenv("QCCL_TIMEOUT");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  for (qcclResult_t r : run_ranks(id, 2)) CHECK(r == qcclSuccess);

  ::setenv("QCCL_RANK", "0", 1);
  ::setenv("QCCL_NRANKS", "2", 1);
  ::setenv("QCCL_ROOT", "127.0.0.1:0", 1);
  qcclComm_t comm = nullptr;
  CHECK(qcclCommInitEnv(&comm, nullptr) == qcclInvalidArgument);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("QCCL_ROOT = '127.0.0.1:0': port 0"));
  CHECK(comm == nullptr);
  for (const char* name : {"QCCL_RANK", "QCCL_NRANKS", "QCCL_ROOT"}) ::unsetenv(name);
  // QCCL_MAGIC is checked in a job of one too (it was ignored there).
  ::setenv("QCCL_MAGIC", "xyz", 1);
  CHECK(qcclCommInitEnv(&comm, nullptr) == qcclInvalidArgument);
  CHECK_THAT(std::string(qcclGetLastError(nullptr)), Catch::Contains("QCCL_MAGIC = 'xyz'"));
  CHECK(comm == nullptr);
  ::unsetenv("QCCL_MAGIC");
}

TEST_CASE("a single-rank communicator from a unique id", "[bootstrap]") {
  qcclUniqueId id;
  REQUIRE(qcclGetUniqueId(&id) == qcclSuccess);
  for (qcclResult_t r : run_ranks(id, 1)) CHECK(r == qcclSuccess);
}

TEST_CASE("several ranks as threads of one process", "[bootstrap]") {
  for (int n : {2, 5}) {
    qcclUniqueId id;
    REQUIRE(qcclGetUniqueId(&id) == qcclSuccess);
    for (qcclResult_t r : run_ranks(id, n)) CHECK(r == qcclSuccess);
  }
}

TEST_CASE("peer information round-trips, and malformed or hostile blobs fail cleanly", "[bootstrap]") {
  PeerInfo p;
  p.hostname = "h", p.boot_id = "b", p.pid = 7, p.topology = "t", p.transport_address = {1, 2, 3};
  p.chunk_bytes = 1 << 20, p.link_rate_bits = 10'000'000'000ull, p.codec_policy = "auto:maxrelerr=0.1";
  p.codec_costs = {1e-9, 2e-10, 0, 3.5e-10}, p.cpus = 2, p.oversubscribed = 1, p.pipeline_depth = 4;
  p.parent_host_ranks = 3;
  p.chunk_explicit = 1, p.node_map = "0,0,1,1", p.aggregators = "10.0.0.1:5000,10.0.0.2:5000";
  const std::vector<uint8_t> bytes = p.serialize();
  const PeerInfo q = PeerInfo::parse(bytes, 1);
  CHECK(q.codec_policy == p.codec_policy);
  CHECK(q.codec_costs == p.codec_costs);
  CHECK((q.cpus == 2 && q.oversubscribed == 1 && q.pipeline_depth == 4 && q.chunk_bytes == p.chunk_bytes));
  CHECK(q.parent_host_ranks == 3);
  CHECK((q.chunk_explicit == 1 && q.node_map == "0,0,1,1" && q.aggregators == p.aggregators));
  // A summary that lists thousands of bound CPUs (every other PU of a large host) is cut, not refused.
  PeerInfo sparse = p;
  sparse.topology = "h: 2 packages, 2 NUMA nodes, 512 cores, 1024 PUs, bound to PUs ";
  for (int pu = 0; pu < 1024; pu += 2) sparse.topology += std::to_string(pu) + ",";
  const PeerInfo parsed = PeerInfo::parse(sparse.serialize(), 1);
  CHECK(parsed.topology.size() == 1024);
  CHECK(parsed.topology.substr(0, 1021) == sparse.topology.substr(0, 1021));
  CHECK(parsed.node_map == p.node_map);
  // every truncation fails with an error, never a crash or a half-read record
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    INFO("cut at " << cut);
    CHECK_THROWS_AS(PeerInfo::parse(std::vector<uint8_t>(bytes.begin(), bytes.begin() + cut), 1), Error);
  }
  for (double bad : {-1.0, std::nan(""), HUGE_VAL}) {
    PeerInfo r = p;
    r.codec_costs = {bad};
    CHECK_THROWS_WITH(PeerInfo::parse(r.serialize(), 1), Catch::Contains("codec cost"));
  }
}

TEST_CASE("the bootstrap root survives running out of descriptors, and holds few idle connections", "[bootstrap]") {
  qcclUniqueId id;
  REQUIRE(qcclGetUniqueId(&id) == qcclSuccess);
  const BootstrapId b = decode_unique_id(id);
  // A burst of idle connections: the root holds at most 64 of them (it held them all, a descriptor
  // each, until their hello deadline).
  {
    const int before = proc_entries("/proc/self/fd");
    std::vector<net::Socket> idle;
    for (int i = 0; i < 100; ++i) idle.push_back(net::Socket::connect(b.root, net::Deadline::after(5)));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHECK(proc_entries("/proc/self/fd") - before <= 100 + 64 + 4);  // ours, the root's, slack
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the root has closed its ends of them
  // The root's process out of descriptors (16 more than it has) under a burst of 60 connections from
  // another process: its accepts fail with EMFILE until the burst goes. The root ended there, and
  // every rank then failed at its timeout with "connection refused".
  rlimit normal{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &normal) == 0);
  rlimit low = normal;
  low.rlim_cur = static_cast<rlim_t>(proc_entries("/proc/self/fd") + 16);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
  const pid_t burst = fork();
  if (burst == 0) {
    setrlimit(RLIMIT_NOFILE, &normal);
    for (int i = 0; i < 60; ++i) {
      const int fd = ::socket(b.root.family(), SOCK_STREAM, 0);
      if (fd < 0 || ::connect(fd, b.root.sa(), b.root.len()) != 0) _exit(1);
    }
    ::sleep(1);
    _exit(0);
  }
  int status = -1;
  waitpid(burst, &status, 0);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &normal) == 0);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  std::vector<std::string> messages;
  const std::vector<qcclResult_t> results = run_ranks(id, 2, {}, 10, &messages);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << messages[r]);
    CHECK(results[r] == qcclSuccess);
  }
}

TEST_CASE("a failed single-rank qcclCommInitEnv leaves no root thread or port behind", "[bootstrap]") {
  REQUIRE(setenv("QCCL_NODE_MAP", "0,0", 1) == 0);  // two ranks' nodes for a job of one: fails after the root started
  const int descriptors = proc_entries("/proc/self/fd"), threads = proc_entries("/proc/self/task");
  for (int i = 0; i < 10; ++i) {
    qcclComm_t comm = nullptr;
    CHECK(qcclCommInitEnv(&comm, nullptr) == qcclInvalidArgument);
  }
  REQUIRE(unsetenv("QCCL_NODE_MAP") == 0);
  CHECK(proc_entries("/proc/self/fd") <= descriptors);  // (a root of an earlier test may have ended since)
  CHECK(proc_entries("/proc/self/task") <= threads);
  // A job of one still forms.
  qcclComm_t comm = nullptr;
  REQUIRE(qcclCommInitEnv(&comm, nullptr) == qcclSuccess);
  CHECK(qcclCommDestroy(comm) == qcclSuccess);
}

TEST_CASE("a peer's empty UCX worker address or other major UCX version is refused before any address is read",
          "[bootstrap]") {
  std::vector<std::string> messages;
  {
    // An empty address left rank 2 without an endpoint (a crash at the first send to it).
    PeerInfo empty = plausible_peer();
    for (qcclResult_t r : join_beside_forged_rank(empty, &messages)) CHECK(r == qcclRemoteError);
    for (const std::string& m : messages)
      CHECK_THAT(m, Catch::Contains("rank 2 (forged:99999) sent an empty UCX worker address"));
  }
  {
    // Another major version's address (here bytes no UCX wrote) trips UCX's assertions as ucp_ep_create
    // reads it: an abort of every rank, this test's process included, had the versions not been
    // compared first. (Releases of one major version only warn: UCX reads their addresses.)
    PeerInfo other_version = plausible_peer();
    other_version.transport_version = "0.0.0";
    for (int i = 0; i < 64; ++i) other_version.transport_address.push_back(static_cast<uint8_t>(i * 37 + 11));
    for (qcclResult_t r : join_beside_forged_rank(other_version, &messages)) CHECK(r == qcclSystemError);
    for (const std::string& m : messages)
      CHECK_THAT(m, Catch::Contains("rank 2 (forged:99999) runs UCX 0.0.0") &&
                        Catch::Contains("UCX " + transport::UcxTransport::library_version()));
  }
}

TEST_CASE("ranks that wait for one that never joins hear which it was", "[bootstrap]") {
  qcclUniqueId id;
  REQUIRE(qcclGetUniqueId(&id) == qcclSuccess);
  std::vector<std::string> messages;
  const std::vector<qcclResult_t> results = run_ranks(id, 2, {3, 3}, 3.0, &messages);  // rank 2 never comes
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << messages[r]);
    CHECK(results[r] == qcclTimeout);
    CHECK_THAT(messages[r],
               Catch::Contains("rank 2 (of 3) never joined the bootstrap at " + decode_unique_id(id).root.to_string()));
  }
}

TEST_CASE("a rank whose init fails after the control plane is up tells the others why", "[bootstrap]") {
  // A stand-in aggregator refuses rank 0's registration and accepts rank 1's (with a real worker's
  // address); rank 1 then waits in the end-of-init barrier, where it heard only that rank 0's
  // "process died".
  transport::UcxTransport stand_in_worker(2, 3);
  net::Socket listener = net::Socket::listen(net::Address::parse("127.0.0.1:0", "loopback"));
  std::vector<net::Socket> registered;
  std::thread aggregator([&] {
    try {
      for (int i = 0; i < 2; ++i) {
        net::Socket s = listener.accept(net::Deadline::after(10));
        if (!s.valid()) return;
        const AggregatorHello hello =
            AggregatorHello::parse(recv_frame(s, net::Deadline::after(10), "a rank"), "a rank");
        AggregatorReply reply;
        if (hello.rank == 0) {
          reply.status = 1;
          reply.message = "rank 0 is not welcome here";
        } else {
          reply.address = stand_in_worker.address();
        }
        send_frame(s, reply.serialize(), net::Deadline::after(10));
        registered.push_back(std::move(s));
      }
    } catch (const Error& e) {
      FAIL_CHECK("stand-in aggregator: " << e.message());
    }
  });
  REQUIRE(setenv("QCCL_AGGREGATORS", listener.local_address().to_string().c_str(), 1) == 0);
  qcclUniqueId id;
  REQUIRE(qcclGetUniqueId(&id) == qcclSuccess);
  std::vector<std::string> messages;
  const std::vector<qcclResult_t> results = run_ranks(id, 2, {}, 10, &messages);
  REQUIRE(unsetenv("QCCL_AGGREGATORS") == 0);
  aggregator.join();
  CHECK(results[0] == qcclInvalidUsage);
  CHECK_THAT(messages[0], Catch::Contains("refused this rank: rank 0 is not welcome here"));
  CHECK(results[1] == qcclRemoteError);
  CHECK_THAT(messages[1], Catch::Contains("rank 0 (") && Catch::Contains("rank 0 is not welcome here"));
}

}  // namespace qccl::test
