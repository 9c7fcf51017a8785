// tools/qcclrun.cc: the local launcher. Starts N ranks of a program with the environment that
// qcclCommInitEnv() reads, forwards their output line by line with a rank prefix, and supervises them:
// the first rank to fail takes the job down with it, and nothing (processes, namespaces) outlives it.
//
// Design: one thread, one poll() loop. Termination signals and SIGCHLD are blocked and read from a
// signalfd, so they are handled in the loop like any other event and never interrupt a half-written
// line or a half-built network. Every rank is its own process group, so one kill() reaches the
// shell pipelines and helpers a rank starts; PR_SET_CHILD_SUBREAPER makes their orphans our children,
// so they are reaped here rather than left as zombies.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/config.h"
#include "base/errors.h"
#include "netem.h"

#ifndef QCCLRUN_VERSION
#define QCCLRUN_VERSION "unknown"
#endif

extern char** environ;

namespace {

using qccl::tools::Netem;

// Exit statuses of qcclrun itself, as timeout(1) uses them.
constexpr int kExitTimeout = 124;
constexpr int kExitLauncherError = 125;
constexpr int kExitCannotRun = 126;
constexpr int kExitNotFound = 127;

constexpr int kMaxRanks = 4096;
constexpr int kNetemDefaultRootPort = 29500;
constexpr size_t kMaxLine = 64 * 1024;  // a longer line is split, so memory stays bounded
constexpr double kDrainSeconds = 1.0;   // how long output may trail the last rank's exit
constexpr double kNever = std::numeric_limits<double>::infinity();

const char kHelp[] = R"(NAME
    qcclrun - start and supervise N local ranks of a qccl program

SYNOPSIS
    qcclrun [OPTIONS] -n N [--] PROGRAM [ARGS...]
    qcclrun --cleanup [--verbose]

DESCRIPTION
    Starts N processes ("ranks") of PROGRAM on this machine, each in its own process group, with the
    environment that qcclCommInitEnv() reads (see ENVIRONMENT).

    Every line a rank writes to stdout or stderr goes to qcclrun's stdout or stderr prefixed with
    "[R] ", R being the rank padded so that columns align. Lines are written whole, so lines of
    different ranks never mix; a last line without a newline is written (newline added) when the rank
    closes its output, and lines over 64 KiB are split. Forwarding is immediate, not buffered until
    exit. Ranks read stdin from /dev/null.

