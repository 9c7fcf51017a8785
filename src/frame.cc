#include "src/frame.h"

#include <cstring>

#include "base/errors.h"
#include "base/wire.h"

namespace qccl {

namespace {

bool reduces(coll::CollKind kind) {
  return kind == coll::CollKind::kAllReduce || kind == coll::CollKind::kReduce ||
         kind == coll::CollKind::kReduceScatter;
}

using coll::rooted;

constexpr uint8_t kDeltaFlag = 1, kReceiverFlag = 2;  // the flags byte of the encoded header

}  // namespace

FrameHeader FrameHeader::for_call(const coll::CollArgs& args, uint64_t sequence, uint64_t codec_hash,
                                  uint64_t codec_step) {
  FrameHeader h;
  h.kind = args.kind == coll::CollKind::kRecv ? coll::CollKind::kSend : args.kind;
  h.dtype = args.dtype;
  h.op = reduces(args.kind) ? args.op : kernels::RedOp::kSum;
  h.root = rooted(args.kind) ? args.root : -1;
  h.count = args.count;
  h.sequence = sequence;
  h.codec_hash = codec_hash;
  h.codec_step = codec_step;
  h.delta = args.delta != nullptr;
  h.receiver = args.kind == coll::CollKind::kRecv;
  h.sender = args.rank;
  return h;
}

void FrameHeader::encode(uint8_t out[kBytes]) const {
  ByteWriter w;
  w.put<uint32_t>(kMagic);
  w.put<uint16_t>(kVersion);
  w.put<uint8_t>(static_cast<uint8_t>(kind));
  w.put<uint8_t>(static_cast<uint8_t>(dtype));
  w.put<uint8_t>(static_cast<uint8_t>(op));
  w.put<uint8_t>(static_cast<uint8_t>((delta ? kDeltaFlag : 0) | (receiver ? kReceiverFlag : 0)));
  w.put<uint16_t>(0);
  w.put<int32_t>(root);
  w.put<int32_t>(sender);
  w.put<uint64_t>(count);
  w.put<uint64_t>(sequence);
  w.put<uint64_t>(codec_hash);
  w.put<uint64_t>(codec_step);
  uint64_t scale_bits;
  std::memcpy(&scale_bits, &codec_scale, sizeof(scale_bits));
  w.put<uint64_t>(scale_bits);
  w.put<uint32_t>(0);
  std::memcpy(out, w.bytes().data(), kBytes);
}

FrameHeader FrameHeader::decode(const uint8_t* data, size_t size, const std::string& from) {
  if (size != kBytes)
    fail(qcclRemoteError, "%s sent a frame header of %zu bytes (expected %zu)", from.c_str(), size, kBytes);
  ByteReader r(data, size, "frame header");
  uint32_t magic = r.get<uint32_t>();
  uint16_t version = r.get<uint16_t>();
  if (magic != kMagic || version != kVersion)
    fail(qcclRemoteError, "%s sent a frame header with magic 0x%08x version %u (expected 0x%08x version %u)",
         from.c_str(), magic, version, kMagic, kVersion);
  FrameHeader h;
  uint8_t kind = r.get<uint8_t>(), dtype = r.get<uint8_t>(), op = r.get<uint8_t>(), flags = r.get<uint8_t>();
  r.get<uint16_t>();
  if (kind >= coll::kNumCollKinds || dtype >= kernels::kNumDataTypes || op >= kernels::kNumRedOps ||
      (flags & ~(kDeltaFlag | kReceiverFlag)))
    fail(qcclRemoteError, "%s sent a frame header with collective %u, datatype %u, op %u, flags 0x%02x", from.c_str(),
         kind, dtype, op, flags);
  h.delta = flags & kDeltaFlag;
  h.receiver = flags & kReceiverFlag;
  h.kind = static_cast<coll::CollKind>(kind);
  h.dtype = static_cast<kernels::DataType>(dtype);
  h.op = static_cast<kernels::RedOp>(op);
  h.root = r.get<int32_t>();
  h.sender = r.get<int32_t>();
  h.count = r.get<uint64_t>();
  h.sequence = r.get<uint64_t>();
  h.codec_hash = r.get<uint64_t>();
  h.codec_step = r.get<uint64_t>();
  const uint64_t scale_bits = r.get<uint64_t>();
  std::memcpy(&h.codec_scale, &scale_bits, sizeof(scale_bits));
  return h;
}

uint32_t FrameHeader::fingerprint() const {
  // FNV-1a over the fields that must agree, folded to 12 bits.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<uint64_t>(kind));
  mix(static_cast<uint64_t>(dtype));
  mix(static_cast<uint64_t>(op));
  mix(static_cast<uint64_t>(static_cast<uint32_t>(root)));
  mix(count);
  mix(codec_hash);
  mix(codec_step);
  mix(delta ? 1 : 0);
  // The key holds only the sequence's low bits: a message of a call that many numbers apart, should
  // one ever meet this call's receive, fails the fingerprint instead of passing for this call's.
  mix(sequence);
  return static_cast<uint32_t>((h ^ (h >> 12) ^ (h >> 24) ^ (h >> 36) ^ (h >> 48)) & 0xfff);
}

std::string FrameHeader::describe() const {
  const bool recv = kind == coll::CollKind::kSend && receiver;
  if (delta) return std::string(recv ? "DeltaRecv" : "DeltaSend") + " #" + std::to_string(sequence);
  std::string s = std::string(recv ? "Recv" : coll::coll_name(kind)) + "(count=" + std::to_string(count) + ", " +
                  kernels::data_type_name(dtype);
  if (reduces(kind)) s += std::string(", ") + kernels::red_op_name(op);
  if (rooted(kind)) s += ", root=" + std::to_string(root);
  if (codec_hash)
    s += format(", codec %016llx step %llu", static_cast<unsigned long long>(codec_hash),
                static_cast<unsigned long long>(codec_step));
  return s + ") #" + std::to_string(sequence);
}

std::string frame_mismatch(const FrameHeader& expected, const FrameHeader& theirs) {
  const bool same_call = expected.kind == theirs.kind && expected.dtype == theirs.dtype && expected.op == theirs.op &&
                         expected.root == theirs.root && expected.count == theirs.count &&
                         expected.sequence == theirs.sequence && expected.codec_hash == theirs.codec_hash &&
                         expected.codec_step == theirs.codec_step && expected.delta == theirs.delta;
  const bool same_scale = std::memcmp(&expected.codec_scale, &theirs.codec_scale, sizeof(double)) == 0;
  if (same_call && same_scale) return std::string();
  const std::string mine = expected.describe();
  std::string text = "rank " + std::to_string(theirs.sender) + " called " + theirs.describe() + " but this rank called " + mine;
  const bool same_but_codec = expected.kind == theirs.kind && expected.dtype == theirs.dtype &&
                              expected.op == theirs.op && expected.root == theirs.root &&
                              expected.count == theirs.count;
  if (expected.delta != theirs.delta)
    text += " (point-to-point calls between two ranks meet in call order in each direction, keyed delta calls "
            "and plain ones alike)";
  else if (expected.codec_step != theirs.codec_step && expected.codec_hash == theirs.codec_hash)
    text += " (their codec states are at different steps: every rank must pass its own state for the same tensor, "
            "restored from the same checkpoint)";
  else if (same_but_codec && expected.codec_hash != theirs.codec_hash)
    text += " (their codecs differ: the specs, or QCCL_CODEC, or the segment lists, or for the fft codec the FFT "
            "library that runs it, which rounds its own way: the build's KissFFT or FFTW on host buffers, and "
            "cuFFT on device buffers under QCCL_GPU_FFT=cufft)";
  else if (same_call)  // and only the scales differ
    text += format(" with the shared scale alpha = %.17g, but this rank's is %.17g (the codec states diverged: the "
                   "ranks passed different learning rates, or restored different checkpoints)",
                   theirs.codec_scale, expected.codec_scale);
  return text;
}

}  // namespace qccl
