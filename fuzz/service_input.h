// The input format of service_fuzzer: a sequence of records, each
//   [op: 1 byte][length: 2 bytes, little endian][length bytes]
// where the bytes are the binary protobuf of the op's request. An op with
// bit 0x80 set has its model reference (and sequence id) replaced by the
// model most recently registered (and sequence most recently created) in
// this input, so mutations of the other fields reach past those checks.
// A truncated record ends the input.
#ifndef TQKV_FUZZ_SERVICE_INPUT_H_
#define TQKV_FUZZ_SERVICE_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "google/protobuf/message_lite.h"

namespace tqkv::fuzz {

enum Op : uint8_t {
  kRegister = 0,     // RegisterModelRequest
  kPutMessage = 1,   // PutBlocksRequest on the open stream (one opens)
  kPutFinish = 2,    // (no bytes) Finish of the open stream
  kLookup = 3,       // LookupRequest
  kGet = 4,          // GetBlocksRequest: PrepareGet, then every reply
  kCreateSeq = 5,    // CreateSequenceRequest
  kAppend = 6,       // AppendRequest
  kAttend = 7,       // AttendRequest
  kDropSeq = 8,      // DropSequenceRequest
  kPin = 9,          // PinRequest
  kUnpin = 10,       // UnpinRequest
  kDelete = 11,      // DeleteRequest
  kEvict = 12,       // EvictRequest
  kStats = 13,       // StatsRequest
  kMaintain = 14,    // (no bytes) KvService::Maintain
  kNumOps = 15,
};
inline constexpr uint8_t kUseCurrent = 0x80;

// Appends one record to `out`.
inline void AppendRecord(std::string& out, uint8_t op, std::string_view bytes) {
  out.push_back(static_cast<char>(op));
  out.push_back(static_cast<char>(bytes.size() & 0xff));
  out.push_back(static_cast<char>((bytes.size() >> 8) & 0xff));
  out.append(bytes);
}
inline void AppendRecord(std::string& out, uint8_t op, const google::protobuf::MessageLite& m) {
  AppendRecord(out, op, m.SerializeAsString());
}

}  // namespace tqkv::fuzz

#endif  // TQKV_FUZZ_SERVICE_INPUT_H_
