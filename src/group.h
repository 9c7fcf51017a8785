// qcclGroupStart / qcclGroupEnd, per thread as in NCCL: calls made inside a group are validated and
// deferred; the outermost GroupEnd starts them all at once (so that sends and receives between the
// same ranks cannot deadlock) and waits for the blocking ones.
#pragma once

#include <memory>

#include "src/comm.h"

namespace qccl {

bool group_active();
void group_start();
// Queues a validated call; `blocking` calls are waited for by group_end().
void group_defer(std::shared_ptr<OpRecord> record, bool blocking);
// A call refused inside the open group (its validation threw `error`): as in NCCL, the group then
// fails as a whole, and its outermost group_end() starts none of its calls.
void group_refuse(const Error& error);
// Throws the first error of the blocking calls (the others report at their qcclWait); in a refused
// group, fails every queued call with the refusal and throws it.
void group_end();
// Whether this thread's open group holds calls on comm (which qcclCommDestroy then refuses).
bool group_holds(const Comm& comm);

}  // namespace qccl
