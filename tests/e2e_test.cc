// End to end over the real server binary and the real client: register →
// put 1,000 blocks → lookup → get packed and dense (checked byte for byte
// against a local CPU encode/decode) → layer-range puts → sequences,
// append and attend (checked against fp64 reference attention over the
// dequantized stored data); a per-tenant host quota through the flag.
#include <cmath>
#include <cstring>

#include "codec/attention.h"
#include "codec/dtype.h"
#include "tests/fixture.h"

namespace tqkv::testing {
namespace {

class E2eTest : public ServerTest {
 protected:
  void SetUp() override {
    StartServer();
    codec_ = SmallCodec();
  }
  std::unique_ptr<ModelCodec> codec_;
  CpuBackend backend_{CpuBackend::Options{0}};
};

v1::Tensor Slice(const v1::Tensor& t, int layer) {
  v1::Tensor out = t;
  const size_t per = t.data().size() / t.shape(0);
  out.set_shape(0, 1);
  out.set_data(t.data().substr(layer * per, per));
  return out;
}

std::vector<float> ToFloats(const v1::Tensor& t) {
  const DType d = t.dtype() == v1::DTYPE_FP32 ? DType::kF32
                  : t.dtype() == v1::DTYPE_BF16 ? DType::kBF16
                                                : DType::kF16;
  std::vector<float> out(t.data().size() / DTypeSize(d));
  ToFloat(d, t.data().data(), out.data(), out.size());
  return out;
}

TEST_F(E2eTest, RegisterIsIdempotentAndReturnsTheFormat) {
  auto a = client_->RegisterModel(client::SmallModel("m"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->created());
  EXPECT_EQ(a->layout_fingerprint().size(), 32u);
  EXPECT_EQ(a->format().block_bytes(), codec_->block_bytes());
  EXPECT_EQ(a->format().layers(1).offset(), codec_->layer_offset(1));
  EXPECT_EQ(a->format().layers(0).cache_dtype(), "k4v4");
  auto b = client_->RegisterModel(client::SmallModel("m"));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(b->created());
  EXPECT_EQ(b->model_id(), a->model_id());
  EXPECT_EQ(b->layout_fingerprint(), a->layout_fingerprint());
  // "tq4" is an alias of k4v4: same bytes, same fingerprint.
  v1::RegisterModelRequest alias = client::SmallModel("m");
  alias.mutable_codec()->set_cache_dtype("tq4");
  auto c = client_->RegisterModel(alias);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->created());
}

TEST_F(E2eTest, PutThousandLookupGetPackedAndDense) {
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> chain = client::HashChain(1, 1000);
  std::vector<v1::PutBlock> blocks = PutDense(model, chain, 100);
  ASSERT_EQ(blocks.size(), 1000u);
  EXPECT_EQ(Blocks(model, v1::TIER_HOST), 1000u);

  v1::LookupRequest lr;
  *lr.mutable_model() = model;
  for (const auto& h : chain) lr.add_block_hashes(h);
  lr.add_block_hashes(client::ChainHash(chain.back(), 1, 5000));  // not stored
  auto look = client_->Lookup(lr);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->hits(), 1000u);
  ASSERT_EQ(look->tiers_size(), 1000);
  for (int t : look->tiers()) EXPECT_EQ(t, v1::TIER_HOST);

  v1::GetBlocksRequest gr;
  *gr.mutable_model() = model;
  for (const auto& h : chain) gr.add_block_hashes(h);
  auto packed = client_->GetBlocks(gr);
  ASSERT_TRUE(packed.ok()) << packed.status();
  ASSERT_EQ(packed->size(), 1000u);
  ASSERT_TRUE((*packed)[0].has_format());
  EXPECT_EQ((*packed)[0].format().block_bytes(), codec_->block_bytes());
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ((*packed)[i].block_hash(), chain[i]);
    ASSERT_EQ((*packed)[i].payload(), EncodeLocally(*codec_, backend_, blocks[i]))
        << "block " << i << " differs from the local CPU encode";
  }

  gr.set_dense(true);
  auto dense = client_->GetBlocks(gr);
  ASSERT_TRUE(dense.ok()) << dense.status();
  ASSERT_EQ(dense->size(), 1000u);
  const ModelShape& s = codec_->shape();
  const size_t layer_elems = size_t{16} * s.num_kv_heads * s.head_dim;
  for (size_t i = 0; i < 1000; ++i) {
    const v1::GetBlocksResponse& d = (*dense)[i];
    ASSERT_EQ(d.k().dtype(), v1::DTYPE_FP16);
    ASSERT_EQ(d.k().shape_size(), 4);
    std::string k(2 * layer_elems * 2, '\0'), v(k.size(), '\0');
    std::vector<MutableDenseView> kv, vv;
    for (int l = 0; l < 2; ++l) {
      kv.push_back({k.data() + l * layer_elems * 2, DType::kF16, 16, s.num_kv_heads, s.head_dim});
      vv.push_back({v.data() + l * layer_elems * 2, DType::kF16, 16, s.num_kv_heads, s.head_dim});
    }
    const auto* payload = reinterpret_cast<const uint8_t*>((*packed)[i].payload().data());
    ASSERT_TRUE(backend_.DecodeBlock(*codec_, 0, 2, payload, kv, vv).ok());
    ASSERT_EQ(d.k().data(), k) << "dense K of block " << i;
    ASSERT_EQ(d.v().data(), v) << "dense V of block " << i;
  }

