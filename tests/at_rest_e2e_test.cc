// Encryption at rest through the real tqkv-server binary and its RocksDB
// files: blocks put with --at_rest_key_file read back with their exact bytes
// after a restart; a key file whose key id maps to another key makes reads
// FAILED_PRECONDITION and keeps the blocks (the right key reads them
// again); and no file under the data directory holds any stretch of a
// payload, while the same blocks put without the key can be found there
// (so the search would see plaintext).
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "tests/fixture.h"

namespace tqkv::testing {
namespace {

constexpr char kKey[] = "1 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n";
constexpr char kOtherKey[] = "1 f0e0d0c0b0a09080706050403020100ff0e0d0c0b0a09080706050403020100f\n";

void WriteKeyFile(const std::string& path, const std::string& contents) {
  std::ofstream(path, std::ios::trunc) << contents;
  chmod(path.c_str(), 0600);
}

// Every file under `dir`, concatenated (RocksDB's WAL, SSTs, manifest).
std::string AllFileBytes(const std::string& dir) {
  std::string all;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    all += s.str();
  }
  return all;
}

// How many of `payloads` have a 32-byte stretch (at their start, middle or
// end) found in `haystack`.
int PayloadsFound(const std::vector<std::string>& payloads, const std::string& haystack) {
  int found = 0;
  for (const std::string& p : payloads) {
    EXPECT_GE(p.size(), 64u);
    for (size_t at : {size_t{0}, p.size() / 2, p.size() - 32}) {
      if (haystack.find(p.substr(at, 32)) != std::string::npos) {
        ++found;
        break;
      }
    }
  }
  return found;
}

class AtRestTest : public ServerTest {
 protected:
  absl::StatusOr<std::vector<v1::GetBlocksResponse>> Get(const v1::ModelRef& model,
                                                         const std::vector<std::string>& hashes) {
    v1::GetBlocksRequest gr;
    *gr.mutable_model() = model;
    for (const auto& h : hashes) gr.add_block_hashes(h);
    return client_->GetBlocks(gr);
  }
  // Puts 24 durable blocks (on disk at once) and returns their payloads as
  // the server stores them (the local encode of the same input).
  std::vector<std::string> PutDurable(const v1::ModelRef& model, const std::vector<std::string>& chain) {
    const std::vector<v1::PutBlock> sent = PutDense(model, chain, 77, /*durable=*/true);
    std::vector<std::string> payloads;
    for (const v1::PutBlock& b : sent) payloads.push_back(EncodeLocally(*codec_, backend_, b));
    return payloads;
  }
  std::unique_ptr<ModelCodec> codec_ = SmallCodec();
  CpuBackend backend_{CpuBackend::Options{0}};
};

TEST_F(AtRestTest, SealedBlocksReadBackNeedTheirKeyAndLeaveNoPlaintextOnDisk) {
  const std::string key_file = MakeTempDir("tqkv-keys") + "/at_rest.keys";
  WriteKeyFile(key_file, kKey);
  StartServer({"--at_rest_key_file=" + key_file});
  const v1::ModelRef model = RegisterSmall();
  const auto chain = client::HashChain(5, 24);
  const std::vector<std::string> payloads = PutDurable(model, chain);

  // Graceful restart: every block read back from disk with its exact bytes.
  Restart(/*kill9=*/false);
  auto got = Get(model, chain);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), chain.size());
  for (size_t i = 0; i < chain.size(); ++i) {
    EXPECT_EQ((*got)[i].tier(), v1::TIER_DISK) << "block " << i;
    EXPECT_EQ((*got)[i].payload(), payloads[i]) << "block " << i;
  }
  EXPECT_EQ(PayloadsFound(payloads, AllFileBytes(data_dir_)), 0);

  // The same key id mapped to another key: reads are FAILED_PRECONDITION and
  // the blocks stay (the right key reads them again).
  ASSERT_EQ(server_->Stop(), 0);
  WriteKeyFile(key_file, kOtherKey);
  Restart(/*kill9=*/true);  // already stopped: starts again with the same flags
  auto wrong = Get(model, {chain[3]});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition) << wrong.status();
  ASSERT_EQ(server_->Stop(), 0);
  WriteKeyFile(key_file, kKey);
  Restart(/*kill9=*/true);
  got = Get(model, chain);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), chain.size());
  for (size_t i = 0; i < chain.size(); ++i) EXPECT_EQ((*got)[i].payload(), payloads[i]) << "block " << i;
  EXPECT_EQ(PayloadsFound(payloads, AllFileBytes(data_dir_)), 0);
}

// The control: without the key the same payloads sit on disk in clear, and
// the search above finds every one.
TEST_F(AtRestTest, WithoutTheKeyThePayloadsAreFoundOnDisk) {
  StartServer();
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> payloads = PutDurable(model, client::HashChain(5, 24));
  ASSERT_EQ(server_->Stop(), 0);
  EXPECT_EQ(PayloadsFound(payloads, AllFileBytes(data_dir_)), static_cast<int>(payloads.size()));
}

}  // namespace
}  // namespace tqkv::testing
