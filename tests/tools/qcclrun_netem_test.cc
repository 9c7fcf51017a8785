// tests/tools/qcclrun_netem_test.cc: qcclrun --netem. Needs root and iproute2; otherwise every test
// warns and passes without checking. The namespaces of a job are found by qcclrun's pid.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <string>
#include <thread>

#include "tests/tools/qcclrun_test_util.h"

using namespace qcclrun_test;

namespace {

bool can_netem() {
  if (geteuid() != 0) {
    WARN("skipped: --netem needs root");
    return false;
  }
  if (access("/usr/sbin/ip", X_OK) != 0 && access("/sbin/ip", X_OK) != 0) {
    WARN("skipped: iproute2 (ip, tc) is not installed");
    return false;
  }
  return true;
}

// Ranks print "ready" and then wait for the file `go` to appear (at most 20 s), so that the test can
// look at the network while the job certainly runs.
struct GoFile {
  std::string path = "/tmp/qcclrun_netem_test_go." + std::to_string(getpid());
  GoFile() { unlink(path.c_str()); }
  ~GoFile() { unlink(path.c_str()); }
  void create() const { close(open(path.c_str(), O_CREAT | O_WRONLY, 0600)); }
  std::string wait_script() const {
    return "i=0; while [ ! -e " + path + " ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done";
  }
};

}  // namespace

TEST_CASE("--netem puts each rank on its own emulated host and removes them at exit", "[qcclrun][netem]") {
  if (!can_netem()) return;
  GoFile go;
  Qcclrun job({"--netem", "1gbit", "-n", "3", "sh", "-c",
               "echo ns=$(ip netns identify) env=$UCX_TLS,$UCX_NET_DEVICES,$QCCL_SOCKET_IFNAME,$QCCL_ROOT"
               " addr=$(ip -4 -o addr show dev $QCCL_SOCKET_IFNAME | awk '{print $4}')"
               " qdisc=$(tc qdisc show dev $QCCL_SOCKET_IFNAME | awk '{print $2}'); echo ready; " +
                   go.wait_script()});
  std::vector<std::string> during;
  RunResult r = job.wait(30, [&](const std::string& out) {
    if (during.empty() && count(out, "ready") == 3) {
      during = namespaces_of(job.pid());
      go.create();
    }
  });
  REQUIRE(r.status == 0);
  const std::string p = "qccl" + std::to_string(job.pid());
  std::sort(during.begin(), during.end());
  CHECK(during == std::vector<std::string>{p + "h0", p + "h1", p + "h2", p + "hub"});
  for (int rank = 0; rank < 3; rank++) {
    std::string R = std::to_string(rank);
    CHECK(count(r.out, "[" + R + "] ns=" + p + "h" + R + " env=sm,tcp,self,veth" + R + ",veth" + R +
                           ",10.99.0.1:29500 addr=10.99.0." + std::to_string(rank + 1) +
                           "/16 qdisc=tbf\n") == 1);
  }
  CHECK(namespaces_of(job.pid()).empty());
  CHECK(access(("/run/qccl" + std::to_string(job.pid())).c_str(), F_OK) != 0);
}

// The value after `key` on rank R's line of `out` ("[R] ... key=VALUE ..."), or "" when absent.
static std::string field(const std::string& out, int rank, const std::string& key) {
  const std::string prefix = "[" + std::to_string(rank) + "] ";
  for (size_t at = out.find(prefix); at != std::string::npos; at = out.find(prefix, at + 1)) {
    if (at != 0 && out[at - 1] != '\n') continue;
    const size_t eol = out.find('\n', at);
    const std::string line = out.substr(at, eol == std::string::npos ? std::string::npos : eol - at);
    const size_t k = line.find(" " + key + "=");
    if (k == std::string::npos) continue;
    const size_t v = k + key.size() + 2;
    return line.substr(v, line.find(' ', v) == std::string::npos ? std::string::npos : line.find(' ', v) - v);
  }
  return "";
}

