#include "src/group.h"

#include <vector>

#include "base/errors.h"

namespace qccl {

namespace {

struct Deferred {
  std::shared_ptr<OpRecord> record;
  bool blocking;
};

struct GroupState {
  int depth = 0;
  std::vector<Deferred> calls;
};

thread_local GroupState t_group;

}  // namespace

bool group_active() { return t_group.depth > 0; }

void group_start() { ++t_group.depth; }

void group_defer(std::shared_ptr<OpRecord> record, bool blocking) {
  t_group.calls.push_back(Deferred{std::move(record), blocking});
}

bool group_holds(const Comm& comm) {
  for (const Deferred& d : t_group.calls)
    if (d.record->comm.get() == &comm) return true;
  return false;
}

void group_end() {
  if (t_group.depth == 0) fail(qcclInvalidUsage, "called without a matching qcclGroupStart");
  if (--t_group.depth > 0) return;
  std::vector<Deferred> calls = std::move(t_group.calls);
  t_group.calls.clear();
  // Start everything in the background first: each communicator's progress thread drives its own
  // calls, so calls on several communicators cannot wait on each other.
  for (Deferred& d : calls) {
    try {
      d.record->comm->start(d.record, /*background=*/true);
    } catch (const Error& e) {
      d.record->comm->refuse(*d.record, e);
    } catch (const std::exception& e) {  // out of memory, say: the later calls must still start
      d.record->comm->refuse(*d.record, Error(qcclSystemError, std::string("starting the call: ") + e.what()));
    }
  }
  std::unique_ptr<Error> first;
  for (Deferred& d : calls) {
    if (!d.blocking) continue;
    try {
      d.record->comm->wait(*d.record);
    } catch (const Error& e) {
      if (!first) first = std::make_unique<Error>(e);
    }
  }
  if (first) throw *first;
}

}  // namespace qccl
