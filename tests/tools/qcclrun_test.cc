// tests/tools/qcclrun_test.cc: qcclrun without --netem: environment, output forwarding, failure
// handling, timeouts, signals and usage errors. The ranks are small `sh -c` scripts. Every test has a
// time limit far below the sleeps it interrupts, so "the job was stopped" is what makes it pass.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "tests/tools/qcclrun_test_util.h"

using namespace qcclrun_test;

namespace {
int ephemeral_range_start() {
  int low = 32768, high = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    std::fclose(f);
  }
  return low;
}
}  // namespace

TEST_CASE("qcclrun sets the environment of every rank", "[qcclrun]") {
  RunResult r = run_qcclrun(
      {"-n", "3", "-x", "FOO=bar baz", "-x", "QCCL_NRANKS=7", "--", "sh", "-c",
       "echo \"env $QCCL_RANK $QCCL_NRANKS $QCCL_LOCAL_RANK $QCCL_LOCAL_NRANKS $QCCL_ROOT "
       "$QCCL_MAGIC $FOO\""},
      20, {"QCCL_MAGIC=0123456789abcdef", "QCCL_ROOT=1.2.3.4:5"});
  REQUIRE(r.status == 0);
  std::regex re(R"(\[(\d)\] env (\d) 7 (\d) 3 127\.0\.0\.1:(\d+) ([0-9a-f]{16}) bar baz)");
  std::set<std::string> roots, magics, ranks;
  for (const auto& line : split_lines(r.out)) {
    std::smatch m;
    REQUIRE(std::regex_match(line, m, re));
    CHECK(m[1] == m[2]);  // prefix, QCCL_RANK and QCCL_LOCAL_RANK agree
    CHECK(m[2] == m[3]);
    // Below the ephemeral range, where no outgoing connection can take it before rank 0 binds it.
    CHECK(std::stoi(m[4]) >= 1024);
    CHECK(std::stoi(m[4]) < ephemeral_range_start());
    ranks.insert(m[2]);
    roots.insert(m[4]);
    magics.insert(m[5]);
  }
  CHECK(ranks == std::set<std::string>{"0", "1", "2"});
  CHECK(roots.size() == 1);  // one job, one root and one magic
  REQUIRE(magics.size() == 1);
  CHECK(*magics.begin() != "0123456789abcdef");  // inherited values belong to another job

  SECTION("--root-port fixes the port and -x wins over qcclrun's own values") {
    RunResult p = run_qcclrun({"--root-port", "23456", "-n", "2", "-x", "QCCL_MAGIC=00000000deadbeef",
                               "sh", "-c", "echo $QCCL_ROOT $QCCL_MAGIC"});
    REQUIRE(p.status == 0);
    CHECK(count(p.out, "127.0.0.1:23456 00000000deadbeef\n") == 2);
  }
}

TEST_CASE("qcclrun prefixes whole lines and keeps them intact", "[qcclrun]") {
  SECTION("stdout and stderr go to their own streams; a final partial line is flushed") {
    RunResult r = run_qcclrun({"-n", "2", "sh", "-c", "echo out$QCCL_RANK; echo err$QCCL_RANK >&2; "
                                                      "printf tail$QCCL_RANK"});
    REQUIRE(r.status == 0);
    CHECK(count(r.out, "[0] out0\n") == 1);
    CHECK(count(r.out, "[1] out1\n") == 1);
    CHECK(count(r.out, "[1] tail1\n") == 1);
    CHECK(count(r.err, "[0] err0\n") == 1);
    CHECK(count(r.err, "[1] err1\n") == 1);
    CHECK(count(r.out, "err") == 0);
  }
  SECTION("the prefix is padded so columns align from 10 ranks on") {
    RunResult r = run_qcclrun({"-n", "11", "sh", "-c", "echo x"});
    REQUIRE(r.status == 0);
    CHECK(count(r.out, "[ 0] x\n") == 1);
    CHECK(count(r.out, "[ 9] x\n") == 1);
    CHECK(count(r.out, "[10] x\n") == 1);
  }
  SECTION("--no-prefix writes whole lines: a last line without a newline gets one") {
    // Without the added newline, rank 0's "b" ran into rank 1's "a" ("a\nba\nb").
    RunResult r = run_qcclrun({"--no-prefix", "-n", "2", "sh", "-c", "printf 'a\\nb'"});
    REQUIRE(r.status == 0);
    CHECK(r.out.size() == 8);
    CHECK(count(r.out, "a\n") == 2);
    CHECK(count(r.out, "b\n") == 2);
  }
  SECTION("long lines from 4 ranks writing at once never mix") {
    // 5000-byte lines exceed PIPE_BUF, so a rank's line reaches qcclrun in several reads.
    const int kLines = 300;
    RunResult r = run_qcclrun(
        {"-n", "4", "sh", "-c",
         "s=$(printf '%05000d' 0); yes \"begin$QCCL_RANK:$s:end$QCCL_RANK\" | head -n " +
             std::to_string(kLines)});
    REQUIRE(r.status == 0);
    const std::string zeros(5000, '0');
    std::map<int, int> per_rank;
    for (const auto& line : split_lines(r.out)) {
      REQUIRE(line.size() == 4 + 6 + 1 + 5000 + 5);
      int rank = line[1] - '0';
      std::string body = "begin" + std::to_string(rank) + ":" + zeros + ":end" + std::to_string(rank);
      REQUIRE(line == "[" + std::to_string(rank) + "] " + body);
      per_rank[rank]++;
    }
    CHECK(per_rank == std::map<int, int>{{0, kLines}, {1, kLines}, {2, kLines}, {3, kLines}});
  }
}