  // A layer range: only layer 1's bytes, dense in fp32.
  v1::GetBlocksRequest one;
  *one.mutable_model() = model;
  one.add_block_hashes(chain[7]);
  one.set_first_layer(1);
  auto l1 = client_->GetBlocks(one);
  ASSERT_TRUE(l1.ok()) << l1.status();
  EXPECT_EQ((*l1)[0].payload(), (*packed)[7].payload().substr(codec_->layer_offset(1)));
  one.set_dense(true);
  one.set_dense_dtype(v1::DTYPE_FP32);
  auto l1d = client_->GetBlocks(one);
  ASSERT_TRUE(l1d.ok()) << l1d.status();
  EXPECT_EQ((*l1d)[0].k().shape(0), 1);
  std::vector<float> k32 = ToFloats((*l1d)[0].k());
  std::vector<float> k16 = ToFloats((*dense)[7].k());
  ASSERT_EQ(k32.size() * 2, k16.size());
  for (size_t j = 0; j < k32.size(); ++j)
    ASSERT_EQ(FloatToHalf(k32[j]), FloatToHalf(k16[k32.size() + j]));

  // Re-putting identical blocks is idempotent.
  v1::PutHeader h;
  *h.mutable_model() = model;
  auto again = client_->PutBlocks(h, {blocks.begin(), blocks.begin() + 10});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->committed(), 0u);
  EXPECT_EQ(again->already_present(), 10u);
  EXPECT_EQ(Blocks(model), 1000u);
}

TEST_F(E2eTest, LayerRangePutsStageUntilEveryLayerArrives) {
  const v1::ModelRef model = RegisterSmall();
  const v1::ModelLayout layout = client::SmallModel("x").layout();
  const std::string hash = client::ChainHash("", 9, 0);
  const v1::PutBlock full = client::DenseBlock(layout, hash, "", 77);
  for (int layer = 0; layer < 2; ++layer) {
    v1::PutBlock part = full;
    *part.mutable_k() = Slice(full.k(), layer);
    *part.mutable_v() = Slice(full.v(), layer);
    v1::PutHeader h;
    *h.mutable_model() = model;
    h.set_first_layer(layer);
    h.set_last_layer(layer + 1);
    auto r = client_->PutBlocks(h, {part});
    ASSERT_TRUE(r.ok()) << r.status();
    v1::LookupRequest lr;
    *lr.mutable_model() = model;
    lr.add_block_hashes(hash);
    auto look = client_->Lookup(lr);
    ASSERT_TRUE(look.ok());
    if (layer == 0) {
      EXPECT_EQ(r->staged(), 1u);
      EXPECT_EQ(r->committed(), 0u);
      EXPECT_EQ(look->hits(), 0u) << "a half-put block must not be visible";
    } else {
      EXPECT_EQ(r->staged(), 0u);
      EXPECT_EQ(r->committed(), 1u);
      EXPECT_EQ(look->hits(), 1u);
    }
  }
  v1::GetBlocksRequest gr;
  *gr.mutable_model() = model;
  gr.add_block_hashes(hash);
  auto got = client_->GetBlocks(gr);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].payload(), EncodeLocally(*codec_, backend_, full));
}

// Reference: fp64 attention over DequantizeSequence of the stored pages,
// the locally re-encoded owned pages and the dense tail.
struct RefSequence {
  std::vector<std::string> pages;  // whole-block payloads, in order
  std::vector<float> tail_k, tail_v;  // per-layer stream of appended tokens
};

