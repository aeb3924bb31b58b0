// The doorbell of a data-plane connection's shared memory (tqkv.proto,
// "Same-host shared memory"): where a client that shares memory with
// ShareMemory.doorbell writes a request frame, and the server its reply,
// so that a call crosses no socket while the server's loop polls. Both
// sides read and write these words as C++ atomics (lock-free, address-free)
// of the shared mapping; the server treats every value as untrusted.
#ifndef TQKV_PROTO_TQKV_V1_DOORBELL_H_
#define TQKV_PROTO_TQKV_V1_DOORBELL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tqkv::v1::doorbell {

// Offsets in the shared memory.
inline constexpr size_t kRequestSeq = 0;       // u32: the client's last request (bumped after writing it)
inline constexpr size_t kReplySeq = 64;        // u32: the request the server last answered (futex word)
inline constexpr size_t kServerPolling = 128;  // u32: 1 while the server's loop polls (no ring needed)
inline constexpr size_t kClientWaiting = 192;  // u32: 1 while the client sleeps on kReplySeq (wake it)
inline constexpr size_t kRequestBytes = 256;   // u32: bytes of the request frame
inline constexpr size_t kReplyBytes = 320;     // u32: bytes of the reply frame
inline constexpr size_t kRequestArea = 4096;   // the request frame: u32 N, u64 0, DataPlaneRequest
inline constexpr size_t kReplyArea = 64 << 10;  // the reply frame: u32 H, u64 0, DataPlaneReply
inline constexpr size_t kAreaBytes = kReplyArea - kRequestArea;  // room for a request frame
inline constexpr size_t kReplyAreaBytes = 64 << 10;
// Payloads (the frames' `shared` regions) start here; a doorbell region
// has at least kMinBytes.
inline constexpr size_t kPayloads = kReplyArea + kReplyAreaBytes;
inline constexpr size_t kMinBytes = kPayloads + (64 << 10);

inline std::atomic<uint32_t>* Word(uint8_t* base, size_t offset) {
  static_assert(std::atomic<uint32_t>::is_always_lock_free);
  return reinterpret_cast<std::atomic<uint32_t>*>(base + offset);
}

}  // namespace tqkv::v1::doorbell

#endif  // TQKV_PROTO_TQKV_V1_DOORBELL_H_
