// 16 concurrent clients × 1,000 blocks each against one server: every
// block comes back with exactly its own bytes (no loss, no mix-up), and
// concurrent puts of one shared prefix commit each block exactly once.
#include <atomic>
#include <thread>

#include "tests/fixture.h"

namespace tqkv::testing {
namespace {

constexpr int kClients = 16;
constexpr int kBlocks = 1000;
constexpr int kShared = 50;

// Deterministic bytes unique to (client, index); client -1 is the shared prefix.
std::string Payload(int client, int index, size_t size) {
  uint64_t x = 0x9e3779b97f4a7c15ULL * (client + 2) + 0xbf58476d1ce4e5b9ULL * (index + 1);
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    out[i] = static_cast<char>((x * 0x2545F4914F6CDD1DULL) >> 56);
  }
  return out;
}

class ConcurrencyTest : public ServerTest {};

TEST_F(ConcurrencyTest, SixteenClientsThousandBlocksEach) {
  StartServer();
  const v1::ModelRef model = RegisterSmall();
  const size_t block_bytes = SmallCodec()->block_bytes();
  const auto shared = client::HashChain(7777, kShared);
  std::atomic<int> failures{0};
  std::atomic<uint32_t> shared_committed{0}, shared_present{0};
  std::vector<std::string> errors(kClients);

  auto worker = [&](int c) {
    client::ClientOptions o;
    o.target = server_->address();
    o.deadline = absl::Seconds(60);
    auto cl = client::Client::Connect(o);
    if (!cl.ok()) {
      ++failures;
      return;
    }
    v1::PutHeader h;
    *h.mutable_model() = model;
    h.set_packed(true);
    // The shared prefix: identical bytes from every client.
    std::vector<v1::PutBlock> sb;
    for (int i = 0; i < kShared; ++i) {
      v1::PutBlock b;
      b.set_block_hash(shared[i]);
      b.set_payload(Payload(-1, i, block_bytes));
      sb.push_back(std::move(b));
    }
    auto sr = (*cl)->PutBlocks(h, sb);
    if (!sr.ok()) {
      errors[c] = sr.status().ToString();
      ++failures;
      return;
    }
    shared_committed += sr->committed();
    shared_present += sr->already_present();

    const auto chain = client::HashChain(100 + c, kBlocks);
    for (int s = 0; s < kBlocks; s += 250) {
      std::vector<v1::PutBlock> blocks;
      for (int i = s; i < s + 250; ++i) {
        v1::PutBlock b;
        b.set_block_hash(chain[i]);
        if (i > 0) b.set_parent_hash(chain[i - 1]);
        b.set_payload(Payload(c, i, block_bytes));
        blocks.push_back(std::move(b));
      }
      auto r = (*cl)->PutBlocks(h, blocks);
      if (!r.ok() || r->committed() != 250) {
        errors[c] = r.ok() ? "short commit" : r.status().ToString();
        ++failures;
        return;
      }
    }
    v1::GetBlocksRequest gr;
    *gr.mutable_model() = model;
    for (const auto& x : chain) gr.add_block_hashes(x);
    auto got = (*cl)->GetBlocks(gr);
    if (!got.ok() || got->size() != static_cast<size_t>(kBlocks)) {
      errors[c] = got.ok() ? "short get" : got.status().ToString();
      ++failures;
      return;
    }
    for (int i = 0; i < kBlocks; ++i) {
      if ((*got)[i].block_hash() != chain[i] || (*got)[i].payload() != Payload(c, i, block_bytes)) {
        errors[c] = "block " + std::to_string(i) + " has the wrong bytes";
        ++failures;
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) threads.emplace_back(worker, c);
  for (auto& t : threads) t.join();
  for (int c = 0; c < kClients; ++c) EXPECT_EQ(errors[c], "") << "client " << c;
  ASSERT_EQ(failures.load(), 0);
  EXPECT_EQ(shared_committed.load(), static_cast<uint32_t>(kShared))
      << "each shared block is committed by exactly one client";
  EXPECT_EQ(shared_present.load(), static_cast<uint32_t>(kShared * (kClients - 1)));
  EXPECT_EQ(Blocks(model), static_cast<uint64_t>(kClients * kBlocks + kShared));

  // Cross-check: every chain is a full prefix hit, nothing leaked between
  // clients' chains.
  for (int c = 0; c < kClients; ++c) {
    v1::LookupRequest lr;
    *lr.mutable_model() = model;
    for (const auto& x : client::HashChain(100 + c, kBlocks)) lr.add_block_hashes(x);
    auto look = client_->Lookup(lr);
    ASSERT_TRUE(look.ok());
    EXPECT_EQ(look->hits(), static_cast<uint32_t>(kBlocks));
  }
}

}  // namespace
}  // namespace tqkv::testing
