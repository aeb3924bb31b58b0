// An in-process tqkv service on the CPU backend for the fuzzers and their
// seed generator: a host-memory BlockStore (no disk tier, 64 MiB), a model
// registry and a KvService, driven by the records of service_input.h.
// Each input gets a fresh store and registry, so an input's outcome does
// not depend on the inputs before it; the backend (single-threaded) and
// the clock are shared.
#ifndef TQKV_FUZZ_SERVICE_HARNESS_H_
#define TQKV_FUZZ_SERVICE_HARNESS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "codec/cpu_backend.h"
#include "service/kv_service.h"
#include "service/model_registry.h"
#include "storage/block_store.h"
#include "storage/clock.h"

namespace tqkv::fuzz {

// The parts every input shares.
struct SharedParts {
  // Silences protobuf's log of unparsable strings (one line per bad input).
  SharedParts();
  CpuBackend backend{CpuBackend::Options{0}};
  storage::FakeClock clock;
};

class ServiceHarness {
 public:
  explicit ServiceHarness(SharedParts* shared);
  ~ServiceHarness();

  service::KvService& service() { return *service_; }
  const service::Identity& identity() const { return identity_; }

  // Runs every record of `data` (service_input.h). Statuses are the
  // service's answers and are not findings; the status of the last record
  // run is returned for the seed generator. Aborts on a status code the
  // service must never return (UNKNOWN, INTERNAL).
  absl::Status Run(const uint8_t* data, size_t size);

  // The model and sequence the kUseCurrent records refer to.
  const v1::ModelRef& current_model() const { return model_; }
  const std::string& current_sequence() const { return sequence_; }

 private:
  absl::Status RunOne(uint8_t op, const std::string& bytes);

  SharedParts* shared_;
  std::unique_ptr<storage::BlockStore> store_;
  std::unique_ptr<service::ModelRegistry> registry_;
  std::unique_ptr<service::KvService> service_;
  std::unique_ptr<service::PutSession> put_;
  service::Identity identity_{"fuzz", /*admin=*/true};
  v1::ModelRef model_;
  std::string sequence_;
};

}  // namespace tqkv::fuzz

#endif  // TQKV_FUZZ_SERVICE_HARNESS_H_