TEST_CASE("a failing rank stops the job with its status", "[qcclrun]") {
  SECTION("non-zero exit: the sleeping ranks and their children are killed") {
    RunResult r = run_qcclrun({"-n", "3", "--", "sh", "-c",
                               "if [ $QCCL_RANK = 1 ]; then sleep 0.2; exit 3; fi; "
                               "sleep 60 & echo child $!; wait"},
                              20);
    CHECK(r.status == 3);
    CHECK(r.seconds < 10);
    CHECK(count(r.err, "qcclrun: rank 1 exited with status 3\n") == 1);
    for (const auto& line : split_lines(r.out)) {
      pid_t child = std::stoi(line.substr(line.find("child ") + 6));
      CHECK_FALSE(process_alive(child));  // the background sleep of the rank's shell too
    }
  }
  SECTION("death by signal is reported by name and gives 128+n") {
    RunResult r = run_qcclrun({"-n", "2", "sh", "-c", "[ $QCCL_RANK = 1 ] && kill -SEGV $$; sleep 60"});
    CHECK(r.status == 128 + SIGSEGV);
    CHECK(r.seconds < 10);
    CHECK(count(r.err, "qcclrun: rank 1 was killed by signal SIGSEGV") == 1);
  }
  SECTION("a rank that ignores SIGTERM is killed after --grace") {
    // Rank 1 fails only once rank 0 ignores SIGTERM (the file says so); sleep inherits the trap.
    const std::string ready = "/tmp/qcclrun_test_trap." + std::to_string(getpid());
    unlink(ready.c_str());
    RunResult r = run_qcclrun({"--grace", "0.5", "-n", "2", "sh", "-c",
                               "if [ $QCCL_RANK = 0 ]; then trap '' TERM; touch " + ready +
                                   "; sleep 60; fi; while [ ! -e " + ready +
                                   " ]; do sleep 0.01; done; exit 5"});
    unlink(ready.c_str());
    CHECK(r.status == 5);
    CHECK(r.seconds > 0.4);
    CHECK(r.seconds < 10);
  }
  SECTION("of ranks seen to end together, the one killed by a signal is blamed") {
    // qcclrun is stopped while rank 2 is killed and the others exit 1 after it, as ranks whose peer
    // died do; continued, it sees the three exits at once.
    const std::string go = "/tmp/qcclrun_test_go." + std::to_string(getpid());
    unlink(go.c_str());
    Qcclrun job({"-n", "3", "sh", "-c",
                 "echo pid $$; while [ ! -e " + go + " ]; do sleep 0.01; done; "
                 "[ $QCCL_RANK = 2 ] && kill -KILL $$; sleep 0.2; exit 1"});
    bool sent = false;
    RunResult r = job.wait(30, [&](const std::string& out) {
      if (sent || count(out, "pid ") < 3) return;
      sent = true;
      kill(job.pid(), SIGSTOP);
      close(open(go.c_str(), O_CREAT | O_WRONLY, 0600));
      for (double until = now_s() + 10; now_s() < until;) {
        bool all_ended = true;
        for (const auto& line : split_lines(out))
          all_ended &= !process_alive(std::stoi(line.substr(line.find("pid ") + 4)));
        if (all_ended) break;
        usleep(10000);
      }
      kill(job.pid(), SIGCONT);
    });
    unlink(go.c_str());
    CHECK(r.status == 128 + SIGKILL);
    CHECK(count(r.err, "qcclrun: rank 2 was killed by signal SIGKILL\n") == 1);
    CHECK(count(r.err, "exited with status 1\n") == 0);  // reported only with -v (after the stop)
  }
  SECTION("a program that does not exist gives 127") {
    RunResult r = run_qcclrun({"-n", "2", "/nonexistent/program"});
    CHECK(r.status == 127);
    CHECK(count(r.err, "cannot execute '/nonexistent/program'") >= 1);
  }
}

