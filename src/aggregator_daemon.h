// The IntSGD aggregator daemon: serves the int codecs' agg=switch for any number of jobs
// (communicators) until a signal or a number of ended jobs. tools/qccl_aggregator is its command line;
// src/aggregator.h is how ranks register with it.
#pragma once

#include <cstddef>
#include <string>

namespace qccl {

struct AggregatorDaemonOptions {
  std::string listen;    // HOST:PORT to accept registrations on (port 0: any free port, printed)
  size_t slots = 64;     // aggregation slots per job
  int receives = 4;      // receives kept posted per rank
  long jobs = 0;         // return after this many jobs ended (0: run until SIGINT or SIGTERM)
  bool verbose = false;  // a line on stderr per job that forms or ends
};

// Blocks SIGINT and SIGTERM (to take them through a signalfd) and serves until one arrives or
// options.jobs jobs ended: returns 0. Throws Error when the listening socket cannot be made, and
// returns 1 when poll() fails. A job whose UCX traffic fails is dropped with a line on stderr; the
// daemon goes on serving the others.
int run_aggregator_daemon(const AggregatorDaemonOptions& options);

}  // namespace qccl
