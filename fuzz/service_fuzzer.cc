// Fuzz target: the request validation and state of the service layer
// (RegisterModel, PutBlocks streams, Lookup, GetBlocks, sequences, Append,
// Attend, Pin/Unpin/Delete, Evict, Stats) through the real KvService on
// the CPU backend, the path every gRPC and data-plane request takes after
// parsing. Input: records of service_input.h. Findings: crashes, sanitizer
// reports, leaks, UNKNOWN or INTERNAL statuses.
#include <cstddef>
#include <cstdint>

#include "fuzz/service_harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto* shared = new tqkv::fuzz::SharedParts;
  tqkv::fuzz::ServiceHarness harness(shared);
  (void)harness.Run(data, size);
  return 0;
}