    When a rank exits with a non-zero status or is killed by a signal, qcclrun prints
    "qcclrun: rank R exited with status S" (or "... was killed by signal SIGNAME"), sends SIGTERM to
    the process groups of the other ranks, SIGKILL after the grace period, and exits with that rank's
    status. When a rank's main process exits, anything it left running in its process group is killed.
    SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 and SIGALRM sent to qcclrun are forwarded to
    every rank (a second one sends SIGKILL at once). The network of --netem and --nodes is removed in
    every case but qcclrun's own SIGKILL (then by the next --netem job, or --cleanup). Even after that
    SIGKILL no rank, nor anything left in its process group, runs on: a guardian process that
    qcclrun starts first (outside its session, so a terminal's signals do not reach it) kills them.

OPTIONS
    -n, -np, --np N     Number of ranks, 1 to 4096. Required.
    -x NAME=VALUE       Set NAME in every rank's environment (repeatable). Overrides what qcclrun sets.
                        -x NAME passes qcclrun's own value of NAME through unchanged.
    --root-port P       Port of QCCL_ROOT. Default: a port free at start, picked at random below the
                        kernel's ephemeral range (net.ipv4.ip_local_port_range), where outgoing
                        connections never take it; a program binding the same port explicitly before
                        rank 0 could still, which P avoids. With --netem or --nodes, 29500 (every job
                        has its own namespaces, so it is always free).
    --no-prefix         Forward output without the "[R] " prefix (still whole lines, a newline added
                        to a last line that lacks one).
    --grace SEC         Seconds between SIGTERM and SIGKILL when stopping ranks. Default 2.
    --timeout SEC       Stop the job and exit 124 when it runs longer than SEC. Default 0 (no limit).
    --netem RATE        Run every emulated host (every rank, unless --nodes groups them) in its own
                        network namespace behind a RATE full-duplex link (see NETWORK EMULATION).
                        RATE uses tc(8) units: 500kbit, 100mbit, 1gbit, 10gbit; "bps" means bytes per
                        second (10mbps = 80mbit); a bare number is bit/s. Needs root. Default: no
                        emulation, ranks share the host's network.
    --nodes K | N1,N2,...
                        Put the ranks on emulated hosts (see NETWORK EMULATION): K hosts of
                        contiguous blocks of ranks as equal as can be (the first N mod K hosts one rank
                        larger), or hosts of N1, N2, ... ranks in rank order (they must add up to N).
                        Ranks of one host talk over shared memory; hosts talk over tcp through their
                        links, shaped at RATE with --netem, unshaped without. Every rank's node map
                        (QCCL_DEBUG=INFO) shows the hosts. Needs root. Default: with --netem, one
                        host per rank; without, no emulation.
    --aggregators K     Also start K IntSGD aggregators (qccl_aggregator, found next to qcclrun) and
                        give every rank QCCL_AGGREGATORS, so that the int codecs' agg=switch sums
                        through them (0 to 64; default 0). They listen on 127.0.0.1, or with --netem
                        or --nodes on the bridge itself (10.99.255.250 - k, port 29600 + k), unshaped
                        like a switch's backplane: only the ranks' own links limit what they exchange.
                        They are stopped when the ranks have exited.
    --cleanup           Only delete network namespaces (and /run/qccl<PID> boot-id directories) left
                        behind by qcclrun jobs that no longer run (e.g. after kill -9), killing what
                        still runs in them (processes that left their rank's process group), then
                        exit. Needs root.
    -v, --verbose       Print the network being built, every ip/tc command, and each rank's pid and
                        exit status.
    -h, --help          Print this help and exit.
    --version           Print the version and exit.
    --                  End of qcclrun's options (needed when PROGRAM starts with '-').
    Options taking a value also accept the form --option=VALUE.

ENVIRONMENT
    Set for each rank:
      QCCL_RANK, QCCL_NRANKS          the rank, 0 to N-1, and N
      QCCL_LOCAL_RANK, QCCL_LOCAL_NRANKS
                                      the rank among the ranks of its host, and their number (all
                                      ranks share one host without --netem or --nodes)
      QCCL_ROOT                       IP:PORT where rank 0 runs the bootstrap root
                                      (127.0.0.1, or host 0's veth address with --netem or --nodes)
      QCCL_MAGIC                      16 hex digits from /dev/urandom, new for every job
    and with --netem or --nodes, for a rank of emulated host H:
      UCX_TLS=sm,tcp,self  UCX_NET_DEVICES=vethH  QCCL_SOCKET_IFNAME=vethH
      QCCL_OVERSUBSCRIBED=1           when N is larger than the CPUs qcclrun may run on (the emulated
                                      hosts share them, which their ranks cannot see)
      QCCL_LINK_RATE=RATEbit          with --netem: the links' rate, from which the ranks size their
                                      chunks unless QCCL_CHUNK_BYTES is set
    Values of these variables in qcclrun's own environment are replaced: they would belong to an
    enclosing job, and reusing its QCCL_ROOT or QCCL_MAGIC would join the two jobs. Use -x to force a
    value. Everything else is inherited.

EXIT STATUS
    0         every rank exited with status 0
    S         the first rank to fail exited with S, or 128+n when killed by signal n
    124       the --timeout expired
    125       qcclrun itself failed: bad usage, not root for --netem, the network could not be built
    126, 127  (from a rank) PROGRAM could not be executed / was not found
    128+n     qcclrun received signal n (129 SIGHUP, 130 SIGINT, 131 SIGQUIT, 143 SIGTERM, ...)

NETWORK EMULATION
    --netem and --nodes build, for job PID, a hub namespace qccl<PID>hub holding bridge br0 and, for
    each emulated host H, a namespace qccl<PID>h<H> with interface vethH (address 10.99.x.y/16, host H
    is address H+1) whose peer hubH is a port of br0. With --netem both directions of every link are
    shaped by tc tbf (rate RATE, burst of 2 ms of traffic but at least 16 KiB, latency 10ms), so each
    host has a RATE full-duplex NIC into a non-blocking switch; the machine's own interfaces are never
    touched. Ranks enter their host's namespace like `ip netns exec`, with their own /sys, and see
    their host's own boot id: a random one, written to /run/qccl<PID>/hostH.boot_id and bind-mounted
    over /proc/sys/kernel/random/boot_id in the rank's mount namespace. qccl and UCX both tell hosts
    apart by boot id (and host name), so the node map shows the emulated hosts, and UCX reaches a rank
    of the same host through shared memory and a rank of another host through tcp over the links. All
    namespaces and the boot-id directory are deleted when the job ends; at start, and with --cleanup,
    those of dead qcclrun processes are deleted too, and the processes left running in them killed.
    Pitfalls: UCX_TLS=sm,tcp,self is set; -x UCX_TLS=tcp,self makes ranks of one host talk through
    their host's link as well (over the veth, shaped once in each direction per host pair). This
    kernel has no netem qdisc, so only the rate is emulated: no added delay or loss, but up to 10 ms of
    queueing under load. One TCP stream reaches ~0.95 of RATE, because Ethernet, IP and TCP headers
    count against it. Emulated hosts still share the machine's CPUs and memory bandwidth, and the PID,
    IPC and file-system namespaces, so files and pipes between them are not shaped; 127.0.0.1 reaches
    only the host itself.

EXAMPLES
    qcclrun -n 4 ./tests/ranks/api_ranks_test
    qcclrun -n 8 --timeout 120 -x QCCL_ALGO=ring -- ./perf/all_reduce_perf -b 1M -e 64M -f 2
    sudo qcclrun --netem 1gbit -n 4 -v ./perf/all_reduce_perf
    sudo qcclrun --nodes 2 --netem 10gbit -n 4 -x QCCL_DEBUG=INFO ./perf/all_gather_perf
    sudo qcclrun --nodes 1,3 -n 4 ./tests/ranks/api_ranks_test
    sudo qcclrun --cleanup
)";

struct Options {
  int nranks = 0;
  std::vector<std::pair<std::string, std::string>> exports;  // -x, in order
  int root_port = 0;                                         // 0: choose
  bool prefix = true;
  double grace_s = 2.0;
  double timeout_s = 0;  // 0: no limit
  uint64_t netem_bits = 0;  // 0: no --netem
  std::vector<int> node_sizes;  // ranks per emulated host (--nodes, or one per rank with --netem); empty: none
  std::string nodes_text;       // --nodes as given
  int aggregators = 0;      // --aggregators K
  bool verbose = false;
  bool cleanup_only = false;
  std::vector<std::string> program;  // PROGRAM ARGS...
};

[[noreturn]] void usage_error(const std::string& msg) {
  fprintf(stderr, "qcclrun: %s\nTry 'qcclrun --help' for more information.\n", msg.c_str());
  exit(kExitLauncherError);
}

// The library's parsers (base/config.cc), whose numbers are decimal from their first digit (strtol and
// strtod alone took -n ' 2', '+2' and --timeout 0x10), under qcclrun's own message.
long parse_int(const std::string& opt, const std::string& text, long lo, long hi) {
  try {
    return static_cast<long>(qccl::parse_int(opt, text, lo, hi));
  } catch (const qccl::Error&) {
    usage_error("invalid value '" + text + "' for " + opt + " (expected an integer from " +
                std::to_string(lo) + " to " + std::to_string(hi) + ")");
  }
}

double parse_seconds(const std::string& opt, const std::string& text) {
  try {
    return qccl::parse_double(opt, text, 0, std::numeric_limits<double>::max());
  } catch (const qccl::Error&) {
    usage_error("invalid value '" + text + "' for " + opt + " (expected seconds, e.g. 2 or 0.5)");
  }
}

// The ranks of each emulated host: from --nodes (K hosts, or a list of sizes), else one host per rank
// with --netem, else none.
std::vector<int> node_sizes(const Options& o) {
  std::vector<int> sizes;
  if (o.nodes_text.empty()) {
    if (o.netem_bits) sizes.assign(static_cast<size_t>(o.nranks), 1);
    return sizes;
  }
  if (o.nodes_text.find(',') == std::string::npos) {
    const int k = static_cast<int>(parse_int("--nodes", o.nodes_text, 1, o.nranks));
    for (int h = 0; h < k; ++h) sizes.push_back(o.nranks / k + (h < o.nranks % k ? 1 : 0));
    return sizes;
  }
  size_t start = 0;
  long total = 0;
  for (;;) {
    const size_t comma = o.nodes_text.find(',', start);
    const std::string item = o.nodes_text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) usage_error("invalid --nodes '" + o.nodes_text + "' (an empty host size)");
    sizes.push_back(static_cast<int>(parse_int("a host size of --nodes", item, 1, o.nranks)));
    total += sizes.back();
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (total != o.nranks)
    usage_error("--nodes " + o.nodes_text + " puts " + std::to_string(total) + " ranks on its hosts, but -n is " +
                std::to_string(o.nranks));
  return sizes;
}

Options parse_options(int argc, char** argv) {
  Options o;
  int i = 1;
  for (; i < argc; i++) {
    std::string arg = argv[i];
    if (arg == "--") {
      i++;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // PROGRAM starts here
    std::string name = arg, inline_value;
    bool has_inline = false;
    if (arg.compare(0, 2, "--") == 0 && arg.find('=') != std::string::npos) {
      name = arg.substr(0, arg.find('='));
      inline_value = arg.substr(arg.find('=') + 1);
      has_inline = true;
    }
    auto value = [&]() -> std::string {
      if (has_inline) return inline_value;
      if (i + 1 >= argc) usage_error("option " + name + " needs a value");
      return argv[++i];
    };
    auto flag = [&]() {
      if (has_inline) usage_error("option " + name + " takes no value");
    };
    if (name == "-n" || name == "-np" || name == "--np") {
      o.nranks = static_cast<int>(parse_int(name, value(), 1, kMaxRanks));
    } else if (name == "-x") {
      std::string kv = value();
      size_t eq = kv.find('=');
      std::string var = kv.substr(0, eq);
      if (var.empty()) usage_error("invalid -x '" + kv + "' (expected NAME=VALUE or NAME)");
      if (eq != std::string::npos) {
        o.exports.emplace_back(var, kv.substr(eq + 1));
      } else if (const char* v = getenv(var.c_str())) {
        o.exports.emplace_back(var, v);
      } else {
        usage_error("-x " + var + ": " + var + " is not set in qcclrun's environment");
      }
    } else if (name == "--root-port") {
      o.root_port = static_cast<int>(parse_int(name, value(), 1, 65535));
    } else if (name == "--no-prefix") {
      flag();
      o.prefix = false;
    } else if (name == "--grace") {
      o.grace_s = parse_seconds(name, value());
    } else if (name == "--timeout") {
      o.timeout_s = parse_seconds(name, value());
    } else if (name == "--netem") {
      std::string rate = value();
      if (!qccl::parse_bit_rate(rate, &o.netem_bits))
        usage_error("invalid rate '" + rate + "' for --netem (expected a tc rate from 1kbit to 1000tbit, "
                    "e.g. 100mbit, 1gbit, 10mbps)");
    } else if (name == "--nodes") {
      o.nodes_text = value();
      if (o.nodes_text.empty()) usage_error("option --nodes needs a host count or a list of host sizes");
    } else if (name == "--aggregators") {
      o.aggregators = static_cast<int>(parse_int(name, value(), 0, 64));
    } else if (name == "--cleanup") {
      flag();
      o.cleanup_only = true;
    } else if (name == "-v" || name == "--verbose") {
      flag();
      o.verbose = true;
    } else if (name == "-h" || name == "--help") {
      fputs(kHelp, stdout);
      exit(0);
    } else if (name == "--version") {
      printf("qcclrun (qccl) %s\n", QCCLRUN_VERSION);
      exit(0);
    } else {
      usage_error("unknown option '" + arg + "'");
    }
  }
  o.program.assign(argv + i, argv + argc);
  if (o.cleanup_only) return o;
  if (o.nranks == 0) usage_error("the number of ranks is required (-n N)");
  if (o.program.empty()) usage_error("no program given");
  o.node_sizes = node_sizes(o);
  return o;
}

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

int exit_code_of(int wait_status) {
  return WIFSIGNALED(wait_status) ? 128 + WTERMSIG(wait_status) : WEXITSTATUS(wait_status);
}

std::string random_magic() {
  uint64_t v = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || read(fd, &v, sizeof(v)) != static_cast<ssize_t>(sizeof(v))) {
    fprintf(stderr, "qcclrun: cannot read /dev/urandom: %s\n", strerror(errno));
    exit(kExitLauncherError);
  }
  close(fd);
  char hex[17];
  snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(v));
  return hex;
}

// The first port of the kernel's ephemeral range, from which connect() and bind(port 0) take ports.
int ephemeral_low() {
  int low = 32768, high = 60999;
  if (FILE* f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    fclose(f);
  }
  return low;
}

// True when nothing holds `port` on any address (no SO_REUSEADDR: a socket in TIME_WAIT counts too).
bool port_is_free(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return free;
}

// A port that was free a moment ago, for a listener that a child binds later. It is taken below the
// ephemeral range: the outgoing connections of other jobs' ranks (and their port-0 listeners) take
// their ports from that range by the hundred, and one of them taking this port before rank 0 binds
// it made jobs fail at random. Below the range only a program binding the same port explicitly can
// take it (--root-port avoids even that); ports this process handed out already are skipped.
int find_free_port() {
  static std::vector<int> handed_out;
  const int high = ephemeral_low(), low = std::max(1024, high - 16384);
  if (high - low >= 256) {
    std::random_device random;
    const int span = high - low, start = static_cast<int>(random() % static_cast<unsigned>(span));
    for (int i = 0; i < span; ++i) {
      const int port = low + (start + i) % span;
      if (std::find(handed_out.begin(), handed_out.end(), port) != handed_out.end() || !port_is_free(port)) continue;
      handed_out.push_back(port);
      return port;
    }
  }
  fprintf(stderr, "qcclrun: no free port below the ephemeral range (%d) for QCCL_ROOT; pass --root-port\n", high);
  exit(kExitLauncherError);
}

// N ranks need 2N pipe ends open at once; the default soft limit of 1024 would stop at ~500 ranks.
// The CPUs this process may run on (its affinity mask), at least 1.
int available_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

void raise_fd_limit() {
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

// ---- Output forwarding ---------------------------------------------------------------------------

// One pipe from a rank (its stdout or its stderr) and the bytes of its unfinished line.
struct Stream {
  int fd = -1;
  int dest = 1;  // qcclrun's fd the lines go to
  std::string pending;
};

class Output {
 public:
  Output(int nranks, bool prefix) : prefix_(prefix) {
    for (int n = nranks - 1; n >= 10; n /= 10) width_++;
  }

  // Reads what is available (one read, so a chatty rank cannot starve the others) and writes every
  // complete line. Closes the stream at EOF, writing its last partial line.
  void pump(int rank, Stream& s) {
    char buf[64 * 1024];
    ssize_t n = read(s.fd, buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      close_stream(rank, s);
      return;
    }
    s.pending.append(buf, n);
    std::string out;
    size_t start = 0;
    for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1)
      append_line(rank, s.pending.data() + start, nl + 1 - start, &out);
    s.pending.erase(0, start);
    while (s.pending.size() >= kMaxLine) {
      append_line(rank, s.pending.data(), kMaxLine, &out);
      s.pending.erase(0, kMaxLine);
    }
    write_all(s.dest, out);
  }

  void close_stream(int rank, Stream& s) {
    if (s.fd < 0) return;
    std::string out;
    if (!s.pending.empty()) append_line(rank, s.pending.data(), s.pending.size(), &out);
    s.pending.clear();
    write_all(s.dest, out);
    close(s.fd);
    s.fd = -1;
  }

 private:
  // Every line written ends in '\n', with or without the prefix: a rank's last line without one (or a
  // piece of a line over kMaxLine) would otherwise run into the next rank's line.
  void append_line(int rank, const char* data, size_t len, std::string* out) const {
    if (prefix_) {
      char head[32];
      snprintf(head, sizeof(head), "[%*d] ", width_, rank);
      out->append(head);
    }
    out->append(data, len);
    if (data[len - 1] != '\n') out->push_back('\n');
  }

  // One write() per batch of whole lines, so a reader of a pipe (up to PIPE_BUF) or a file never
  // sees a torn line. A closed stdout (qcclrun | head) drops output but the job runs on.
  void write_all(int fd, const std::string& data) {
    size_t done = 0;
    while (done < data.size() && !broken_[fd]) {
      ssize_t n = write(fd, data.data() + done, data.size() - done);
      if (n > 0) {
        done += n;
      } else if (n < 0 && errno == EAGAIN) {  // stdout inherited in non-blocking mode
        pollfd p{fd, POLLOUT, 0};
        poll(&p, 1, 100);
      } else if (n < 0 && errno != EINTR) {
        broken_[fd] = true;
      }
    }
  }

  bool prefix_;
  int width_ = 1;
  bool broken_[3] = {false, false, false};
};

// In a child of qcclrun, after fork(): its own process group, killed with qcclrun, stdin from
// /dev/null and stdout/stderr onto out_fd/err_fd (-1: inherited), signals as exec expects them, the
// network namespace at ns_path (empty: this one) with the boot id of the file boot_id (empty: the
// machine's), then argv. Never returns.
[[noreturn]] void exec_child(pid_t parent, int out_fd, int err_fd, const std::string& ns_path,
                             const std::string& ns_name, const std::string& boot_id, char** argv, char** envp) {
  setpgid(0, 0);
  // A child must not outlive a qcclrun that is SIGKILLed (its namespaces are cleaned up later).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(kExitCannotRun);
  int devnull = open("/dev/null", O_RDONLY);
  dup2(devnull, 0);
  if (out_fd >= 0) dup2(out_fd, 1);
  if (err_fd >= 0) dup2(err_fd, 2);
  // The blocked mask and the ignored SIGPIPE would both survive exec.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  signal(SIGPIPE, SIG_DFL);
  if (!ns_path.empty()) {
    std::string e = qccl::tools::enter_netns(ns_path.c_str(), ns_name.c_str(), boot_id.c_str());
    if (!e.empty()) {
      dprintf(2, "qcclrun: cannot enter network namespace %s: %s\n", ns_name.c_str(), e.c_str());
      _exit(kExitCannotRun);
    }
  }
  execvpe(argv[0], argv, envp);
  int e = errno;
  dprintf(2, "qcclrun: cannot execute '%s': %s\n", argv[0], strerror(e));
  _exit(e == ENOENT ? kExitNotFound : kExitCannotRun);
}

// ---- The guardian ----------------------------------------------------------------------------------

// What a SIGKILLed qcclrun cannot do itself: kill what its ranks started. PR_SET_PDEATHSIG reaches a
// rank's own process only, so a shell's pipeline or a launcher's workers would run on. The guardian
// is a process forked before any rank; it reads the process groups of the ranks and helpers from a
// pipe whose write end only qcclrun holds (+group when one starts, -group once qcclrun has killed
// and reaped it, 0 at a normal end). End of file with groups still listed means qcclrun is gone: it
// kills them. It leaves qcclrun's session and keeps the termination signals blocked (as qcclrun
// had them), so that a terminal's Ctrl-C or a kill of qcclrun's group does not end it first.
class Guardian {
 public:
  Guardian() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      fprintf(stderr, "qcclrun: warning: no guardian (pipe: %s): a SIGKILLed qcclrun would leave the ranks' "
              "children running\n", strerror(errno));
      return;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[1]);
      guard(fds[0]);
    }
    close(fds[0]);
    if (pid < 0) {
      fprintf(stderr, "qcclrun: warning: no guardian (fork: %s): a SIGKILLed qcclrun would leave the ranks' "
              "children running\n", strerror(errno));
      close(fds[1]);
      return;
    }
    fcntl(fds[1], F_SETFL, O_NONBLOCK);  // qcclrun never waits for its guardian
    fd_ = fds[1];
  }
  ~Guardian() { dismiss(); }
  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  void watch(pid_t group) { tell(group); }
  void forget(pid_t group) { tell(-group); }
  // A normal end: nothing is left to kill. The guardian exits (qcclrun reaps it with the leftovers).
  void dismiss() {
    if (fd_ < 0) return;
    tell(0);
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  void tell(int32_t value) {
    // 4 bytes into a pipe are written whole. A full pipe (a stopped guardian) loses this message
    // only: closing it would read as qcclrun gone, and the guardian would kill the running ranks. A
    // dead guardian (EPIPE) loses the watch.
    if (fd_ >= 0 && write(fd_, &value, sizeof value) != static_cast<ssize_t>(sizeof value) && errno != EAGAIN) {
      close(fd_);
      fd_ = -1;
    }
  }

  [[noreturn]] static void guard(int fd) {
    setsid();
    fd = fcntl(fd, F_DUPFD, 3);  // out of 0 .. 2, where a qcclrun started with those closed had it
    int devnull = open("/dev/null", O_RDWR);  // so that no reader of qcclrun's output waits for us
    for (int i = 0; i < 3; i++) dup2(devnull, i);
    dup2(fd, 3);
    close_range(4, ~0U, 0);
    std::vector<pid_t> groups;
    for (int32_t value;;) {
      const ssize_t n = read(3, &value, sizeof value);
      if (n < 0 && errno == EINTR) continue;
      if (n != static_cast<ssize_t>(sizeof value)) break;  // end of file: qcclrun is gone
      if (value == 0) _exit(0);
      if (value > 0) groups.push_back(value);
      else groups.erase(std::remove(groups.begin(), groups.end(), -value), groups.end());
    }
    for (pid_t group : groups) kill(-group, SIGKILL);
    _exit(0);
  }

  int fd_ = -1;
};