std::vector<double> Reference(const ModelCodec& codec, CpuBackend& backend, int layer,
                              const std::vector<std::string>& stored,
                              const std::vector<float>& stream_k,
                              const std::vector<float>& stream_v, const std::vector<float>& q,
                              const std::vector<int64_t>& positions) {
  const ModelShape& s = codec.shape();
  const size_t row = size_t{2} * s.head_dim;
  const int64_t stream_tokens = static_cast<int64_t>(stream_k.size() / row);
  std::vector<std::string> pages = stored;
  int64_t packed = 0;
  while (stream_tokens - packed >= s.block_size) {
    std::string buf(codec.block_bytes(), '\0');
    DenseView k{stream_k.data() + packed * row, DType::kF32, s.block_size, 2, s.head_dim};
    DenseView v{stream_v.data() + packed * row, DType::kF32, s.block_size, 2, s.head_dim};
    EXPECT_TRUE(backend
                    .EncodeBlock(codec, layer, layer + 1, {k}, {v},
                                 reinterpret_cast<uint8_t*>(buf.data()) + codec.layer_offset(layer))
                    .ok());
    pages.push_back(buf);
    packed += s.block_size;
  }
  PackedSequence seq;
  for (const std::string& p : pages) {
    const auto* base = reinterpret_cast<const uint8_t*>(p.data()) + codec.layer_offset(layer);
    seq.k_pages.push_back(base);
    seq.v_pages.push_back(base + codec.k_page_bytes(layer));
  }
  seq.packed_tokens = static_cast<int64_t>(pages.size()) * s.block_size;
  const int64_t tail = stream_tokens - packed;
  seq.tail_k = {stream_k.data() + packed * row, DType::kF32, tail, 2, s.head_dim};
  seq.tail_v = {stream_v.data() + packed * row, DType::kF32, tail, 2, s.head_dim};
  std::vector<float> k, v;
  DequantizeSequence(codec.layer(layer), s.block_size, seq, &k, &v);
  AttentionShape shape{s.num_q_heads, s.num_kv_heads, s.head_dim, 0};
  std::vector<double> out(q.size());
  ReferenceAttention(shape, q.data(), static_cast<int64_t>(positions.size()), positions.data(),
                     k.data(), v.data(), seq.total_tokens(), out.data());
  return out;
}

double RelativeError(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

TEST_F(E2eTest, SequencesAppendAndAttendMatchReference) {
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> chain = client::HashChain(3, 5);
  PutDense(model, chain, 500);
  v1::GetBlocksRequest gr;
  *gr.mutable_model() = model;
  for (const auto& h : chain) gr.add_block_hashes(h);
  auto got = client_->GetBlocks(gr);
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<std::string> payloads;
  for (const auto& r : *got) payloads.push_back(r.payload());

  // Sequence A: blocks 0..2 and a 5-token tail; layer 0 then gets 40 more
  // tokens (32 of the 45 are packed into two sequence-owned blocks: the
  // tail completed by 11 new tokens, then 16 new tokens read straight from
  // the request; 13 stay dense).
  v1::CreateSequenceRequest ca;
  *ca.mutable_model() = model;
  for (int i = 0; i < 3; ++i) ca.add_block_hashes(chain[i]);
  *ca.mutable_tail_k() = client::RandomTensor(v1::DTYPE_FP16, {2, 5, 2, 64}, 11);
  *ca.mutable_tail_v() = client::RandomTensor(v1::DTYPE_FP16, {2, 5, 2, 64}, 12);
  auto a = client_->CreateSequence(ca);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->num_tokens(), 53u);
  v1::AppendRequest ap;
  ap.set_sequence_id(a->sequence_id());
  ap.set_layer(0);
  *ap.mutable_k() = client::RandomTensor(v1::DTYPE_FP16, {40, 2, 64}, 13);
  *ap.mutable_v() = client::RandomTensor(v1::DTYPE_FP16, {40, 2, 64}, 14);
  auto apr = client_->Append(ap);
  ASSERT_TRUE(apr.ok()) << apr.status();
  EXPECT_EQ(apr->num_tokens(), 93u);

  // Sequence B: blocks 3..4, then exactly one block's worth on layer 0.
  v1::CreateSequenceRequest cb;
  *cb.mutable_model() = model;
  cb.add_block_hashes(chain[3]);
  cb.add_block_hashes(chain[4]);
  auto b = client_->CreateSequence(cb);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->num_tokens(), 32u);
  v1::AppendRequest bp;
  bp.set_sequence_id(b->sequence_id());
  bp.set_layer(0);
  *bp.mutable_k() = client::RandomTensor(v1::DTYPE_BF16, {16, 2, 64}, 15);
  *bp.mutable_v() = client::RandomTensor(v1::DTYPE_BF16, {16, 2, 64}, 16);
  ASSERT_TRUE(client_->Append(bp).ok());

  v1::AttendRequest at;
  at.set_layer(0);
  v1::AttendItem* ia = at.add_items();
  ia->set_sequence_id(a->sequence_id());
  *ia->mutable_q() = client::RandomTensor(v1::DTYPE_FP16, {3, 4, 64}, 17);
  for (uint64_t p : {10, 50, 92}) ia->add_positions(p);
  v1::AttendItem* ib = at.add_items();
  ib->set_sequence_id(b->sequence_id());
  *ib->mutable_q() = client::RandomTensor(v1::DTYPE_FP32, {1, 4, 64}, 18);
  auto out = client_->Attend(at);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->outputs_size(), 2);
  EXPECT_EQ(out->outputs(0).dtype(), v1::DTYPE_FP16);
  EXPECT_EQ(out->outputs(1).dtype(), v1::DTYPE_FP32);

  // Reference for A, layer 0: the token stream is tail (layer 0) ++ append.
  std::vector<float> sk = ToFloats(Slice(ca.tail_k(), 0)), sv = ToFloats(Slice(ca.tail_v(), 0));
  std::vector<float> ak = ToFloats(ap.k()), av = ToFloats(ap.v());
  sk.insert(sk.end(), ak.begin(), ak.end());
  sv.insert(sv.end(), av.begin(), av.end());
  std::vector<double> want_a =
      Reference(*codec_, backend_, 0, {payloads[0], payloads[1], payloads[2]}, sk, sv,
                ToFloats(ia->q()), {10, 50, 92});
  const double err_a = RelativeError(ToFloats(out->outputs(0)), want_a);
  EXPECT_LT(err_a, 1e-3);
  std::vector<double> want_b = Reference(*codec_, backend_, 0, {payloads[3], payloads[4]},
                                         ToFloats(bp.k()), ToFloats(bp.v()), ToFloats(ib->q()),
                                         {47});
  const double err_b = RelativeError(ToFloats(out->outputs(1)), want_b);
  EXPECT_LT(err_b, 1e-3);
  double norm = 0;
  for (double x : want_b) norm += x * x;
  EXPECT_GT(norm, 1e-6) << "reference output must be non-trivial";

  // Layer 1 of A has only the 5-token tail after the blocks (decode query).
  v1::AttendRequest at1;
  at1.set_layer(1);
  v1::AttendItem* i1 = at1.add_items();
  i1->set_sequence_id(a->sequence_id());
  *i1->mutable_q() = client::RandomTensor(v1::DTYPE_FP32, {1, 4, 64}, 19);
  auto out1 = client_->Attend(at1);
  ASSERT_TRUE(out1.ok()) << out1.status();
  std::vector<double> want1 =
      Reference(*codec_, backend_, 1, {payloads[0], payloads[1], payloads[2]},
                ToFloats(Slice(ca.tail_k(), 1)), ToFloats(Slice(ca.tail_v(), 1)),
                ToFloats(i1->q()), {52});
  EXPECT_LT(RelativeError(ToFloats(out1->outputs(0)), want1), 1e-3);

  v1::DropSequenceRequest drop;
  drop.set_sequence_id(a->sequence_id());
  ASSERT_TRUE(client_->DropSequence(drop).ok());
  auto gone = client_->Attend(at1);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
}

