// The GPU path's thin layer: what only a GPU can do, behind an interface, so that the device
// executor's scheduling (executor.cc: ordering, staging, pipelining, buffer reuse) is host code that
// CI runs against a stand-in (tests/common/stand_in_device.h) and a GPU runs through CudaDevice
// (device_cuda.cc).
//
// A Device owns one stream, the executor's own: the work enqueued on it runs in the order it was
// enqueued, and a Ticket names a point on it. Joins with a caller's stream are events (mark and
// wait, signal), so that the work a caller queued before a collective runs first and the work it queues
// after the collective's completion sees its result.
//
// Errors throw Error (qcclSystemError, naming the CUDA call and the runtime's message); a fault of
// the device's own work shows up at a later call, as everywhere in CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/device_kernels.h"
#include "collectives/plan.h"

namespace qccl {

// It is also the device form of a method's step kernels (collectives/device_kernels.h): their launches
// go on the same stream, in order with the data steps.
class Device : public coll::DeviceKernels {
 public:
  using Ticket = uint64_t;  // points on the stream, increasing; 0 is before any work (always reached)
  enum class Memory : uint8_t {
    kDevice,  // scratch and counters: what the kernels touch
    kPinned,  // page-locked host memory: the staging buffers the transport reads and writes
  };
  virtual ~Device() = default;
  virtual std::string describe() const = 0;

  // Memory, never zero bytes. Released memory must no longer be in use by enqueued work.
  virtual void* allocate(Memory kind, size_t bytes) = 0;
  virtual void release(Memory kind, void* p) = 0;

  // Work on the stream, in order.
  // A plan's data step: every Step alternative but the transfers, Wait and Compute, with the call's
  // datatype, op, rank count and random key (args), the same bits as the host executor's numerics
  // (codec_cuda.h's promise). Non-finite outputs of Store and DecodeOut are added to the device
  // counter `nonfinite`. An Encode with a length stores codec.encoded_bytes(count) in it now
  // (variable-length codecs are refused: their length would need a host round trip).
  virtual void launch(const coll::Step& step, const coll::CollArgs& args, unsigned long long* nonfinite) = 0;
  // bytes from src to dst, each in device, pinned or (for small results) host memory.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void zero(void* dst, size_t bytes) = 0;
  virtual Ticket record() = 0;
  // Whether the work enqueued before the ticket is done; never blocks.
  virtual bool reached(Ticket ticket) = 0;
  // Blocks until everything enqueued is done (failure paths, shutdown).
  virtual void synchronize() = 0;
  // Whether enqueued work is not reached yet.
  virtual bool busy() = 0;
  // Sleeping while the device works: a descriptor that becomes readable when the stream reaches the
  // last point recorded before arm() (-1: none, the caller polls), and arm(), true when the caller
  // may block on it (nothing pending, or the wake-up is arranged), false when it must poll.
  virtual int event_fd() = 0;
  virtual bool arm() = 0;

  // Joins with a caller's stream (a cudaStream_t; null is the legacy default stream). mark() keeps the
  // point the caller's stream has reached now (an event); wait() makes the executor's stream wait for
  // it, once the call starts to run, so that a call queued behind others does not make their work
  // wait for what the caller queued after it; forget() drops a mark never waited for. signal(): the
  // caller's stream waits for what the executor's holds so far.
  using Mark = uintptr_t;
  virtual Mark mark(void* stream) = 0;
  virtual void wait(Mark mark) = 0;
  virtual void forget(Mark mark) = 0;
  virtual void signal(void* stream) = 0;
  // Whether the caller's stream is capturing a graph (or cannot be asked, which a capture elsewhere
  // in global mode makes of the legacy stream): the join above cannot be recorded in one. A stream
  // that is not one of this device's (destroyed, another device's) fails with qcclInvalidArgument.
  virtual bool capturing(void* stream) = 0;
  // The stream itself (a cudaStream_t), for a PeerWire that posts on it.
  virtual void* native_stream() = 0;
  // What names this GPU among all (its UUID), so that ranks can tell whether they share one.
  virtual std::string uuid() = 0;
  // Its CUDA device number in this process.
  virtual int ordinal() const = 0;
};

// Wire A: messages between the devices of a communicator's ranks, posted on the device's stream
// (NCCL point-to-point: NcclWire in device_cuda.cc). There are no tags: rank a's k-th send to rank b
// matches b's k-th receive from a, with the same length, and a transfer completes only once its
// peer has posted the match, so transfers that must progress together (a ring step's send to the
// next rank and receive from the previous one) are posted between group_start and group_end.
class PeerWire {
 public:
  virtual ~PeerWire() = default;
  virtual std::string describe() const = 0;
  virtual void group_start() = 0;
  virtual void group_end() = 0;
  virtual void send(int peer, const void* src, size_t bytes) = 0;
  virtual void recv(int peer, void* dst, size_t bytes) = 0;
  // After a failure: withdraws everything posted (ncclCommAbort), so that the stream can finish;
  // the wire is unusable afterwards (aborted()). Never throws.
  virtual void abort() = 0;
  virtual bool aborted() const = 0;
};

// CUDA device `ordinal`, or null with *why set (a build without CUDA, no driver, no such device).
// `cufft`: the device runs the fft codec with cuFFT (QCCL_GPU_FFT=cufft; runs_fft), failing its fft
// launches with the reason where cuFFT cannot be loaded; else the runtime stages fft calls.
std::unique_ptr<Device> make_cuda_device(int ordinal, bool cufft, std::string* why);

// NCCL point-to-point on `device` (a CudaDevice), libnccl.so.2 loaded at run time: every rank of the
// communicator calls it at the same point with rank 0's `unique_id` (nccl_unique_id on rank 0, shared
// by the caller). Null with *why set when NCCL cannot be loaded or its communicator not made within
// timeout_seconds (0: no limit), as when a rank never joins: NCCL's communicator is non-blocking, so
// that neither its making nor a transfer that a dead peer never matches can hang a rank for good.
std::string nccl_unique_id(std::string* why);
// Whether libnccl.so.2 can be loaded here (the real NCCL, not qccl's drop-in), else why not.
bool nccl_available(std::string* why);
// What this process can use on GPUs, a line each (qccl_info -v): the CUDA runtime, driver and
// devices, NCCL for QCCL_GPU_WIRE=nccl and cuFFT for QCCL_GPU_FFT=cufft, each or why not.
std::vector<std::string> describe_gpu_support();
std::unique_ptr<PeerWire> make_nccl_wire(Device& device, int nranks, int rank, const std::string& unique_id,
                                         double timeout_seconds, std::string* why);

}  // namespace qccl