// ---- Supervision -----------------------------------------------------------------------------------

struct Rank {
  pid_t pid = -1;     // also its process group id
  bool reaped = true;  // until launched, so that a rank never started does not hold the job
  Stream out, err;
};

class Job {
 public:
  // helpers: processes that serve the ranks (aggregators), stopped once every rank has exited;
  // aggregators: their addresses for QCCL_AGGREGATORS (empty: none).
  Job(const Options& o, const Netem* netem, int sigfd, Guardian& guardian, std::string root, std::string magic,
      std::vector<pid_t> helpers = {}, std::string aggregators = "")
      : opts_(o), netem_(netem), sigfd_(sigfd), guardian_(guardian), root_(std::move(root)), magic_(std::move(magic)),
        helpers_(std::move(helpers)), aggregators_(std::move(aggregators)), output_(o.nranks, o.prefix),
        ranks_(o.nranks) {}

  // Runs the job to the end and returns qcclrun's exit status.
  int run() {
    for (int r = 0; r < opts_.nranks && phase_ == Phase::kRunning; r++) launch(r);
    const double job_deadline = opts_.timeout_s > 0 ? now_s() + opts_.timeout_s : kNever;
    double drain_deadline = kNever;
    for (;;) {
      bool ranks_left = false, streams_open = false;
      for (const Rank& rk : ranks_) {
        ranks_left |= !rk.reaped;
        streams_open |= rk.out.fd >= 0 || rk.err.fd >= 0;
      }
      if (!ranks_left && !streams_open) break;
      // Output may trail the exits (pipe buffers), but a process that escaped its group with
      // setsid() must not keep the job alive by holding a pipe open.
      if (!ranks_left && drain_deadline == kNever) drain_deadline = now_s() + kDrainSeconds;
      double deadline = std::min(drain_deadline, phase_ == Phase::kRunning ? job_deadline : kill_at_);
      wait_for_events(deadline);
      double t = now_s();
      if (phase_ == Phase::kRunning && ranks_left && t >= job_deadline) {
        std::string running;
        for (int r = 0; r < opts_.nranks; r++)
          if (!ranks_[r].reaped) running += (running.empty() ? "" : ", ") + std::to_string(r);
        fprintf(stderr, "qcclrun: the job ran longer than --timeout %g s (still running: rank%s %s); stopping it\n",
                opts_.timeout_s, running.find(',') == std::string::npos ? "" : "s", running.c_str());
        stop(kExitTimeout, SIGTERM);
      }
      if (phase_ == Phase::kStopping && t >= kill_at_) kill_all();
      if (t >= drain_deadline)
        for (int r = 0; r < opts_.nranks; r++) {
          output_.close_stream(r, ranks_[r].out);
          output_.close_stream(r, ranks_[r].err);
        }
    }
    for (pid_t helper : helpers_)  // reaped below, with the ranks' leftovers (0: reaped already)
      if (helper > 0) kill(-helper, SIGTERM);
    guardian_.dismiss();
    reap_leftovers(now_s() + kDrainSeconds);
    return exit_code_;
  }

