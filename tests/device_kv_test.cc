// Same-host GPU memory (proto "Same-host GPU memory") on servers that cannot
// take it: a CPU-backend server and one started with --data_cuda_ipc=false
// answer device puts and gets with FAILED_PRECONDITION naming why, commit
// nothing and keep the connection; malformed device requests are
// INVALID_ARGUMENT; gRPC refuses device_out. The GPU path itself is
// tested by gpu:cuda_ipc_test and client/python/tests/test_cuda_ipc.py.
#include <unistd.h>

#include <string>
#include <vector>

#include "client/cpp/data_plane_client.h"
#include "tests/fixture.h"
#include "tests/raw_data_plane.h"

namespace tqkv::testing {
namespace {

using absl::StatusCode;

class DeviceKvTest : public ServerTest {
 protected:
  // A DeviceKv of the small model's layers in one (made-up) allocation.
  static v1::DeviceKv Device() {
    const v1::ModelLayout l = client::SmallModel("x").layout();
    v1::DeviceKv d;
    d.add_ipc_handles(std::string(64, '\x01'));
    d.set_dtype(v1::DTYPE_FP16);
    const uint64_t head = l.head_dim() * 2, block = uint64_t{l.block_size()} * l.num_kv_heads() * head;
    d.set_head_stride(head);
    d.set_token_stride(head * l.num_kv_heads());
    d.set_block_stride(block);
    for (uint32_t i = 0; i < l.num_layers(); ++i) {
      v1::DeviceKv::Layer* y = d.add_layers();
      y->set_k_offset(2 * i * 8 * block);
      y->set_v_offset((2 * i + 1) * 8 * block);
    }
    return d;
  }

  // A put frame: header (when `header`), device blocks of `hashes` at
  // slots 0.., commit.
  static std::string PutFrame(const v1::ModelRef& model, bool header, const std::vector<std::string>& hashes,
                              bool device, bool commit) {
    v1::DataPlaneRequest r;
    if (header) *r.mutable_put()->mutable_header()->mutable_model() = model;
    if (device) *r.mutable_put()->mutable_device() = Device();
    for (size_t i = 0; i < hashes.size(); ++i) {
      v1::PutBlock* b = r.mutable_put()->add_blocks();
      b->set_block_hash(hashes[i]);
      b->set_device_slot(i + 1);
    }
    r.mutable_put()->set_commit(commit);
    return Frame(r);
  }

  v1::DataPlaneReply Exchange(int fd, const std::string& frame) {
    SendRaw(fd, frame);
    v1::DataPlaneReply head;
    EXPECT_TRUE(ReadReply(fd, &head));
    return head;
  }

  uint32_t Hits(const v1::ModelRef& model, const std::vector<std::string>& hashes) {
    v1::LookupRequest lr;
    *lr.mutable_model() = model;
    for (const auto& h : hashes) lr.add_block_hashes(h);
    auto r = client_->Lookup(lr);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->hits() : 9999u;
  }