TEST_CASE("--nodes puts blocks of ranks on emulated hosts: one namespace, link and boot id each",
          "[qcclrun][netem]") {
  if (!can_netem()) return;
  std::string machine_boot_id;
  {
    FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
    REQUIRE(f);
    char buf[64] = {0};
    REQUIRE(fgets(buf, sizeof(buf), f));
    fclose(f);
    machine_boot_id = buf;
    machine_boot_id.erase(machine_boot_id.find_last_not_of("\n") + 1);
  }
  const std::string script =
      "echo ns=$(ip netns identify) local=$QCCL_LOCAL_RANK/$QCCL_LOCAL_NRANKS dev=$UCX_NET_DEVICES"
      " boot=$(cat /proc/sys/kernel/random/boot_id) qdisc=$(tc qdisc show dev $QCCL_SOCKET_IFNAME | awk '{print $2}')";
  struct Case {
    std::vector<std::string> args;
    std::vector<int> host_of_rank;
    std::string qdisc;
  };
  for (const Case& c : {Case{{"--nodes", "2", "-n", "5"}, {0, 0, 0, 1, 1}, "noqueue"},
                        Case{{"--nodes", "1,3", "--netem", "1gbit", "-n", "4"}, {0, 1, 1, 1}, "tbf"}}) {
    std::vector<std::string> args = c.args;
    args.insert(args.end(), {"sh", "-c", script});
    Qcclrun job(args);
    RunResult r = job.wait(30);
    INFO(r.out << r.err);
    REQUIRE(r.status == 0);
    const std::string p = "qccl" + std::to_string(job.pid());
    std::vector<int> local(c.host_of_rank.size()), size(c.host_of_rank.size());
    for (size_t i = 0; i < c.host_of_rank.size(); ++i) {
      for (size_t j = 0; j < i; ++j) local[i] += c.host_of_rank[j] == c.host_of_rank[i];
      for (int h : c.host_of_rank) size[i] += h == c.host_of_rank[i];
    }
    for (int rank = 0; rank < static_cast<int>(c.host_of_rank.size()); ++rank) {
      const std::string host = std::to_string(c.host_of_rank[rank]);
      CHECK(field(r.out, rank, "ns") == p + "h" + host);
      CHECK(field(r.out, rank, "dev") == "veth" + host);
      CHECK(field(r.out, rank, "local") == std::to_string(local[rank]) + "/" + std::to_string(size[rank]));
      CHECK(field(r.out, rank, "qdisc") == c.qdisc);
      const std::string boot = field(r.out, rank, "boot");
      CHECK(boot.size() == 36);
      CHECK(boot != machine_boot_id);
      for (int other = 0; other < rank; ++other)
        CHECK((field(r.out, other, "boot") == boot) == (c.host_of_rank[other] == c.host_of_rank[rank]));
    }
    CHECK(namespaces_of(job.pid()).empty());
    CHECK(access(("/run/" + p).c_str(), F_OK) != 0);
  }
}

TEST_CASE("--nodes refuses host lists that do not match -n", "[qcclrun][netem]") {
  for (auto args : {std::vector<std::string>{"--nodes", "4", "-n", "3", "true"},
                    std::vector<std::string>{"--nodes", "1,1", "-n", "3", "true"},
                    std::vector<std::string>{"--nodes", "1,,2", "-n", "3", "true"},
                    std::vector<std::string>{"--nodes", "0,3", "-n", "3", "true"}}) {
    RunResult r = run_qcclrun(args);
    INFO(r.err);
    CHECK(r.status == 125);
    CHECK(r.err.find("--nodes") != std::string::npos);
  }
}

TEST_CASE("--netem removes its namespaces when a rank fails or qcclrun is interrupted",
          "[qcclrun][netem]") {
  if (!can_netem()) return;
  SECTION("a rank fails") {
    Qcclrun job({"--netem", "100mbit", "-n", "3", "sh", "-c", "[ $QCCL_RANK = 2 ] && exit 7; sleep 60"});
    RunResult r = job.wait(20);
    CHECK(r.status == 7);
    CHECK(r.seconds < 10);
    CHECK(namespaces_of(job.pid()).empty());
  }
  for (int sig : {SIGINT, SIGQUIT}) {  // SIGQUIT (Ctrl-\ at a terminal) left the namespaces behind
    SECTION(std::string("signal ") + std::to_string(sig)) {
      Qcclrun job({"--netem", "100mbit", "-n", "2", "sh", "-c", "echo ready; exec sleep 60"});
      size_t seen = 0;
      RunResult r = job.wait(20, [&](const std::string& out) {
        if (seen == 0 && count(out, "ready") == 2) {
          seen = namespaces_of(job.pid()).size();
          kill(job.pid(), sig);
        }
      });
      CHECK(r.status == 128 + sig);
      CHECK(r.seconds < 10);
      CHECK(seen == 3);
      CHECK(namespaces_of(job.pid()).empty());
    }
  }
}