 private:
  enum class Phase { kRunning, kStopping, kKilled };

  std::vector<std::string> rank_environment(int r) const {
    // Later entries win: qcclrun's settings replace inherited values, and -x replaces both.
    const int host = netem_ ? netem_->host_of(r) : 0;
    const int local_rank = netem_ ? r - netem_->host_first_rank(host) : r;
    const int local_nranks = netem_ ? netem_->host_size(host) : opts_.nranks;
    std::vector<std::pair<std::string, std::string>> set = {
        {"QCCL_RANK", std::to_string(r)},
        {"QCCL_NRANKS", std::to_string(opts_.nranks)},
        {"QCCL_LOCAL_RANK", std::to_string(local_rank)},
        {"QCCL_LOCAL_NRANKS", std::to_string(local_nranks)},
        {"QCCL_ROOT", root_},
        {"QCCL_MAGIC", magic_},
    };
    if (!aggregators_.empty()) set.push_back({"QCCL_AGGREGATORS", aggregators_});
    if (netem_) {
      // Shared memory reaches only the ranks of the same emulated host (its boot id), tcp the others
      // through the host's link; the other transports (InfiniBand, ...) would bypass the links.
      set.push_back({"UCX_TLS", "sm,tcp,self"});
      set.push_back({"UCX_NET_DEVICES", netem_->host_ifname(host)});
      set.push_back({"QCCL_SOCKET_IFNAME", netem_->host_ifname(host)});
      // Each rank counts the ranks of its own host against the CPUs it may use, but the emulated
      // hosts share this machine's CPUs.
      if (opts_.nranks > available_cpus()) set.push_back({"QCCL_OVERSUBSCRIBED", "1"});
      // The ranks size their chunks to the link (QCCL_LINK_RATE).
      if (opts_.netem_bits) set.push_back({"QCCL_LINK_RATE", std::to_string(opts_.netem_bits) + "bit"});
    }
    set.insert(set.end(), opts_.exports.begin(), opts_.exports.end());
    std::map<std::string, std::string> merged;
    for (const auto& kv : set) merged[kv.first] = kv.second;
    std::vector<std::string> env;
    for (char** e = environ; *e; e++) {
      std::string entry = *e;
      if (!merged.count(entry.substr(0, entry.find('=')))) env.push_back(entry);
    }
    for (const auto& kv : merged) env.push_back(kv.first + "=" + kv.second);
    return env;
  }