  v1::DataPlaneRequest DeviceGet(const v1::ModelRef& model, const std::vector<std::string>& hashes, int slots) {
    v1::DataPlaneRequest r;
    v1::GetBlocksRequest* g = r.mutable_get_blocks();
    *g->mutable_model() = model;
    for (const auto& h : hashes) g->add_block_hashes(h);
    *g->mutable_device_out() = Device();
    for (int i = 0; i < slots; ++i) g->add_device_slots(i);
    return r;
  }
};

TEST_F(DeviceKvTest, ACpuServerRefusesDeviceMemoryAndCommitsNothing) {
  StartServer();
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> chain = client::HashChain(51, 3);
  const int fd = RawConnect(server_->data_address());
  SendRaw(fd, "TQKVDP01");
  // The first frame fails the stream; its commit frame carries the error.
  v1::DataPlaneReply head = Exchange(fd, PutFrame(model, true, chain, true, false));
  EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kFailedPrecondition)) << head.message();
  EXPECT_NE(head.message().find("cpu backend"), std::string::npos) << head.message();
  head = Exchange(fd, PutFrame(model, false, {}, false, true));
  EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kFailedPrecondition)) << head.message();
  EXPECT_EQ(Hits(model, chain), 0u);
  // A dense get into device memory: refused; the connection serves the next request.
  PutDense(model, chain, 70);
  head = Exchange(fd, Frame(DeviceGet(model, chain, 3)));
  EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kFailedPrecondition)) << head.message();
  EXPECT_EQ(head.blocks_size(), 0);
  head = Exchange(fd, Frame(DeviceGet(model, chain, 2)));
  EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kInvalidArgument)) << head.message();
  v1::DataPlaneRequest slots_only = DeviceGet(model, chain, 3);
  slots_only.mutable_get_blocks()->clear_device_out();
  head = Exchange(fd, Frame(slots_only));
  EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kInvalidArgument)) << head.message();
  // A device slot in a frame without `device`.
  const std::vector<std::string> more = client::HashChain(52, 2);
  head = Exchange(fd, PutFrame(model, true, {more[1]}, false, true));
  EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kInvalidArgument)) << head.message();
  // The same connection still puts and reads.
  v1::DataPlaneRequest get;
  *get.mutable_get_blocks() = DeviceGet(model, chain, 0).get_blocks();
  get.mutable_get_blocks()->clear_device_out();
  head = Exchange(fd, Frame(get));
  EXPECT_EQ(head.code(), 0u) << head.message();
  EXPECT_EQ(head.blocks_size(), 3);
  close(fd);
  // gRPC serves device_out nowhere.
  EXPECT_EQ(client_->GetBlocks(DeviceGet(model, chain, 3).get_blocks()).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(DeviceKvTest, AServerWithoutCudaIpcSaysSo) {
  StartServer({"--data_cuda_ipc=false"});
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> chain = client::HashChain(53, 2);
  const int fd = RawConnect(server_->data_address());
  SendRaw(fd, "TQKVDP01");
  v1::DataPlaneReply head = Exchange(fd, PutFrame(model, true, chain, true, true));
  EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kFailedPrecondition)) << head.message();
  EXPECT_NE(head.message().find("--data_cuda_ipc=false"), std::string::npos) << head.message();
  EXPECT_EQ(Hits(model, chain), 0u);
  PutDense(model, chain, 80);
  head = Exchange(fd, Frame(DeviceGet(model, chain, 2)));
  EXPECT_EQ(head.code(), static_cast<uint32_t>(StatusCode::kFailedPrecondition)) << head.message();
  close(fd);
}

// The C++ client's device puts: every frame names the memory; a CPU
// server's refusal comes back whole and nothing commits.
TEST_F(DeviceKvTest, TheCppClientPutsDeviceFrames) {
  StartServer();
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> chain = client::HashChain(54, 3);
  client::DataPlaneClientOptions o;
  o.target = server_->data_address();
  auto dp = client::DataPlaneClient::Connect(o);
  ASSERT_TRUE(dp.ok()) << dp.status();
  v1::PutHeader header;
  *header.mutable_model() = model;
  std::vector<v1::PutBlock> blocks;
  for (size_t i = 0; i < chain.size(); ++i) {
    blocks.emplace_back();
    blocks.back().set_block_hash(chain[i]);
    blocks.back().set_device_slot(i);
  }
  const v1::DeviceKv device = Device();
  absl::StatusOr<v1::PutBlocksResponse> r = (*dp)->PutBlocks(header, blocks, /*frame_bytes=*/1, &device);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status();
  EXPECT_EQ(Hits(model, chain), 0u);
  // The connection goes on with a put over the wire.
  PutDense(model, chain, 90);
  EXPECT_EQ(Hits(model, chain), 3u);
}

}  // namespace
}  // namespace tqkv::testing
