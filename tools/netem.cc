// tools/netem.cc: qcclrun's emulated network (see netem.h).
#include "netem.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace qccl::tools {

namespace {

constexpr const char* kNetnsDir = "/var/run/netns";
constexpr const char* kRunDir = "/run";  // the jobs' boot-id directories, /run/qccl<pid>
constexpr const char* kBootIdFile = "/proc/sys/kernel/random/boot_id";
constexpr const char* kBridge = "br0";

std::string g_ip_path;  // set by netem_preflight()
std::string g_tc_path;

// Looks in PATH and then in the sbin directories, which are often missing from a non-login PATH.
std::string find_program(const char* name) {
  std::string dirs = getenv("PATH") ? getenv("PATH") : "";
  dirs += ":/usr/sbin:/sbin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    if (!dir.empty()) {
      std::string candidate = dir + "/" + name;
      if (access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    start = end + 1;
  }
  return "";
}

std::string join(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

std::string trim(std::string s) {
  while (!s.empty() && isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

// Reads /proc/<pid>/comm ("" when the process does not exist).
std::string process_name(pid_t pid) {
  std::string path = pid == 0 ? "/proc/self/comm" : "/proc/" + std::to_string(pid) + "/comm";
  FILE* f = fopen(path.c_str(), "r");
  if (!f) return "";
  char buf[64] = {0};
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  return trim(std::string(buf, n));
}

// Parses "qccl<pid>hub", "qccl<pid>h<k>" (a host), "qccl<pid>r<i>" (a rank, as jobs of earlier
// versions named them) or, with `dir`, the job directory "qccl<pid>"; returns the pid or -1 for other
// names.
pid_t owner_of(const std::string& name, bool dir) {
  if (name.compare(0, 4, "qccl") != 0) return -1;
  size_t i = 4, digits_start = 4;
  while (i < name.size() && isdigit(static_cast<unsigned char>(name[i]))) i++;
  if (i == digits_start || i - digits_start > 9) return -1;
  std::string rest = name.substr(i);
  bool is_member = rest.size() > 1 && (rest[0] == 'h' || rest[0] == 'r') &&
                   std::all_of(rest.begin() + 1, rest.end(), [](char c) { return isdigit(c); });
  if (dir ? !rest.empty() : (rest != "hub" && !is_member)) return -1;
  return static_cast<pid_t>(atol(name.substr(digits_start, i - digits_start).c_str()));
}

// Whether the qcclrun job `owner` is gone. The pid may have been reused by an unrelated process, so a
// live pid only protects the job when that process is a qcclrun too.
bool job_is_gone(pid_t owner, const std::string& self_name) {
  bool alive = kill(owner, 0) == 0 || errno == EPERM;
  return !(alive && process_name(owner) == self_name);
}

// Removes a job directory and the files in it (it holds no subdirectories).
std::string remove_job_dir(const std::string& path) {
  DIR* dir = opendir(path.c_str());
  if (!dir) return errno == ENOENT ? "" : "opendir " + path + ": " + strerror(errno);
  while (dirent* e = readdir(dir)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") unlink((path + "/" + name).c_str());
  }
  closedir(dir);
  if (rmdir(path.c_str()) != 0) return "rmdir " + path + ": " + strerror(errno);
  return "";
}

// A random version-4 UUID, as the kernel writes boot ids.
std::string random_boot_id() {
  unsigned char b[16] = {0};
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  ssize_t got = fd >= 0 ? read(fd, b, sizeof(b)) : -1;
  if (fd >= 0) close(fd);
  if (got != static_cast<ssize_t>(sizeof(b))) return "";
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);
  char text[40];
  snprintf(text, sizeof(text), "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
           b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return text;
}

}  // namespace

TbfParams tbf_params_for(uint64_t rate_bits) {
  TbfParams p;
  p.rate_bits = rate_bits;
  p.burst_bytes = std::max<uint64_t>(16384, rate_bits / 8 / 500);  // 2 ms of traffic
  p.latency_ms = 10;
  return p;
}

std::string netem_preflight(const std::string& option) {
  if (geteuid() != 0)
    return option + " needs root (it creates and deletes network namespaces, veths and tc qdiscs); "
           "run qcclrun as root" + (option == "--cleanup" ? "" : " or leave out " + option);
  g_ip_path = find_program("ip");
  g_tc_path = find_program("tc");
  if (g_ip_path.empty() || g_tc_path.empty())
    return option + " needs the iproute2 tools, but `" + (g_ip_path.empty() ? "ip" : "tc") +
           "` was not found in PATH, /usr/sbin or /sbin (Debian: apt-get install iproute2)";
  return "";
}

std::string run_command(const std::vector<std::string>& argv, bool verbose) {
  if (verbose) fprintf(stderr, "qcclrun: + %s\n", join(argv).c_str());
  int err_pipe[2];
  if (pipe2(err_pipe, O_CLOEXEC) != 0) return std::string("pipe: ") + strerror(errno);
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    close(err_pipe[0]);
    close(err_pipe[1]);
    return std::string("fork: ") + strerror(errno);
  }
  if (pid == 0) {
    // qcclrun blocks its termination signals (they arrive through a signalfd); exec keeps the mask.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    setpgid(0, 0);
    int devnull = open("/dev/null", O_RDWR);
    dup2(devnull, 0);
    dup2(verbose ? 2 : devnull, 1);
    dup2(err_pipe[1], 2);
    execv(cargv[0], cargv.data());
    dprintf(2, "cannot execute %s: %s", cargv[0], strerror(errno));
    _exit(127);
  }
  close(err_pipe[1]);
  std::string err;
  char buf[4096];
  for (;;) {
    ssize_t n = read(err_pipe[0], buf, sizeof(buf));
    if (n > 0) err.append(buf, n);
    else if (n == 0 || errno != EINTR) break;
  }
  close(err_pipe[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  std::string how = WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                      : "signal " + std::to_string(WTERMSIG(status));
  err = trim(err);
  return "`" + join(argv) + "` failed (" + how + ")" + (err.empty() ? "" : ": " + err);
}

// Kills what still runs in network namespace `name`: the children a rank started outlive a qcclrun
// that was SIGKILLed (the parent-death signal reaches the rank's main process only). A process is in
// it when its /proc/PID/ns/net is the namespace's file (the comparison `ip netns identify` makes).
void kill_processes_in(const std::string& name, bool verbose) {
  struct stat ns;
  if (stat((std::string(kNetnsDir) + "/" + name).c_str(), &ns) != 0) return;
  DIR* proc = opendir("/proc");
  if (!proc) return;
  while (dirent* e = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (*end || pid <= 0 || pid == getpid()) continue;
    struct stat in;
    if (stat(("/proc/" + std::string(e->d_name) + "/ns/net").c_str(), &in) != 0) continue;
    if (in.st_dev != ns.st_dev || in.st_ino != ns.st_ino) continue;
    if (verbose) fprintf(stderr, "qcclrun: killing process %ld, left in %s\n", pid, name.c_str());
    kill(static_cast<pid_t>(pid), SIGKILL);
  }
  closedir(proc);
}

int cleanup_stale_namespaces(bool verbose, std::string* errors) {
  if (g_ip_path.empty()) g_ip_path = find_program("ip");
  DIR* dir = opendir(kNetnsDir);
  if (!dir) return 0;  // no namespace was ever added on this machine
  std::vector<std::string> stale;
  const std::string self_name = process_name(0);
  while (dirent* e = readdir(dir)) {
    pid_t owner = owner_of(e->d_name, false);
    if (owner > 0 && owner != getpid() && job_is_gone(owner, self_name)) stale.push_back(e->d_name);
  }
  closedir(dir);
  if (DIR* run = opendir(kRunDir)) {
    while (dirent* e = readdir(run)) {
      pid_t owner = owner_of(e->d_name, true);
      if (owner <= 0 || owner == getpid() || !job_is_gone(owner, self_name)) continue;
      std::string err = remove_job_dir(std::string(kRunDir) + "/" + e->d_name);
      if (!err.empty()) *errors += err + "\n";
    }
    closedir(run);
  }
  std::sort(stale.begin(), stale.end());
  int removed = 0;
  for (const auto& name : stale) {
    kill_processes_in(name, verbose);
    std::string err = run_command({g_ip_path, "netns", "del", name}, verbose);
    if (err.empty()) {
      removed++;
      if (verbose) fprintf(stderr, "qcclrun: removed stale network namespace %s\n", name.c_str());
    } else {
      *errors += err + "\n";
    }
  }
  return removed;
}

Netem::Netem(pid_t job_id, std::vector<int> host_sizes, uint64_t rate_bits, bool verbose)
    : job_id_(job_id), host_sizes_(std::move(host_sizes)),
      tbf_(rate_bits ? tbf_params_for(rate_bits) : TbfParams{}), verbose_(verbose) {
  for (size_t h = 0; h < host_sizes_.size(); ++h) host_of_rank_.insert(host_of_rank_.end(), host_sizes_[h], static_cast<int>(h));
}

Netem::~Netem() { teardown(); }

std::string Netem::hub_netns() const { return "qccl" + std::to_string(job_id_) + "hub"; }

std::string Netem::job_dir() const { return std::string(kRunDir) + "/qccl" + std::to_string(job_id_); }

int Netem::host_first_rank(int host) const {
  int first = 0;
  for (int h = 0; h < host; ++h) first += host_sizes_[static_cast<size_t>(h)];
  return first;
}

std::string Netem::host_netns(int host) const {
  return "qccl" + std::to_string(job_id_) + "h" + std::to_string(host);
}

std::string Netem::host_boot_id_path(int host) const { return job_dir() + "/host" + std::to_string(host) + ".boot_id"; }

// 10.99.0.0/16: every job has its own bridge, so concurrent jobs may reuse the same addresses.
std::string Netem::host_ip(int host) const {
  int address = host + 1;
  return "10.99." + std::to_string(address / 256) + "." + std::to_string(address % 256);
}

std::string Netem::ip_cmd(std::vector<std::string> args) {
  args.insert(args.begin(), g_ip_path);
  return run_command(args, verbose_);
}

std::string Netem::tc_cmd(std::vector<std::string> args) {
  args.insert(args.begin(), g_tc_path);
  return run_command(args, verbose_);
}

std::string Netem::build(const std::function<bool()>& interrupted) {
  const std::string hub = hub_netns();
  const std::vector<std::string> tbf = {"root", "tbf", "rate", std::to_string(tbf_.rate_bits) + "bit",
                                        "burst", std::to_string(tbf_.burst_bytes), "latency",
                                        std::to_string(tbf_.latency_ms) + "ms"};
  auto shape = [&](const std::string& ns, const std::string& dev) {
    std::vector<std::string> args = {"-n", ns, "qdisc", "add", "dev", dev};
    args.insert(args.end(), tbf.begin(), tbf.end());
    return tc_cmd(args);
  };
  std::string err;
  auto add_netns = [&](const std::string& ns) {
    std::string e = ip_cmd({"netns", "add", ns});
    if (e.empty()) created_.push_back(ns);
    return e;
  };
  // The boot ids first: a directory only root may write, one file per host.
  if (mkdir(job_dir().c_str(), 0755) != 0 && !(errno == EEXIST && remove_job_dir(job_dir()).empty() &&
                                                 mkdir(job_dir().c_str(), 0755) == 0))
    return "mkdir " + job_dir() + ": " + strerror(errno);
  job_dir_made_ = true;
  for (int h = 0; h < hosts(); h++) {
    const std::string id = random_boot_id();
    FILE* f = id.empty() ? nullptr : fopen(host_boot_id_path(h).c_str(), "w");
    if (!f) return "cannot write " + host_boot_id_path(h) + ": " + (id.empty() ? "no random bytes" : strerror(errno));
    fprintf(f, "%s\n", id.c_str());
    if (fclose(f) != 0) return "cannot write " + host_boot_id_path(h) + ": " + strerror(errno);
  }
  if (!(err = add_netns(hub)).empty()) return err;
  if (!(err = ip_cmd({"-n", hub, "link", "add", kBridge, "type", "bridge"})).empty()) return err;
  if (!(err = ip_cmd({"-n", hub, "link", "set", kBridge, "up"})).empty()) return err;
  for (int h = 0; h < hosts(); h++) {
    if (interrupted()) return "interrupted";
    const std::string ns = host_netns(h), dev = host_ifname(h), hub_dev = "hub" + std::to_string(h);
    // The veth is created inside the hub with its peer placed straight into the rank's namespace,
    // so no interface ever appears in the host namespace, even for a moment.
    std::vector<std::vector<std::string>> steps = {
        {"-n", hub, "link", "add", hub_dev, "type", "veth", "peer", "name", dev, "netns", ns},
        {"-n", hub, "link", "set", hub_dev, "master", kBridge, "up"},
        {"-n", ns, "addr", "add", host_ip(h) + "/16", "dev", dev},
        {"-n", ns, "link", "set", "lo", "up"},
        {"-n", ns, "link", "set", dev, "up"},
    };
    if (!(err = add_netns(ns)).empty()) return err;
    for (const auto& step : steps)
      if (!(err = ip_cmd(step)).empty()) return err;
    // Each qdisc shapes only its own egress: the host side limits what the host sends, the hub side
    // what it receives, so incast onto one host is limited to RATE as on a real switch port.
    if (!tbf_.rate_bits) continue;  // unshaped
    if (!(err = shape(ns, dev)).empty()) return err;
    if (!(err = shape(hub, hub_dev)).empty()) return err;
  }
  return interrupted() ? "interrupted" : "";
}

std::string Netem::add_aggregator(int k) {
  return ip_cmd({"-n", hub_netns(), "addr", "add", aggregator_ip(k) + "/16", "dev", kBridge});
}

void Netem::teardown() {
  // Deleting a host's namespace destroys its veth pair; deleting the hub destroys the bridge.
  while (!created_.empty()) {
    std::string err = ip_cmd({"netns", "del", created_.back()});
    if (!err.empty()) fprintf(stderr, "qcclrun: warning: %s\n", err.c_str());
    created_.pop_back();
  }
  if (job_dir_made_) {
    std::string err = remove_job_dir(job_dir());
    if (!err.empty()) fprintf(stderr, "qcclrun: warning: %s\n", err.c_str());
    job_dir_made_ = false;
  }
}

std::string Netem::describe() const {
  char head[256];
  if (tbf_.rate_bits)
    snprintf(head, sizeof(head),
             "qcclrun: netem: hub namespace %s with bridge %s; tbf rate %llubit burst %llu latency %ums "
             "on both directions of every veth\n",
             hub_netns().c_str(), kBridge, static_cast<unsigned long long>(tbf_.rate_bits),
             static_cast<unsigned long long>(tbf_.burst_bytes), tbf_.latency_ms);
  else
    snprintf(head, sizeof(head), "qcclrun: netem: hub namespace %s with bridge %s; links unshaped\n",
             hub_netns().c_str(), kBridge);
  std::string s = head;
  for (int h = 0; h < hosts(); h++) {
    const int first = host_first_rank(h), last = first + host_size(h) - 1;
    s += "qcclrun: netem: host " + std::to_string(h) + " (rank" + (first == last ? " " : "s ") + std::to_string(first) +
         (first == last ? "" : ".." + std::to_string(last)) + "): namespace " + host_netns(h) + ", " + host_ifname(h) +
         " " + host_ip(h) + "/16 <-> hub" + std::to_string(h) + ", boot id " + host_boot_id_path(h) + "\n";
  }
  return s;
}

std::string enter_netns(const char* netns_path, const char* netns_name, const char* boot_id_path) {
  int fd = open(netns_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::string("open ") + netns_path + ": " + strerror(errno);
  int rc = setns(fd, CLONE_NEWNET);
  int saved = errno;
  close(fd);
  if (rc != 0) return std::string("setns ") + netns_path + ": " + strerror(saved);
  // The same steps as iproute2's netns_switch(): a private mount namespace whose /sys belongs to the
  // new network namespace, with nothing propagating back to the host.
  if (unshare(CLONE_NEWNS) != 0) return std::string("unshare(CLONE_NEWNS): ") + strerror(errno);
  if (mount("", "/", nullptr, MS_SLAVE | MS_REC, nullptr) != 0)
    return std::string("making / a slave mount: ") + strerror(errno);
  unsigned long flags = 0;
  if (umount2("/sys", MNT_DETACH) != 0) {
    // Could not unmount it, so overlay it; a read-only /sys cannot be shadowed read-write.
    struct statvfs st;
    if (statvfs("/sys", &st) == 0 && (st.f_flag & ST_RDONLY)) flags = MS_RDONLY;
  }
  if (mount(netns_name, "/sys", "sysfs", flags, nullptr) != 0)
    return std::string("mounting sysfs on /sys: ") + strerror(errno);
  if (boot_id_path && *boot_id_path && mount(boot_id_path, kBootIdFile, nullptr, MS_BIND, nullptr) != 0)
    return std::string("bind-mounting ") + boot_id_path + " on " + kBootIdFile + ": " + strerror(errno);
  return "";
}

}  // namespace qccl::tools