TEST_CASE("--netem limits the bandwidth between ranks", "[qcclrun][netem]") {
  if (!can_netem()) return;
  // 3 MB at 100mbit take ~0.25 s. Only an upper bound is checked: a busy machine can only be slower.
  RunResult r = run_qcclrun({"--netem", "100mbit", "-n", "2", QCCL_TCP_RATE_PROBE_PATH, "3000000"}, 30);
  REQUIRE(r.status == 0);
  size_t pos = r.out.find("[0] rate_bits=");
  REQUIRE(pos != std::string::npos);
  double rate = std::stod(r.out.substr(pos + 14));
  INFO("measured " << rate / 1e6 << " Mbit/s under a 100mbit tbf");
  CHECK(rate > 0);
  CHECK(rate <= 1.1e8);
}

TEST_CASE("qcclrun --cleanup removes namespaces of dead qcclrun jobs only", "[qcclrun][netem]") {
  if (!can_netem()) return;
  // A pid that certainly belonged to a process which is gone now.
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  const std::string stale = "qccl" + std::to_string(dead) + "hub";
  // A namespace that merely starts like ours must survive.
  const std::string other = "qcclx" + std::to_string(dead);
  REQUIRE(system(("ip netns add " + stale + " && ip netns add " + other).c_str()) == 0);
  // And the dead job's directory of boot ids goes too.
  const std::string dir = "/run/qccl" + std::to_string(dead);
  REQUIRE(system(("mkdir -p " + dir + " && echo x > " + dir + "/host0.boot_id").c_str()) == 0);
  // A process left running in the dead job's namespace (a rank's child outlives a SIGKILLed
  // qcclrun) is killed with it; one in the other namespace is not.
  auto run_in = [](const std::string& ns) {
    pid_t pid = fork();
    if (pid == 0) {
      execlp("ip", "ip", "netns", "exec", ns.c_str(), "sleep", "60", static_cast<char*>(nullptr));
      _exit(127);
    }
    return pid;
  };
  const pid_t left = run_in(stale), bystander = run_in(other);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // until ip has joined the namespace
  RunResult r = run_qcclrun({"--cleanup"});
  CHECK(r.status == 0);
  int status = 0;
  CHECK(waitpid(left, &status, 0) == left);
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
  CHECK(waitpid(bystander, &status, WNOHANG) == 0);  // still running
  kill(bystander, SIGKILL);
  waitpid(bystander, nullptr, 0);
  CHECK(namespaces_of(dead).empty());
  CHECK(access(dir.c_str(), F_OK) != 0);
  CHECK(access(("/var/run/netns/" + other).c_str(), F_OK) == 0);
  CHECK(system(("ip netns del " + other).c_str()) == 0);
  if (system(("ip netns del " + stale + " 2>/dev/null").c_str()) != 0) {
  }  // normally gone already
}

TEST_CASE("--netem and --cleanup refuse to run without root", "[qcclrun][netem]") {
  if (!can_netem()) return;
  if (access("/usr/bin/setpriv", X_OK) != 0) {
    WARN("skipped: setpriv (util-linux) is not installed");
    return;
  }
  for (const char* args : {"--netem 1gbit -n 2 true", "--cleanup"}) {
    std::string cmd = std::string("/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups ") +
                      QCCL_QCCLRUN_PATH + " " + args + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    REQUIRE(p);
    std::string out;
    char buf[512];
    while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
    int st = pclose(p);
    INFO(out);
    if (count(out, "Permission denied") > 0) {
      WARN("skipped: user nobody cannot execute the build tree's qcclrun");
      continue;
    }
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 125);
    CHECK(count(out, "needs root") == 1);
  }
}