TEST_CASE("--timeout stops a job that runs too long", "[qcclrun]") {
  RunResult r = run_qcclrun({"--timeout", "0.5", "-n", "2", "sleep", "60"});
  CHECK(r.status == 124);
  CHECK(r.seconds < 10);
  CHECK(count(r.err, "--timeout") == 1);
  CHECK(count(r.err, "(still running: ranks 0, 1)") == 1);
  CHECK(run_qcclrun({"--timeout", "30", "-n", "2", "true"}).status == 0);
}

TEST_CASE("signals to qcclrun are forwarded and the ranks cleaned up", "[qcclrun]") {
  // SIGQUIT, SIGUSR1, SIGUSR2 and SIGALRM took their default action: qcclrun died with its network.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM}) {
    INFO("signal " << sig);
    Qcclrun job({"-n", "2", "sh", "-c", "echo pid $$; exec sleep 60"});
    bool sent = false;
    RunResult r = job.wait(20, [&](const std::string& out) {
      if (!sent && count(out, "pid ") == 2) {
        kill(job.pid(), sig);
        sent = true;
      }
    });
    CHECK(r.status == 128 + sig);
    CHECK(r.seconds < 10);
    for (const auto& line : split_lines(r.out)) CHECK_FALSE(process_alive(std::stoi(line.substr(8))));
  }
}

TEST_CASE("nothing a rank started outlives a SIGKILLed qcclrun", "[qcclrun]") {
  // PR_SET_PDEATHSIG ends each rank's own process; its children (here a shell's background job) are
  // killed by qcclrun's guardian once it sees qcclrun gone.
  Qcclrun job({"-n", "2", "sh", "-c", "sleep 60 & echo child $!; wait"});
  bool sent = false;
  RunResult r = job.wait(20, [&](const std::string& out) {
    if (!sent && count(out, "child ") == 2) {
      kill(job.pid(), SIGKILL);
      sent = true;
    }
  });
  REQUIRE(sent);
  CHECK(r.status == 128 + SIGKILL);
  CHECK(r.seconds < 10);  // nothing held qcclrun's output open
  std::vector<pid_t> children;
  for (const auto& line : split_lines(r.out)) children.push_back(std::stoi(line.substr(line.find("child ") + 6)));
  REQUIRE(children.size() == 2);
  const double deadline = now_s() + 10;
  auto any_alive = [&] {
    for (pid_t pid : children)
      if (process_alive(pid)) return true;
    return false;
  };
  while (any_alive() && now_s() < deadline) usleep(10000);
  for (pid_t pid : children) CHECK_FALSE(process_alive(pid));
}

// The pid of qcclrun's child whose command is `comm` (a helper it started), or -1.
pid_t child_named(pid_t parent, const std::string& comm) {
  std::ifstream children("/proc/" + std::to_string(parent) + "/task/" + std::to_string(parent) + "/children");
  for (pid_t pid; children >> pid;) {
    std::ifstream name("/proc/" + std::to_string(pid) + "/comm");
    std::string text;
    if (std::getline(name, text) && text == comm) return pid;
  }
  return -1;
}

