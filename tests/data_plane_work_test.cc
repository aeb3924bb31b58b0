// The backend work queue (--work_threads, --work_queue): bulk backend work
// (puts, dense gets) runs off the event loops and gRPC's threads. Against
// the real server: frames sent back to back, some served on the queue and
// some on the loop, are answered in order; a queue of one with many
// data-plane clients holds connections back instead of failing them, and
// every answer is the one a server without the queue gives; gRPC puts and
// dense gets never fail for a full queue (they run on their own thread);
// connections that close while their request is on the queue leave the
// server serving with its budgets given back; --work_threads 0 serves
// everything on the loops; bad flags are refused.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/data_plane_client.h"
#include "tests/fixture.h"
#include "tests/raw_data_plane.h"

namespace tqkv::testing {
namespace {

class DataPlaneWorkTest : public ServerTest {
 protected:
  void Start(const std::vector<std::string>& flags) {
    StartServer(flags);
    model_ = RegisterSmall();
    chain_ = client::HashChain(5, 4);
    PutDense(model_, chain_, 300);
  }

  std::unique_ptr<client::DataPlaneClient> Connect() {
    client::DataPlaneClientOptions o;
    o.target = server_->data_address();
    auto c = client::DataPlaneClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  std::string NewSequence() { return ServerTest::NewSequence(model_, chain_, 3, 31); }

  // Attend of a query alone (no new token): the same answer however often.
  static v1::DataPlaneRequest Attend(const std::string& id, int layer, uint64_t seed) {
    v1::DataPlaneRequest r;
    r.mutable_attend()->set_layer(layer);
    v1::AttendItem* item = r.mutable_attend()->add_items();
    item->set_sequence_id(id);
    *item->mutable_q() = client::RandomTensor(v1::DTYPE_FP16, {1, 4, 64}, seed);
    return r;
  }

  v1::DataPlaneRequest Get(std::vector<std::string> hashes, bool dense) const {
    v1::DataPlaneRequest r;
    *r.mutable_get_blocks()->mutable_model() = model_;
    for (const auto& h : hashes) r.mutable_get_blocks()->add_block_hashes(h);
    r.mutable_get_blocks()->set_dense(dense);
    return r;
  }

  // One put stream of `n` dense blocks in one frame, committed.
  v1::DataPlaneRequest PutFrame(int n, uint64_t seed) const {
    v1::DataPlaneRequest r;
    v1::DataPlanePut* put = r.mutable_put();
    *put->mutable_header()->mutable_model() = model_;
    const v1::ModelLayout layout = client::SmallModel("x").layout();
    std::string parent;
    for (int i = 0; i < n; ++i) {
      const std::string hash = client::ChainHash(parent, seed, i);
      *put->add_blocks() = client::DenseBlock(layout, hash, parent, seed + i);
      parent = hash;
    }
    put->set_commit(true);
    return r;
  }

  v1::ModelRef model_;
  std::vector<std::string> chain_;
};

TEST_F(DataPlaneWorkTest, FramesSentBackToBackAreAnsweredInOrder) {
  Start({});
  const std::string id = NewSequence();
  // Queued (Attend, dense get, put) and loop-served (packed get, a miss)
  // frames interleaved, all written before any reply is read.
  std::vector<v1::DataPlaneRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    reqs.push_back(Attend(id, i % 2, 40 + i));
    reqs.push_back(Get({chain_[i % 4]}, /*dense=*/false));
    reqs.push_back(Get({chain_[0], chain_[1]}, /*dense=*/true));
    reqs.push_back(Get({"no-such-block"}, /*dense=*/false));
    reqs.push_back(PutFrame(2, 1000 + 10 * i));
  }
  std::string wire = "TQKVDP01";
  for (const auto& r : reqs) wire += Frame(r);
  const int fd = RawConnect(server_->data_address());
  SendRaw(fd, wire);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("reply ", i));
    v1::DataPlaneReply head;
    std::string payload;
    ASSERT_TRUE(ReadReply(fd, &head, &payload));
    switch (i % 5) {
      case 0:
        EXPECT_EQ(head.code(), 0u) << head.message();
        EXPECT_EQ(head.attend().outputs_size(), 1);
        break;
      case 1:
        EXPECT_EQ(head.code(), 0u) << head.message();
        ASSERT_EQ(head.blocks_size(), 1);
        EXPECT_EQ(head.blocks(0).block_hash(), chain_[(i / 5) % 4]);
        break;
      case 2:
        EXPECT_EQ(head.code(), 0u) << head.message();
        ASSERT_EQ(head.blocks_size(), 2);
        EXPECT_EQ(payload.size(), 2 * head.blocks(0).payload_bytes());
        break;
      case 3:
        EXPECT_EQ(head.code(), static_cast<uint32_t>(absl::StatusCode::kNotFound));
        break;
      case 4:
        EXPECT_EQ(head.code(), 0u) << head.message();
        EXPECT_EQ(head.put().committed(), 2u);
        break;
    }
  }
  close(fd);
}

