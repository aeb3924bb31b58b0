// Shared fixture of the integration tests: a real tqkv-server child process
// (port 0, temporary data dir), the real C++ client, the small test model,
// and a local ModelCodec/CpuBackend built independently of the server to
// check its bytes.
#ifndef TQKV_TESTS_FIXTURE_H_
#define TQKV_TESTS_FIXTURE_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <span>
#include <vector>

#include "client/cpp/client.h"
#include "client/cpp/data_plane_client.h"
#include "client/cpp/synthetic.h"
#include "codec/cpu_backend.h"
#include "codec/model_codec.h"
#include "tests/server_process.h"

namespace tqkv::testing {

// Asserts an absl::StatusOr is OK and yields its value.
#define TQ_ASSERT_OK_AND_ASSIGN(lhs, expr)                             \
  auto TQ_CONCAT_T_(sor_, __LINE__) = (expr);                          \
  ASSERT_TRUE(TQ_CONCAT_T_(sor_, __LINE__).ok())                       \
      << TQ_CONCAT_T_(sor_, __LINE__).status();                        \
  lhs = std::move(TQ_CONCAT_T_(sor_, __LINE__)).value()
#define TQ_CONCAT_T_(a, b) TQ_CONCAT_T_INNER_(a, b)
#define TQ_CONCAT_T_INNER_(a, b) a##b

class ServerTest : public ::testing::Test {
 protected:
  // Starts the server with `flags` on data_dir_ (a fresh temp dir unless
  // already set) and connects client_.
  void StartServer(const std::vector<std::string>& flags = {});
  // Stops (SIGTERM, expecting exit 0) or kills (SIGKILL) the server, then
  // starts it again on the same data dir with the same flags.
  void Restart(bool kill9);
  // Registers client::SmallModel(name); returns its ref.
  v1::ModelRef RegisterSmall(const std::string& name = "small");
  // Dense puts of blocks `hashes` (block i from seed seed0 + i), in one
  // stream. Returns the blocks sent.
  std::vector<v1::PutBlock> PutDense(const v1::ModelRef& model,
                                     const std::vector<std::string>& hashes, uint64_t seed0,
                                     bool durable = false);
  // Stats of one model (asserts success).
  v1::ModelStats ModelStats(const v1::ModelRef& model);
  // A decode sequence over `chain` of `model` (client::SmallModel's
  // layout) with a dense tail of `tail_tokens` tokens, K and V from seeds
  // `seed` and `seed + 1`; its id ("" after a failure, which is reported).
  std::string NewSequence(const v1::ModelRef& model, const std::vector<std::string>& chain, int tail_tokens,
                          uint64_t seed);
  // The value of an unlabelled metric of server_; -1 when it is missing.
  double Metric(const std::string& name);
  // Waits (up to 10 s) until Metric(name) == want; returns the last value.
  double AwaitMetric(const std::string& name, double want);
  // Total blocks of a model over all tiers where the tier matches (or all
  // tiers when tier is TIER_UNSPECIFIED).
  uint64_t Blocks(const v1::ModelRef& model, v1::Tier tier = v1::TIER_UNSPECIFIED);

  std::string data_dir_;
  std::vector<std::string> flags_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<client::Client> client_;
};

// A ServerTest whose server may listen on a Unix-domain socket at
// socket_ (pass "--data_socket=" + socket_), in a directory under /tmp (the
// test's own temp dir can be longer than a socket address holds), removed
// with the server killed at the end.
class UnixSocketServerTest : public ServerTest {
 protected:
  void SetUp() override;
  void TearDown() override;

  std::string dir_, socket_;
};

// Dense blocks of client::SmallModel (block i's K/V from seed + i) put
// under `chain` by `dp` in frames of two blocks, all committed (a test
// failure otherwise).
void PutDenseOverDataPlane(client::DataPlaneClient& dp, const v1::ModelRef& model,
                           const std::vector<std::string>& chain, uint64_t seed);

// A data-plane connection to `target` (HOST:PORT or unix:PATH) with
// `token`, a 30 s timeout; null after a failure, which is reported.
std::unique_ptr<client::DataPlaneClient> ConnectDataPlane(const std::string& target, const std::string& token = "");
// The start's status and the server's stderr when it is started with
// `flags` on a fresh data dir and exits before it listens.
std::pair<absl::Status, std::string> FailedStart(const std::vector<std::string>& flags);
// A GetBlocksRequest of `hashes` of `model`.
v1::GetBlocksRequest GetBlocksReq(const v1::ModelRef& model, const std::vector<std::string>& hashes);
// An Attend of `layer` with one item: sequence `sequence_id`, one random
// query of client::SmallModel's layout ([1, 4, 64]) in `dtype` from `seed`.
v1::AttendRequest OneQueryAttend(const std::string& sequence_id, uint32_t layer, v1::DType dtype, uint64_t seed);

// Raw-payload Attend calls (the data plane's TQKVDP02 frames): the request
// with every tensor's data moved out, into *bytes in request order (per
// item q, k, v), as a raw-payload caller sends it; those bytes as the
// client's spans; the bytes of the outputs (fp16 queries).
v1::AttendRequest Strip(v1::AttendRequest at, std::vector<std::string>* bytes);
std::vector<std::span<const char>> Spans(const std::vector<std::string>& bytes);
size_t OutputBytes(const v1::AttendRequest& at);

// The codec the server must use for client::SmallModel, built locally.
std::unique_ptr<ModelCodec> SmallCodec();
// The packed payload the server must store for a dense block (local CPU
// encode of the same input).
std::string EncodeLocally(ModelCodec& codec, CpuBackend& backend, const v1::PutBlock& block);

}  // namespace tqkv::testing

#endif  // TQKV_TESTS_FIXTURE_H_
