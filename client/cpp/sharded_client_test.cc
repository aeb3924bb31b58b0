// The sharded client's parts that need no server: shard lists, DNS
// resolution, down windows, routing-key rules, and shards that refuse
// connections (closed loopback ports). tests/sharded_test.cc drives real
// servers.
#include "client/cpp/sharded_client.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace tqkv::client {
namespace {

TEST(ParseShardListTest, AddressesAndWeights) {
  auto l = ParseShardList("a:1, b:2=2.5,[::1]:3");
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->size(), 3u);
  EXPECT_EQ((*l)[0].address, "a:1");
  EXPECT_EQ((*l)[0].weight, 1.0);
  EXPECT_EQ((*l)[1].address, "b:2");
  EXPECT_EQ((*l)[1].weight, 2.5);
  EXPECT_EQ((*l)[2].address, "[::1]:3");
}

TEST(ParseShardListTest, RejectsMalformedEntries) {
  for (const char* bad : {"", "a", "a:", ":1", "a:x", "a:1,", "a:1=0", "a:1=-1", "a:1=x", "a:1,a:1"}) {
    auto l = ParseShardList(bad);
    EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
}

TEST(ResolveShardsTest, LocalhostResolvesToLoopback) {
  auto r = ResolveShards("localhost:50051");
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::string> names;
  for (const ShardSpec& s : *r) names.push_back(s.address);
  EXPECT_TRUE(std::count(names.begin(), names.end(), "127.0.0.1:50051") == 1 ||
              std::count(names.begin(), names.end(), "[::1]:50051") == 1)
      << names.size();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_EQ(ResolveShards("localhost").status().code(), absl::StatusCode::kInvalidArgument);
  const absl::StatusCode missing = ResolveShards("no-such-host.invalid:1").status().code();
  EXPECT_TRUE(missing == absl::StatusCode::kNotFound || missing == absl::StatusCode::kUnavailable) << missing;
}

TEST(ShardTest, DownWindowThenFreshConnection) {
  Shard shard("127.0.0.1:1", ClientOptions());
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto a = shard.Acquire(t0);
  ASSERT_TRUE(a.ok()) << a.status();
  shard.AddModel(7);
  shard.Report(absl::NotFoundError("no such block"), t0, absl::Seconds(2));  // not a down code
  EXPECT_TRUE(shard.HasModel(7));
  EXPECT_EQ(shard.Acquire(t0)->get(), a->get());
  shard.Report(absl::UnavailableError("connection refused"), t0, absl::Seconds(2));
  EXPECT_FALSE(shard.HasModel(7)) << "a shard seen down forgets its registrations";
  auto during = shard.Acquire(t0 + absl::Seconds(1));
  EXPECT_EQ(during.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(during.status().message().find("shard 127.0.0.1:1 is down: connection refused"), std::string::npos)
      << during.status();
  auto after = shard.Acquire(t0 + absl::Seconds(2));
  ASSERT_TRUE(after.ok());
  EXPECT_NE(after->get(), a->get()) << "a new connection after the window";
}

ShardedClientOptions Refusing(int n, absl::Time* now) {
  ShardedClientOptions o;
  for (int i = 1; i <= n; ++i) o.servers.push_back({"127.0.0.1:" + std::to_string(i), 1.0});
  o.shard.max_attempts = 1;
  o.shard.deadline = absl::Seconds(5);
  o.clock = [now] { return *now; };
  return o;
}

TEST(ShardedClientTest, ConnectNeedsExactlyOneSource) {
  EXPECT_EQ(ShardedClient::Connect({}).status().code(), absl::StatusCode::kInvalidArgument);
  ShardedClientOptions both;
  both.servers = {{"a:1", 1.0}};
  both.dns = "a:1";
  EXPECT_EQ(ShardedClient::Connect(both).status().code(), absl::StatusCode::kInvalidArgument);
  ShardedClientOptions dup;
  dup.servers = {{"a:1", 1.0}, {"a:1", 1.0}};
  EXPECT_EQ(ShardedClient::Connect(dup).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardedClientTest, DnsMembersAreResolvedAddresses) {
  ShardedClientOptions o;
  o.dns = "localhost:7";
  auto c = ShardedClient::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<std::string> shards = (*c)->Shards();
  ASSERT_FALSE(shards.empty());
  for (const std::string& s : shards) EXPECT_TRUE(s == "127.0.0.1:7" || s == "[::1]:7") << s;
}

TEST(ShardedClientTest, PutKeysFollowParentsWithinTheCall) {
  absl::Time now = absl::FromUnixSeconds(1000);
  auto c = ShardedClient::Connect(Refusing(3, &now));
  ASSERT_TRUE(c.ok());
  v1::PutHeader h;
  v1::PutBlock orphan;
  orphan.set_block_hash("b2");
  orphan.set_parent_hash("b1");  // its chain started in an earlier call
  auto r = (*c)->PutBlocks(h, {orphan});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("pass routing keys"), std::string::npos) << r.status();
  r = (*c)->PutBlocks(h, {orphan, orphan}, {"a", "b", "c"});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << "3 keys for 2 blocks";
  v1::GetBlocksRequest g;
  g.add_block_hashes("x");
  g.add_block_hashes("y");
  EXPECT_EQ((*c)->GetBlocks(g, {"a", "b", "c"}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardedClientTest, DownShardsAnswerLookupsAsMissesAndNameThemselvesOnReads) {
  absl::Time now = absl::FromUnixSeconds(1000);
  auto c = ShardedClient::Connect(Refusing(3, &now));
  ASSERT_TRUE(c.ok());
  v1::LookupRequest lr;
  lr.mutable_model()->set_model_id(1);
  lr.add_block_hashes("root");
  lr.add_block_hashes("next");
  auto look = (*c)->Lookup(lr);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->hits(), 0u);
  const std::string owner = (*c)->ShardFor("root");
  v1::GetBlocksRequest g;
  g.mutable_model()->set_model_id(1);
  g.add_block_hashes("root");
  auto got = (*c)->GetBlocks(g);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(got.status().message().find("shard " + owner + " is down"), std::string::npos) << got.status();
  now += absl::Seconds(3);  // past the window: tried again, still refused
  got = (*c)->GetBlocks(g);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(got.status().message().find("is down"), std::string::npos) << "a fresh attempt: " << got.status();
  EXPECT_NE(got.status().message().find("shard " + owner + ": "), std::string::npos) << got.status();
  v1::AttendRequest ar;
  ar.add_items()->set_sequence_id("seq-without-shard");
  EXPECT_EQ((*c)->Attend(ar).status().code(), absl::StatusCode::kNotFound);
  ar.mutable_items(0)->set_sequence_id("10.9.9.9:1/seq-1");
  EXPECT_EQ((*c)->Attend(ar).status().code(), absl::StatusCode::kNotFound) << "not a member";
  for (const auto& h : (*c)->Health()) EXPECT_FALSE(h.result.ok()) << h.shard;
}

}  // namespace
}  // namespace tqkv::client