TEST_F(DataPlaneWorkTest, AFullQueueHoldsClientsBackAndTheirAnswersAreTheLoopsAnswers) {
  // The dense blocks of a server that decodes on its loops...
  Start({"--work_threads=0"});
  std::vector<std::string> expected;
  {
    auto dp = Connect();
    ASSERT_NE(dp, nullptr);
    for (int k = 0; k < 4; ++k) {
      client::DataPlaneBlocks out;
      absl::Status st = dp->GetBlocks(Get({chain_[k]}, /*dense=*/true).get_blocks(), &out);
      ASSERT_TRUE(st.ok()) << st;
      expected.emplace_back(out.payload(0));
    }
  }
  // ...are those of one whose queue holds a single request, under 12
  // clients at once: none fails.
  data_dir_.clear();
  Start({"--work_threads=1", "--work_queue=1"});
  std::vector<std::thread> clients;
  std::atomic<int> failures{0}, mismatches{0};
  for (int c = 0; c < 12; ++c) {
    clients.emplace_back([&] {
      auto dp = Connect();
      if (dp == nullptr) {
        failures.fetch_add(1);
        return;
      }
      client::DataPlaneBlocks out;
      for (int round = 0; round < 10; ++round)
        for (int k = 0; k < 4; ++k) {
          absl::Status st = dp->GetBlocks(Get({chain_[k]}, /*dense=*/true).get_blocks(), &out);
          if (!st.ok()) {
            failures.fetch_add(1);
            ADD_FAILURE() << st;
            return;
          }
          if (out.payload(0) != expected[k]) mismatches.fetch_add(1);
        }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(Metric("tqkv_work_queue_capacity"), 1);
  EXPECT_GT(Metric("tqkv_work_queue_full_total"), 0);  // the queue was full, and no client saw it
  EXPECT_EQ(Metric("tqkv_work_queue_waiting"), 0);
}

TEST_F(DataPlaneWorkTest, GrpcPutsAndDenseGetsNeverFailForAFullQueue) {
  Start({"--work_threads=1", "--work_queue=1"});
  const v1::ModelLayout layout = client::SmallModel("x").layout();
  std::vector<std::thread> clients;
  std::atomic<int> failures{0};
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&, c] {
      for (int round = 0; round < 5; ++round) {
        std::vector<v1::PutBlock> blocks;
        std::string parent;
        for (int i = 0; i < 4; ++i) {
          const std::string hash = client::ChainHash(parent, 900 + c, round * 4 + i);
          blocks.push_back(client::DenseBlock(layout, hash, parent, 7000 + 100 * c + 4 * round + i));
          parent = hash;
        }
        v1::PutHeader h;
        *h.mutable_model() = model_;
        auto put = client_->PutBlocks(h, blocks);
        if (!put.ok() || put->committed() != 4) {
          failures.fetch_add(1);
          ADD_FAILURE() << put.status();
        }
        v1::GetBlocksRequest get;
        *get.mutable_model() = model_;
        get.add_block_hashes(blocks[0].block_hash());
        get.set_dense(true);
        auto got = client_->GetBlocks(get);
        if (!got.ok() || got->size() != 1) {
          failures.fetch_add(1);
          ADD_FAILURE() << got.status();
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(DataPlaneWorkTest, ConnectionsClosedWhileTheirRequestRunsLeaveTheServerServing) {
  Start({"--work_threads=1"});
  const std::string id = NewSequence();
  for (int i = 0; i < 20; ++i) {
    const int fd = RawConnect(server_->data_address());
    std::string wire = "TQKVDP01";
    for (int k = 0; k < 3; ++k) wire += Frame(PutFrame(4, 5000 + 10 * i + k));
    wire += Frame(Attend(id, 0, 9));
    SendRaw(fd, wire);
    if (i % 2 == 0) shutdown(fd, SHUT_RDWR);  // reset at once, or closed with the replies unread
    close(fd);
  }
  // Still serving, and nothing of the closed connections is held: a
  // budget of two largest frames admits the next ones.
  auto dp = Connect();
  ASSERT_NE(dp, nullptr);
  for (int k = 0; k < 20; ++k) {
    auto r = dp->Attend(Attend(id, 0, 9).attend());
    ASSERT_TRUE(r.ok()) << r.status();
  }
  v1::StatsRequest sr;
  auto stats = client_->Stats(sr);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(AwaitMetric("tqkv_data_plane_buffered_bytes", 0), 0);
  EXPECT_EQ(AwaitMetric("tqkv_data_plane_reply_bytes", 0), 0);
  EXPECT_EQ(Metric("tqkv_data_plane_connections"), 1);
}

TEST_F(DataPlaneWorkTest, WithoutWorkThreadsTheLoopsServeEverything) {
  Start({"--work_threads=0"});
  const std::string id = NewSequence();
  auto dp = Connect();
  ASSERT_NE(dp, nullptr);
  auto at = dp->Attend(Attend(id, 1, 5).attend());
  ASSERT_TRUE(at.ok()) << at.status();
  const int fd = RawConnect(server_->data_address());
  SendRaw(fd, "TQKVDP01" + Frame(PutFrame(3, 77)) + Frame(Get({chain_[2]}, /*dense=*/true)));
  v1::DataPlaneReply head;
  ASSERT_TRUE(ReadReply(fd, &head));
  EXPECT_EQ(head.code(), 0u) << head.message();
  EXPECT_EQ(head.put().committed(), 3u);
  ASSERT_TRUE(ReadReply(fd, &head));
  EXPECT_EQ(head.code(), 0u) << head.message();
  EXPECT_EQ(head.blocks_size(), 1);
  close(fd);
}

TEST_F(DataPlaneWorkTest, BadWorkQueueFlagsAreRefused) {
  for (const char* bad : {"--work_threads=-1", "--work_threads=65", "--work_queue=0"}) {
    SCOPED_TRACE(bad);
    auto p = ServerProcess::Start(::testing::TempDir() + "/bad-work-flags", {bad});
    EXPECT_FALSE(p.ok());
  }
}

}  // namespace
}  // namespace tqkv::testing