// --tenant_host_quota_bytes of 3 blocks: a stream of 4 blocks cannot fit
// its own reservations and is RESOURCE_EXHAUSTED naming the tenant, storing
// nothing; later streams evict (spill) the tenant's own oldest blocks to
// stay within it in host memory.
class TenantQuotaTest : public ServerTest {};

TEST_F(TenantQuotaTest, APutOverTheQuotaEvictsTheTenantsOwnBlocksOrFails) {
  const uint64_t block = SmallCodec()->block_bytes();
  StartServer({"--tenant_host_quota_bytes=" + std::to_string(3 * block)});
  const v1::ModelRef model = RegisterSmall();
  const std::vector<std::string> big = client::HashChain(91, 4), first = client::HashChain(92, 2),
                                 second = client::HashChain(93, 2);
  const v1::ModelLayout layout = client::SmallModel("x").layout();
  v1::PutHeader h;
  *h.mutable_model() = model;
  std::vector<v1::PutBlock> blocks;
  for (size_t i = 0; i < big.size(); ++i) blocks.push_back(client::DenseBlock(layout, big[i], i ? big[i - 1] : "", i));
  auto r = client_->PutBlocks(h, blocks);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("default"), std::string::npos) << r.status();
  EXPECT_EQ(Blocks(model), 0u);
  PutDense(model, first, 10);
  PutDense(model, second, 20);  // spills the oldest of `first`
  EXPECT_EQ(Blocks(model, v1::TIER_HOST), 3u);
  EXPECT_EQ(Blocks(model, v1::TIER_DISK), 1u);
  v1::LookupRequest lr;
  *lr.mutable_model() = model;
  for (const auto& hash : second) lr.add_block_hashes(hash);
  auto look = client_->Lookup(lr);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->hits(), 2u);
}

TEST_F(E2eTest, HealthAndStatsReportTheBackend) {
  auto h = client_->Health();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(*h);
  auto s = client_->Stats(v1::StatsRequest());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->backend(), TestBackend());
  EXPECT_EQ(s->tenant(), "default");
}

}  // namespace
}  // namespace tqkv::testing
