// tests/tools/qcclrun_test_util.h: runs the qcclrun binary under test (QCCL_QCCLRUN_PATH) as a child
// process and collects its stdout, stderr and exit status, with a hard time limit so that a hang in
// qcclrun fails the test instead of stalling the suite.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace qcclrun_test {

inline double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct RunResult {
  int status = -1;  // exit status, 128+n for signal n, -1 when the time limit killed qcclrun
  std::string out, err;
  double seconds = 0;
};

class Qcclrun {
 public:
  // Starts `qcclrun args...`; env entries "NAME=VALUE" are added to qcclrun's own environment.
  explicit Qcclrun(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) abort();
    start_ = now_s();
    pid_ = started_pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      dup2(err[1], 2);
      for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> argv = {const_cast<char*>(QCCL_QCCLRUN_PATH)};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(99);
    }
    close(out[1]);
    close(err[1]);
    fds_[0] = out[0];
    fds_[1] = err[0];
  }
  ~Qcclrun() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    for (int fd : fds_)
      if (fd >= 0) close(fd);
  }

  pid_t pid() const { return started_pid_; }  // still valid after wait()

  // Collects output until qcclrun exits or timeout_s passes (then it is SIGKILLed: status -1).
  // on_output(stdout so far) runs after every chunk of output; tests use it to act mid-run.
  RunResult wait(double timeout_s, const std::function<void(const std::string&)>& on_output = {}) {
    RunResult res;
    const double deadline = start_ + timeout_s;
    bool timed_out = false;
    while (fds_[0] >= 0 || fds_[1] >= 0) {
      pollfd p[2] = {{fds_[0], POLLIN, 0}, {fds_[1], POLLIN, 0}};
      int ms = static_cast<int>((deadline - now_s()) * 1000);
      if (ms <= 0 || poll(p, 2, ms) == 0) {
        timed_out = true;
        break;
      }
      for (int i = 0; i < 2; i++) {
        if (!p[i].revents) continue;
        char buf[65536];
        ssize_t n = read(fds_[i], buf, sizeof(buf));
        if (n <= 0) {
          close(fds_[i]);
          fds_[i] = -1;
        } else {
          (i == 0 ? res.out : res.err).append(buf, n);
        }
      }
      if (on_output) on_output(res.out);
    }
    if (timed_out) kill(pid_, SIGKILL);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    res.seconds = now_s() - start_;
    res.status = timed_out ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return res;
  }

 private:
  pid_t pid_ = -1;  // -1 once reaped
  pid_t started_pid_ = -1;
  int fds_[2] = {-1, -1};
  double start_ = 0;
};

inline RunResult run_qcclrun(const std::vector<std::string>& args, double timeout_s = 20,
                             const std::vector<std::string>& env = {}) {
  return Qcclrun(args, env).wait(timeout_s);
}

inline std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

inline int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) n++;
  return n;
}

// True while `pid` exists and is not a zombie.
inline bool process_alive(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  FILE* f = fopen(path.c_str(), "r");
  if (!f) return false;
  char buf[512] = {0};
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  std::string stat(buf, n);
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

// Network namespaces made by the qcclrun with this pid (qccl<pid>hub, qccl<pid>r<i>).
inline std::vector<std::string> namespaces_of(pid_t pid) {
  std::vector<std::string> names;
  const std::string prefix = "qccl" + std::to_string(pid);
  if (DIR* dir = opendir("/var/run/netns")) {
    while (dirent* e = readdir(dir)) {
      std::string name = e->d_name;
      if (name.compare(0, prefix.size(), prefix) == 0 && name.size() > prefix.size() &&
          !isdigit(static_cast<unsigned char>(name[prefix.size()])))
        names.push_back(name);
    }
    closedir(dir);
  }
  return names;
}

}  // namespace qcclrun_test
