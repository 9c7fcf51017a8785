#include "src/group.h"

#include <memory>
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
  std::unique_ptr<Error> refused;  // the first call refused inside the group
};

thread_local GroupState t_group;

}  // namespace

bool group_active() { return t_group.depth > 0; }

void group_start() { ++t_group.depth; }

void group_defer(std::shared_ptr<OpRecord> record, bool blocking) {
  t_group.calls.push_back(Deferred{std::move(record), blocking});
}

void group_refuse(const Error& error) {
  if (!t_group.refused) t_group.refused = std::make_unique<Error>(error);
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
  if (std::unique_ptr<Error> refused = std::move(t_group.refused)) {
    // Running the rest would leave this rank part of the way through what its peers run whole, and
    // the caller, told of the refusal, unable to stop it.
    const Error error(refused->code(), format("the group ran none of its %zu queued calls: a call in it was "
                                              "refused: %s", calls.size(), refused->message().c_str()));
    for (Deferred& d : calls) d.record->comm->refuse(*d.record, error);
    throw error;
  }
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
