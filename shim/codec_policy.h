// QCCL_NCCL_CODEC: which NCCL calls on host buffers the shim compresses, and with which codec.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <memory>
#include <string>

#include "qccl.h"

namespace qccl_nccl {

enum class CollKind { kAllReduce, kAllGather, kReduceScatter };

// Parsed once per communicator from the environment:
//   QCCL_NCCL_CODEC              none (default: exact) | SPEC | TYPE=SPEC;TYPE=SPEC (TYPE: float, half,
//                                bfloat16; each once), SPEC as qcclCodecCreate takes it (QCCL_CODEC's
//                                grammar, without its auto)
//   QCCL_NCCL_CODEC_MIN_BYTES    calls of fewer bytes run exact (default 1048576; a size as QCCL_CHUNK_BYTES
//                                takes it: K, M, G, k, m, g, KiB, MiB, GiB)
//   QCCL_NCCL_CODEC_STATE_BUDGET bytes of codec state (error feedback) the policy may keep per
//                                communicator (default 0: qccl's QCCL_CODEC_STATE_BUDGET alone)
class CodecPolicy {
 public:
  // nullptr when the policy compresses nothing. A bad value of any of the three fails with
  // ncclInvalidArgument naming it, whether or not QCCL_NCCL_CODEC is set.
  static std::unique_ptr<CodecPolicy> from_env();
  ~CodecPolicy();

  // The codec for a call of `bytes` bytes (the per-rank message: count * element size), or nullptr
  // with the reason it runs exact in *why.
  qcclCodec_t codec_for(CollKind kind, ncclDataType_t type, ncclRedOp_t op, size_t bytes, const char** why) const;
  const std::string& spec_for(ncclDataType_t type) const;
  size_t state_budget() const { return state_budget_; }
  std::string describe() const;

 private:
  struct Entry {
    qcclCodec_t codec = nullptr;
    std::string spec;
    std::string method;  // "q", "fp16", "bf16", "none", "sign" or "int"
  };
  const Entry* entry(ncclDataType_t type) const;
  Entry float_, half_, bfloat16_;
  size_t min_bytes_ = 1 << 20;
  size_t state_budget_ = 0;
};

}  // namespace qccl_nccl
