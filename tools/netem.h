// tools/netem.h: qcclrun's emulated hosts and network. Each emulated host (one rank, or a block of
// ranks with --nodes) gets its own network namespace with one veth into a Linux bridge that lives in a
// separate "hub" namespace, so the machine's own interfaces, routes and qdiscs are never touched. Both
// directions of every veth are shaped with tc tbf, which makes each host a RATE full-duplex NIC on a
// non-blocking switch. Each host also gets its own boot id (a file bind-mounted over
// /proc/sys/kernel/random/boot_id in its ranks' mount namespaces): qccl and UCX both tell hosts apart
// by it, so ranks of one emulated host talk over shared memory, ranks of two hosts over tcp through
// the shaped link, and every rank's node map shows the emulated hosts. Recipe and pitfalls:
// specs/transports.md §4.
//
// Everything here is setup code for a launcher: plain, synchronous, and it reports errors as strings
// (empty string = success) that qcclrun prints as they are.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace qccl::tools {


// tbf parameters for a rate. The bucket holds 2 ms of traffic (at least 16 KiB): measured with
// ucx_perftest over one TCP stream, a bucket that small in time still reaches ~0.95 of nominal at
// 100mbit..10gbit, whereas a fixed 256 KiB bucket loses ~15% at 10gbit. The queue may hold 10 ms.
struct TbfParams {
  uint64_t rate_bits = 0;
  uint64_t burst_bytes = 0;
  unsigned latency_ms = 0;
};
TbfParams tbf_params_for(uint64_t rate_bits);

// Checks what `option` (--netem or --cleanup) needs: root, `ip` and `tc`; remembers where ip and tc
// are. "" when usable.
std::string netem_preflight(const std::string& option);

// Runs argv (argv[0] an absolute path) without a shell, in its own process group so that a Ctrl-C
// on the terminal cannot kill it halfway through a teardown. "" on exit status 0, otherwise a message
// quoting the command and its stderr.
std::string run_command(const std::vector<std::string>& argv, bool verbose);

// Deletes namespaces named qccl<pid>... whose qcclrun is gone (crashed or SIGKILLed); their veths and
// bridge go with them, and so does the job's directory of boot ids. Returns how many namespaces were
// removed; failures are appended to *errors.
int cleanup_stale_namespaces(bool verbose, std::string* errors);

class Netem {
 public:
  // host_sizes: the ranks of each emulated host, in rank order (host 0 has ranks 0 .. host_sizes[0]-1,
  // and so on). rate_bits: the rate of each host's link, 0 for an unshaped link. Names derive from
  // job_id (qcclrun's pid), so concurrent jobs never collide: namespaces qccl<pid>hub and
  // qccl<pid>h<k>, boot ids in /run/qccl<pid>/. Interface names repeat across namespaces, which is
  // allowed.
  Netem(pid_t job_id, std::vector<int> host_sizes, uint64_t rate_bits, bool verbose);
  ~Netem();  // tears down whatever build() made
  Netem(const Netem&) = delete;
  Netem& operator=(const Netem&) = delete;

  // Builds the network. interrupted() is polled between steps so that a Ctrl-C during a long setup
  // stops early; the caller still calls teardown(). "" on success.
  std::string build(const std::function<bool()>& interrupted);
  // Deletes every namespace build() made (idempotent). Errors are printed as warnings.
  void teardown();

  int hosts() const { return static_cast<int>(host_sizes_.size()); }
  int host_of(int rank) const { return host_of_rank_[static_cast<size_t>(rank)]; }
  int host_size(int host) const { return host_sizes_[static_cast<size_t>(host)]; }
  int host_first_rank(int host) const;
  std::string host_netns(int host) const;
  std::string host_netns_path(int host) const { return "/var/run/netns/" + host_netns(host); }
  std::string host_ifname(int host) const { return "veth" + std::to_string(host); }
  std::string host_ip(int host) const;
  std::string host_boot_id_path(int host) const;  // the file build() wrote for the host's ranks
  // IntSGD's aggregators live in the hub namespace, on the bridge itself: their traffic is shaped
  // only by the ranks' links, as a switch's backplane would not be. add_aggregator gives the bridge
  // aggregator k's address (k < 250).
  std::string add_aggregator(int k);
  std::string aggregator_ip(int k) const { return "10.99.255." + std::to_string(250 - k); }
  std::string hub_netns_name() const { return hub_netns(); }
  std::string hub_netns_path() const { return "/var/run/netns/" + hub_netns(); }
  static constexpr const char* kBridgeName = "br0";
  std::string describe() const;  // the network, for --verbose

 private:
  std::string hub_netns() const;
  std::string ip_cmd(std::vector<std::string> args);
  std::string tc_cmd(std::vector<std::string> args);

  std::string job_dir() const;  // /run/qccl<pid>: the hosts' boot ids

  pid_t job_id_;
  std::vector<int> host_sizes_;
  std::vector<int> host_of_rank_;
  TbfParams tbf_;  // rate_bits 0: unshaped
  bool verbose_;
  std::vector<std::string> created_;  // namespaces to delete, in creation order
  bool job_dir_made_ = false;
};

// For a forked child before exec: joins the network namespace at netns_path and, like
// `ip netns exec`, remounts /sys in a private mount namespace. Without that, /sys/class/net still
// lists the host's interfaces and UCX rejects UCX_NET_DEVICES=veth<i> as "not available". With a
// boot_id_path (not empty), also bind-mounts that file over /proc/sys/kernel/random/boot_id in the
// same mount namespace: the child then belongs to that emulated host.
// Returns "" or an error message. qcclrun is single-threaded, so this may allocate after fork().
std::string enter_netns(const char* netns_path, const char* netns_name, const char* boot_id_path);

}  // namespace qccl::tools
