// tools/qccl_aggregator.cc: the command line of the IntSGD aggregator daemon (src/aggregator_daemon.h),
// the process that plays SwitchML's programmable switch for the int codecs' agg=switch.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "base/config.h"
#include "base/errors.h"
#include "base/socket.h"
#include "src/aggregator_daemon.h"

namespace {

const char kHelp[] = R"(NAME
    qccl_aggregator - an IntSGD aggregator: adds the ranks' integer chunks like an in-network switch

SYNOPSIS
    qccl_aggregator --listen HOST:PORT [--slots P] [--receives R] [--jobs N] [--verbose]

DESCRIPTION
    Serves the int codecs' agg=switch (IntSGD, Mishchenko et al., ICLR 2022, summed as SwitchML,
    Sapio et al., NSDI 2021, sums in a programmable switch). Ranks find aggregators through
    QCCL_AGGREGATORS=HOST:PORT[,HOST:PORT...] (qcclrun --aggregators K starts K of them and sets it):
    every communicator a rank creates registers with each aggregator over TCP, and the aggregator
    then exchanges chunks with the ranks over UCX, as transport peer nranks + k for the k-th address.

    For every chunk (a collective's message), the aggregator keeps one slot of a fixed pool: it copies
    the first rank's integers in, adds the others' with wrapping integer adds in the wire type (int8,
    int16 or int32, read from the chunk's 8-byte header), and once all ranks have contributed sends the
    sum back to each of them; the slot is then free for another chunk. Ranks keep at most their
    pipeline depth of chunks outstanding, so a pool of P slots serves P / depth concurrent calls
    without waiting; beyond that, contributions queue until a slot frees. Because every rank clips its
    integers so that n of them fit the wire type, the sums are exact, and the same bits as the ranks'
    ring would produce.

    Several jobs may be served at once, each with its own UCX worker and slots. A job ends when one of
    its ranks' registration connections closes (the communicator was destroyed, or the rank died):
    its slots are dropped. A job still forming is dropped when a registered rank's connection closes,
    or when not all its ranks registered within 600 s. A registration whose job could not be served (a
    largest message outside 64 bytes to 1 GiB, a UCX worker address too short to be one) is refused.
    An accept that fails for want of descriptors or memory is retried, the jobs served meanwhile. The
    aggregator runs until SIGINT or SIGTERM, or until --jobs jobs ended.

OPTIONS
    --listen HOST:PORT  Address to accept registrations on (port 0: any free port, printed at start).
                        Required.
    --slots P           Aggregation slots per job. Default 64.
    --receives R        Receives kept posted per rank. Default 4.
    --jobs N            Exit after N jobs have ended. Default 0 (run until a signal).
    -v, --verbose       Print every job that forms and ends.
    -h, --help          Print this help and exit.

OUTPUT
    "qccl_aggregator: listening on HOST:PORT" on stderr once ready, when the port was 0 or with
    --verbose; with --verbose also a line per job that forms or ends.

EXIT STATUS
    0  stopped by a signal, or --jobs reached
    1  the listening socket or UCX failed
    2  bad usage

ENVIRONMENT
    UCX_TLS, UCX_NET_DEVICES select the wire, as for the ranks (qcclrun --netem sets them).
)";

using Options = qccl::AggregatorDaemonOptions;

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "qccl_aggregator: %s\nTry 'qccl_aggregator --help' for more information.\n", msg.c_str());
  std::exit(2);
}

// The library's integer (base/config.cc parse_int: decimal from its first digit; strtol alone took
// --slots ' 5' and '+5'), under this tool's message.
long number(const std::string& option, const char* text, long lo, long hi) {
  try {
    return static_cast<long>(qccl::parse_int(option, text, lo, hi));
  } catch (const qccl::Error&) {
    usage_error("invalid value '" + std::string(text) + "' for " + option + " (expected " + std::to_string(lo) +
                " to " + std::to_string(hi) + ")");
  }
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    const size_t eq = arg.find('=');
    if (arg.compare(0, 2, "--") == 0 && eq != std::string::npos) value = arg.substr(eq + 1), arg = arg.substr(0, eq);
    auto take = [&]() -> const char* {
      if (!value.empty() || eq != std::string::npos) return argv[i] + eq + 1;
      if (i + 1 >= argc) usage_error("option '" + arg + "' needs a value");
      return argv[++i];
    };
    const bool flag = arg == "-v" || arg == "--verbose" || arg == "-h" || arg == "--help";
    if (flag && eq != std::string::npos && arg.compare(0, 2, "--") == 0)
      usage_error("option '" + arg + "' takes no value");  // --verbose=no turned verbose on
    if (arg == "--listen") o.listen = take();
    else if (arg == "--slots") o.slots = static_cast<size_t>(number(arg, take(), 1, 1 << 20));
    else if (arg == "--receives") o.receives = static_cast<int>(number(arg, take(), 1, 1024));
    else if (arg == "--jobs") o.jobs = number(arg, take(), 0, 1L << 40);
    else if (arg == "-v" || arg == "--verbose") o.verbose = true;
    else if (arg == "-h" || arg == "--help") std::fputs(kHelp, stdout), std::exit(0);
    else usage_error("unknown option '" + arg + "'");
  }
  if (o.listen.empty()) usage_error("--listen HOST:PORT is required");
  try {
    qccl::net::Address::parse(o.listen, "--listen");  // a malformed address is a usage error
  } catch (const std::exception& e) {
    usage_error(e.what());
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    return qccl::run_aggregator_daemon(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qccl_aggregator: %s\n", e.what());
    return 1;
  }
}