TEST_CASE("an aggregator that died is no group to kill: its id may be another process's", "[qcclrun]") {
  // The guardian listed the aggregator's group until qcclrun's end; when the aggregator died first
  // and another process took its id, a SIGKILLed qcclrun's guardian killed that process. The id is
  // handed out again through ns_last_pid (root only).
  if (!std::ofstream("/proc/sys/kernel/ns_last_pid")) {
    WARN("skipped: /proc/sys/kernel/ns_last_pid is not writable (root only)");
    return;
  }
  Qcclrun job({"-n", "1", "--aggregators", "1", "--", "sh", "-c", "echo up; sleep 30"});
  pid_t aggregator = -1;  // -1 until found; 0 once the case is skipped
  RunResult r = job.wait(20, [&](const std::string& out) {
    // (aggregator > 0 alone looked for the aggregator again after a skip, found none in the killed
    // job, and failed the case with -1: seen once under TSan)
    if (aggregator >= 0 || count(out, "up\n") == 0) return;
    for (int look = 0; look < 500 && aggregator <= 0; ++look, usleep(10000))
      aggregator = child_named(job.pid(), "qccl_aggregator");
    if (aggregator <= 0) return;
    kill(aggregator, SIGKILL);
    usleep(300000);  // qcclrun reaps it
    pid_t other = -1;
    for (int attempt = 0; attempt < 50 && other != aggregator; ++attempt) {
      if (other > 0) kill(other, SIGKILL), waitpid(other, nullptr, 0);
      std::ofstream("/proc/sys/kernel/ns_last_pid") << aggregator - 1 << std::flush;  // the next pid
      other = fork();
      if (other == 0) {
        setsid();  // a group of its own, whose id is the dead aggregator's
        execl("/bin/sleep", "sleep", "30", static_cast<char*>(nullptr));
        _exit(99);
      }
    }
    if (other != aggregator) {
      if (other > 0) kill(other, SIGKILL), waitpid(other, nullptr, 0);
      WARN("skipped: the dead aggregator's pid went to another process");
      aggregator = 0;
      kill(job.pid(), SIGKILL);
      return;
    }
    for (int wait = 0; wait < 100 && getpgid(other) != other; ++wait) usleep(10000);  // its setsid()
    CHECK(getpgid(other) == other);
    kill(job.pid(), SIGKILL);  // its guardian kills the groups it lists
    usleep(1000000);
    int status = 0;
    CHECK(waitpid(other, &status, WNOHANG) == 0);  // still running
    kill(other, SIGKILL);
    waitpid(other, nullptr, 0);
  });
  CHECK(aggregator >= 0);
  CHECK(r.status == 128 + SIGKILL);
}

TEST_CASE("--aggregators starts IntSGD's aggregators, tells the ranks, and stops them after", "[qcclrun]") {
  RunResult r = run_qcclrun({"-n", "2", "--aggregators", "3", "--", "sh", "-c", "echo agg $QCCL_AGGREGATORS"}, 20);
  REQUIRE(r.status == 0);
  std::regex re(R"(\[\d\] agg (127\.0\.0\.1:\d+),(127\.0\.0\.1:\d+),(127\.0\.0\.1:\d+))");
  std::set<std::string> lists;
  for (const auto& line : split_lines(r.out)) {
    std::smatch m;
    REQUIRE(std::regex_match(line, m, re));
    CHECK(m[1] != m[2]);
    lists.insert(m[0].str().substr(4));
  }
  CHECK(lists.size() == 1);  // every rank was told the same aggregators
  CHECK(r.err.empty());      // they started quietly, and were stopped without a word
}

TEST_CASE("qcclrun usage errors name the problem", "[qcclrun]") {
  RunResult r = run_qcclrun({"--bogus", "-n", "2", "true"});
  CHECK(r.status == 125);
  CHECK(count(r.err, "unknown option '--bogus'") == 1);
  r = run_qcclrun({"true"});
  CHECK(r.status == 125);
  CHECK(count(r.err, "-n N") == 1);
  r = run_qcclrun({"-n", "zero", "true"});
  CHECK(r.status == 125);
  CHECK(count(r.err, "'zero'") == 1);
  r = run_qcclrun({"--netem", "fast", "-n", "2", "true"});
  CHECK(r.status == 125);
  CHECK(count(r.err, "invalid rate 'fast'") == 1);
  r = run_qcclrun({"--netem=10furlongs", "-n", "2", "true"});
  CHECK(r.status == 125);
  CHECK(count(r.err, "'10furlongs'") == 1);
  r = run_qcclrun({"--aggregators", "65", "-n", "2", "true"});
  CHECK(r.status == 125);
  CHECK(count(r.err, "'65'") == 1);
  r = run_qcclrun({"--help"});
  CHECK(r.status == 0);
  for (const char* part : {"SYNOPSIS", "OPTIONS", "ENVIRONMENT", "EXIT STATUS", "EXAMPLES", "--netem", "--aggregators"})
    CHECK(count(r.out, part) >= 1);
  r = run_qcclrun({"--version"});
  CHECK(r.status == 0);
  CHECK(count(r.out, "qcclrun") == 1);
}