  void launch(int r) {
    Rank& rk = ranks_[r];
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) out[0] = out[1] = -1;
    if (out[0] < 0 || pipe2(err, O_CLOEXEC) != 0) {
      fprintf(stderr, "qcclrun: cannot start rank %d: pipe: %s\n", r, strerror(errno));
      if (out[0] >= 0) {
        close(out[0]);
        close(out[1]);
      }
      stop(kExitLauncherError, SIGTERM);
      return;
    }
    std::vector<std::string> env = rank_environment(r);
    std::vector<char*> cenv, cargv;
    for (auto& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    for (const auto& a : opts_.program) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    const int host = netem_ ? netem_->host_of(r) : 0;
    std::string ns_name = netem_ ? netem_->host_netns(host) : "";
    std::string ns_path = netem_ ? netem_->host_netns_path(host) : "";
    std::string boot_id = netem_ ? netem_->host_boot_id_path(host) : "";
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) exec_child(parent, out[1], err[1], ns_path, ns_name, boot_id, cargv.data(), cenv.data());
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
      close(out[0]);
      close(err[0]);
      fprintf(stderr, "qcclrun: cannot start rank %d: fork: %s\n", r, strerror(errno));
      stop(kExitLauncherError, SIGTERM);
      return;
    }
    setpgid(pid, pid);  // also here, so that kill(-pid) works before the child has run
    guardian_.watch(pid);
    rk.pid = pid;
    rk.reaped = false;
    rk.out = Stream{out[0], 1, ""};
    rk.err = Stream{err[0], 2, ""};
    if (opts_.verbose) fprintf(stderr, "qcclrun: rank %d: pid %d\n", r, pid);
  }

  void wait_for_events(double deadline) {
    std::vector<pollfd> fds = {{sigfd_, POLLIN, 0}};
    std::vector<std::pair<int, Stream*>> streams;
    for (int r = 0; r < opts_.nranks; r++)
      for (Stream* s : {&ranks_[r].out, &ranks_[r].err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          streams.emplace_back(r, s);
        }
    int timeout_ms = -1;
    if (deadline != kNever)
      timeout_ms = static_cast<int>(std::max(0.0, std::ceil((deadline - now_s()) * 1000)));
    if (poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
    // Output first, so that lines written before a crash appear before the crash report.
    for (size_t i = 1; i < fds.size(); i++)
      if (fds[i].revents) output_.pump(streams[i - 1].first, *streams[i - 1].second);
    if (fds[0].revents) handle_signals();
  }

  void handle_signals() {
    signalfd_siginfo si;
    while (read(sigfd_, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
      int sig = static_cast<int>(si.ssi_signo);
      if (sig == SIGCHLD) {
        reap();
      } else if (phase_ == Phase::kRunning) {
        fprintf(stderr, "qcclrun: received %s; stopping the ranks\n", signal_name(sig).c_str());
        stop(128 + sig, sig);
      } else {
        kill_all();  // asked twice: do not wait for the grace period
      }
    }
  }

  // The SIGKILLed leftovers of the ranks become our children (we are their subreaper) once their
  // parents are gone. The job ends when they have really exited, so that the ports and files they
  // held are released when qcclrun returns. A process that left its rank's process group (setsid)
  // was never killed; it only costs the deadline and is left running.
  void reap_leftovers(double deadline) {
    for (;;) {
      pid_t pid = waitpid(-1, nullptr, WNOHANG);
      if (pid > 0) continue;
      if (pid < 0 || now_s() >= deadline) return;  // ECHILD: no children left
      pollfd p{sigfd_, POLLIN, 0};
      poll(&p, 1, static_cast<int>(std::ceil((deadline - now_s()) * 1000)));
      signalfd_siginfo si;
      while (read(sigfd_, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si)))
        if (si.ssi_signo != SIGCHLD) return;  // interrupted again: stop waiting
    }
  }

  // SIGCHLD is coalesced, so reap everything that has exited. Orphans of the ranks arrive here too
  // (we are their subreaper); they are simply reaped. Ranks that exited between two looks are
  // reported killed-by-signal first: which of them ended first is unknown, and where one was killed
  // the others' failures are usually its consequence (their peer died), so that one is blamed.
  void reap() {
    int status;
    pid_t pid;
    std::vector<std::pair<int, int>> exited;  // (rank, status)
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (int r = 0; r < opts_.nranks; r++)
        if (ranks_[r].pid == pid && !ranks_[r].reaped) exited.emplace_back(r, status);
      // An aggregator that dies leaves the ranks waiting for sums: say so (they fail at QCCL_TIMEOUT).
      // Its group goes with it, and its id, free from now on, is no longer one to kill (by the
      // guardian or at the end: another process may take it).
      for (size_t k = 0; k < helpers_.size(); k++)
        if (helpers_[k] == pid) {
          if (phase_ == Phase::kRunning)
            fprintf(stderr, "qcclrun: aggregator %zu (pid %d) exited while the ranks run\n", k, pid);
          kill(-pid, SIGKILL);
          guardian_.forget(pid);
          helpers_[k] = 0;
        }
    }
    std::stable_partition(exited.begin(), exited.end(), [](const auto& e) { return WIFSIGNALED(e.second); });
    for (const auto& [r, how] : exited) on_rank_exit(r, how);
  }

  void on_rank_exit(int r, int status) {
    Rank& rk = ranks_[r];
    rk.reaped = true;
    // Leftovers of the rank (background jobs of a shell) go with it. The group id cannot be reused
    // while they exist, so this cannot hit an unrelated process.
    kill(-rk.pid, SIGKILL);
    guardian_.forget(rk.pid);
    // What the rank wrote before it exited is all in the pipes now: forward it before the report.
    for (Stream* s : {&rk.out, &rk.err}) {
      pollfd p{s->fd, POLLIN, 0};
      while (s->fd >= 0 && poll(&p, 1, 0) > 0) output_.pump(r, *s);
    }
    bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    std::string how = WIFSIGNALED(status)
                          ? "was killed by signal " + signal_name(WTERMSIG(status)) +
                                (WCOREDUMP(status) ? " (core dumped)" : "")
                          : "exited with status " + std::to_string(WEXITSTATUS(status));
    if (failed && phase_ == Phase::kRunning) {
      fprintf(stderr, "qcclrun: rank %d %s\n", r, how.c_str());
      stop(exit_code_of(status), SIGTERM);
    } else if (opts_.verbose) {
      fprintf(stderr, "qcclrun: rank %d %s%s\n", r, how.c_str(),
              phase_ == Phase::kRunning ? "" : " (while stopping)");
    }
  }

  // Records why the job ends (the first reason wins), signals every live rank's group and arms the
  // SIGKILL deadline.
  void stop(int exit_code, int sig) {
    if (phase_ != Phase::kRunning) return;
    exit_code_ = exit_code;
    phase_ = Phase::kStopping;
    kill_at_ = now_s() + opts_.grace_s;
    for (const Rank& rk : ranks_)
      if (!rk.reaped) kill(-rk.pid, sig);
  }

  void kill_all() {
    if (phase_ == Phase::kStopping)
      for (const Rank& rk : ranks_)
        if (!rk.reaped) kill(-rk.pid, SIGKILL);
    phase_ = Phase::kKilled;
    kill_at_ = kNever;
  }

  const Options& opts_;
  const Netem* netem_;
  int sigfd_;
  Guardian& guardian_;
  std::string root_, magic_;
  std::vector<pid_t> helpers_;
  std::string aggregators_;
  Output output_;
  std::vector<Rank> ranks_;
  Phase phase_ = Phase::kRunning;
  int exit_code_ = 0;
  double kill_at_ = kNever;
};

// Starts IntSGD's aggregator k (qccl_aggregator, next to this executable) in its own process group,
// in the hub namespace with --netem; *address is where it listens. Returns its pid, or -1 after
// printing why it cannot start.
pid_t start_aggregator(int k, Netem* netem, Guardian& guardian, bool verbose, std::string* address) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(".");
  dir = dir.substr(0, dir.rfind('/'));
  const std::string program = dir + "/qccl_aggregator";
  if (access(program.c_str(), X_OK) != 0) {
    fprintf(stderr, "qcclrun: --aggregators: cannot run %s: %s\n", program.c_str(), strerror(errno));
    return -1;
  }
  if (netem) {
    std::string err = netem->add_aggregator(k);
    if (!err.empty()) {
      fprintf(stderr, "qcclrun: --aggregators: %s\n", err.c_str());
      return -1;
    }
    *address = netem->aggregator_ip(k) + ":" + std::to_string(29600 + k);
  } else {
    *address = "127.0.0.1:" + std::to_string(find_free_port());
  }
  std::vector<std::string> env;
  for (char** e = environ; *e; e++) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (!netem || (name != "UCX_TLS" && name != "UCX_NET_DEVICES")) env.push_back(entry);
  }
  if (netem) {  // the ranks reach it over tcp through the bridge
    env.push_back("UCX_TLS=tcp,self");
    env.push_back(std::string("UCX_NET_DEVICES=") + Netem::kBridgeName);
  }
  std::vector<std::string> args = {program, "--listen", *address};
  if (verbose) args.push_back("--verbose");
  std::vector<char*> cargv, cenv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : env) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  const std::string ns_path = netem ? netem->hub_netns_path() : "", ns_name = netem ? netem->hub_netns_name() : "";
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) exec_child(parent, -1, -1, ns_path, ns_name, "", cargv.data(), cenv.data());
  if (pid < 0) {
    fprintf(stderr, "qcclrun: cannot start aggregator %d: fork: %s\n", k, strerror(errno));
    return -1;
  }
  setpgid(pid, pid);
  guardian.watch(pid);
  if (verbose) fprintf(stderr, "qcclrun: aggregator %d: pid %d, %s\n", k, pid, address->c_str());
  return pid;
}

// The signals that would end qcclrun by default and that it can catch: each stops the job, whose
// network is then removed (SIGKILL alone cannot be caught; the next --netem job or --cleanup removes it).
constexpr int kTerminationSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM};

// The termination signal waiting in the blocked set, or 0.
int pending_termination_signal() {
  sigset_t pending;
  sigpending(&pending);
  for (int sig : kTerminationSignals)
    if (sigismember(&pending, sig)) return sig;
  return 0;
}

int cleanup_only(const Options& o) {
  std::string err = qccl::tools::netem_preflight("--cleanup");
  if (!err.empty()) {
    fprintf(stderr, "qcclrun: %s\n", err.c_str());
    return kExitLauncherError;
  }
  std::string errors;
  int removed = qccl::tools::cleanup_stale_namespaces(o.verbose, &errors);
  if (!errors.empty()) fprintf(stderr, "qcclrun: %s", errors.c_str());
  printf("qcclrun: removed %d stale network namespace%s\n", removed, removed == 1 ? "" : "s");
  return errors.empty() ? 0 : kExitLauncherError;
}

}  // namespace

int main(int argc, char** argv) {
  // An inherited SIGCHLD disposition of SIG_IGN would make the kernel reap children itself, and the
  // exit statuses of ranks and of ip/tc would be lost.
  signal(SIGCHLD, SIG_DFL);
  Options opts = parse_options(argc, argv);
  if (opts.cleanup_only) return cleanup_only(opts);
  if (!opts.node_sizes.empty()) {
    std::string err = qccl::tools::netem_preflight(opts.netem_bits ? "--netem" : "--nodes");
    if (!err.empty()) {
      fprintf(stderr, "qcclrun: %s\n", err.c_str());
      return kExitLauncherError;
    }
  }
  raise_fd_limit();

  // From here on, termination signals are events of the main loop (and end a network setup early).
  sigset_t handled;
  sigemptyset(&handled);
  sigaddset(&handled, SIGCHLD);
  for (int sig : kTerminationSignals) sigaddset(&handled, sig);
  sigprocmask(SIG_BLOCK, &handled, nullptr);
  int sigfd = signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sigfd < 0) {
    fprintf(stderr, "qcclrun: signalfd: %s\n", strerror(errno));
    return kExitLauncherError;
  }
  signal(SIGPIPE, SIG_IGN);
  prctl(PR_SET_CHILD_SUBREAPER, 1);

  std::unique_ptr<Netem> netem;
  if (!opts.node_sizes.empty()) {
    std::string errors;
    qccl::tools::cleanup_stale_namespaces(opts.verbose, &errors);
    if (!errors.empty()) fprintf(stderr, "qcclrun: warning: %s", errors.c_str());
    netem = std::make_unique<Netem>(getpid(), opts.node_sizes, opts.netem_bits, opts.verbose);
    if (opts.verbose) fputs(netem->describe().c_str(), stderr);
    std::string err = netem->build([] { return pending_termination_signal() != 0; });
    if (!err.empty()) {
      int sig = pending_termination_signal();
      if (sig == 0)
        fprintf(stderr, "qcclrun: cannot build the emulated network: %s\n", err.c_str());
      else
        fprintf(stderr, "qcclrun: received %s while building the network; removing it\n",
                signal_name(sig).c_str());
      netem->teardown();
      return sig ? 128 + sig : kExitLauncherError;
    }
  }

  Guardian guardian;  // before any rank or helper starts
  std::vector<pid_t> helpers;
  std::string aggregators;
  for (int k = 0; k < opts.aggregators; ++k) {
    std::string address;
    const pid_t pid = start_aggregator(k, netem.get(), guardian, opts.verbose, &address);
    if (pid < 0) {
      for (pid_t h : helpers) kill(-h, SIGKILL), waitpid(h, nullptr, 0);
      netem.reset();
      return kExitLauncherError;
    }
    helpers.push_back(pid);
    aggregators += (k ? "," : "") + address;
  }

  int port = opts.root_port ? opts.root_port : netem ? kNetemDefaultRootPort : find_free_port();
  std::string root = (netem ? netem->host_ip(0) : "127.0.0.1") + ":" + std::to_string(port);
  int status = Job(opts, netem.get(), sigfd, guardian, root, random_magic(), helpers, aggregators).run();
  netem.reset();  // deletes the namespaces, now that no rank is left in them
  return status;
}
