// Writes the seed corpora of service_fuzzer and data_plane_fuzzer:
//   bazel run //fuzz:make_seeds -- $PWD/fuzz/corpus
// Each service seed is replayed here first and must end with the status
// written next to it, so a seed that stops reaching its request (a
// changed default, a stricter check) is noticed when seeds are remade.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "client/cpp/synthetic.h"
#include "fuzz/seed_world.h"
#include "fuzz/service_harness.h"
#include "fuzz/service_input.h"
#include "service/data_plane.h"

namespace tqkv::fuzz {
namespace {

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

// The world built as records: register, one stream of every block.
std::string WorldRecords(const SeedWorld& w, bool finish = true) {
  std::string r;
  AppendRecord(r, kRegister, w.registration);
  v1::PutBlocksRequest msg;
  msg.mutable_header();
  AppendRecord(r, kPutMessage | kUseCurrent, msg);
  for (const v1::PutBlock& b : w.blocks) {
    *msg.mutable_block() = b;
    AppendRecord(r, kPutMessage, msg);
  }
  if (finish) AppendRecord(r, kPutFinish, "");
  return r;
}

template <typename Req>
Req WithHashes(const SeedWorld& w) {
  Req req;
  for (const std::string& h : w.hashes) req.add_block_hashes(h);
  return req;
}

void ServiceSeeds(const std::string& dir) {
  const SeedWorld w = WorldRequests();
  SharedParts shared;
  std::vector<std::pair<std::string, std::string>> seeds;
  seeds.emplace_back("register_put", WorldRecords(w));
  {
    std::string r = WorldRecords(w);
    AppendRecord(r, kLookup | kUseCurrent, WithHashes<v1::LookupRequest>(w));
    auto get = WithHashes<v1::GetBlocksRequest>(w);
    AppendRecord(r, kGet | kUseCurrent, get);
    get.set_dense(true);
    get.set_first_layer(1);
    AppendRecord(r, kGet | kUseCurrent, get);
    auto pin = WithHashes<v1::PinRequest>(w);
    pin.set_ttl_ms(1000);
    AppendRecord(r, kPin | kUseCurrent, pin);
    AppendRecord(r, kUnpin | kUseCurrent, WithHashes<v1::UnpinRequest>(w));
    AppendRecord(r, kStats, v1::StatsRequest());
    v1::EvictRequest ev;
    ev.set_max_bytes(1 << 20);
    AppendRecord(r, kEvict | kUseCurrent, ev);
    AppendRecord(r, kDelete | kUseCurrent, WithHashes<v1::DeleteRequest>(w));
    seeds.emplace_back("lookup_get_pin_evict_delete", r);
  }
  {
    std::string r = WorldRecords(w);
    auto cs = WithHashes<v1::CreateSequenceRequest>(w);
    *cs.mutable_tail_k() = client::RandomTensor(v1::DTYPE_FP16, {2, 5, 2, 64}, 7);
    *cs.mutable_tail_v() = client::RandomTensor(v1::DTYPE_FP16, {2, 5, 2, 64}, 8);
    AppendRecord(r, kCreateSeq | kUseCurrent, cs);
    v1::AppendRequest ap;
    ap.set_layer(0);
    *ap.mutable_k() = Rows(12, 2, 9);
    *ap.mutable_v() = Rows(12, 2, 10);
    AppendRecord(r, kAppend | kUseCurrent, ap);
    v1::AttendRequest at;
    at.set_layer(1);
    v1::AttendItem* item = at.add_items();
    *item->mutable_q() = Rows(1, 4, 11);
    *item->mutable_k() = Rows(1, 2, 12);
    *item->mutable_v() = Rows(1, 2, 13);
    AppendRecord(r, kAttend | kUseCurrent, at);
    at.mutable_items(0)->clear_k();
    at.mutable_items(0)->clear_v();
    *at.mutable_items(0)->mutable_q() = Rows(3, 4, 14);
    at.mutable_items(0)->add_positions(0);
    at.mutable_items(0)->add_positions(20);
    at.mutable_items(0)->add_positions(40);
    at.set_layer(0);
    AppendRecord(r, kAttend | kUseCurrent, at);
    AppendRecord(r, kMaintain, "");
    AppendRecord(r, kDropSeq | kUseCurrent, v1::DropSequenceRequest());
    seeds.emplace_back("sequence_append_attend", r);
  }
  {
    // A layer-range stream, a packed stream and a partial last block.
    std::string r;
    AppendRecord(r, kRegister, w.registration);
    v1::PutBlocksRequest msg;
    msg.mutable_header()->set_first_layer(1);
    AppendRecord(r, kPutMessage | kUseCurrent, msg);
    *msg.mutable_block() =
        client::DenseBlock(w.registration.layout(), w.hashes[0], "", 100, 1, 2, 7, v1::DTYPE_BF16);
    AppendRecord(r, kPutMessage, msg);
    AppendRecord(r, kPutFinish, "");
    seeds.emplace_back("layer_range_put", r);
  }
  {
    std::string r;
    v1::RegisterModelRequest reg =
        client::ModelRegistration("recipe", 2, 1, 2, 64, 16, "turboquant25");
    std::string json = R"({"version": 1, "recipe": "turboquant25", "head_size": 64, "layers": {)";
    for (int l = 0; l < 2; ++l) {
      json += (l ? "," : "") + std::string("\"model.layers.") + std::to_string(l) +
              ".self_attn\": {\"key_high_precision_indices\": [[0,1,2,3,4,5,6,7,8,9,10,11,12,"
              "13,14,15]], \"value_high_precision_indices\": [[16,17,18,19,20,21,22,23,24,25,"
              "26,27,28,29,30,31]]}";
    }
    json += "}}";
    reg.mutable_codec()->set_recipe_metadata_json(json);
    (*reg.mutable_codec()->mutable_layer_cache_dtypes())[1] = "k2v8";
    AppendRecord(r, kRegister, reg);
    v1::RegisterModelRequest qr = client::ModelRegistration("qr", 1, 1, 1, 32, 8, "k3v3");
    qr.mutable_codec()->set_rotation("qr");
    qr.mutable_codec()->set_dense_first_layers(0);
    AppendRecord(r, kRegister, qr);
    seeds.emplace_back("register_recipe_qr", r);
  }
  for (const auto& [name, bytes] : seeds) {
    ServiceHarness h(&shared);
    absl::Status s = h.Run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    std::printf("service seed %-28s %zu bytes, last status %s\n", name.c_str(), bytes.size(),
                s.ToString().c_str());
    Write(dir + "/service/" + name, bytes);
  }
}

std::string Frame(const v1::DataPlaneRequest& r) {
  std::string body = r.SerializeAsString();
  uint32_t n = static_cast<uint32_t>(body.size());
  return std::string(reinterpret_cast<const char*>(&n), 4) + body;
}

void DataPlaneSeeds(const std::string& dir) {
  // The model ref is what BuildWorld gets in a fresh registry.
  SharedParts shared;
  ServiceHarness h(&shared);
  auto w = BuildWorld(h.service(), {"default", true});
  if (!w.ok()) {
    std::fprintf(stderr, "world: %s\n", w.status().ToString().c_str());
    std::exit(1);
  }
  const std::string seq = "seq-XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX";
  const std::string preface = service::kDataPlanePreface;
  std::vector<std::pair<std::string, std::string>> seeds;
  {
    v1::DataPlaneRequest get;
    *get.mutable_get_blocks()->mutable_model() = w->model;
    for (const std::string& hash : w->hashes) get.mutable_get_blocks()->add_block_hashes(hash);
    get.set_with_format(true);
    std::string s = preface + Frame(get);
    get.mutable_get_blocks()->set_dense(true);
    get.mutable_get_blocks()->set_last_layer(1);
    get.set_with_format(false);
    s += Frame(get);
    seeds.emplace_back("get_packed_dense", s);
  }
  {
    v1::DataPlaneRequest ap;
    ap.mutable_append()->set_sequence_id(seq);
    ap.mutable_append()->set_layer(1);
    *ap.mutable_append()->mutable_k() = Rows(2, 2, 20);
    *ap.mutable_append()->mutable_v() = Rows(2, 2, 21);
    v1::DataPlaneRequest at;
    at.mutable_attend()->set_layer(1);
    v1::AttendItem* item = at.mutable_attend()->add_items();
    item->set_sequence_id(seq);
    *item->mutable_q() = Rows(1, 4, 22);
    seeds.emplace_back("append_attend", preface + Frame(ap) + Frame(at));
  }
  {
    v1::DataPlaneRequest put;
    *put.mutable_put()->mutable_header()->mutable_model() = w->model;
    std::string s = preface + Frame(put);
    put.mutable_put()->clear_header();
    const std::vector<std::string> chain = client::HashChain(2, 2);
    *put.mutable_put()->add_blocks() =
        client::DenseBlock(w->registration.layout(), chain[0], "", 300);
    s += Frame(put);
    put.mutable_put()->clear_blocks();
    *put.mutable_put()->add_blocks() =
        client::DenseBlock(w->registration.layout(), chain[1], chain[0], 301, 0, 0, 9);
    put.mutable_put()->set_commit(true);
    s += Frame(put);
    seeds.emplace_back("put_stream", s);
  }
  seeds.emplace_back("bad_preface", "TQKVDP00" + std::string(8, '\0'));
  seeds.emplace_back("partial_frame", preface + std::string("\x40\x00\x00\x00\x12\x03", 6));
  seeds.emplace_back("oversized_frame", preface + std::string("\xff\xff\xff\x7f", 4));
  for (const auto& [name, bytes] : seeds) {
    std::printf("data-plane seed %-22s %zu bytes\n", name.c_str(), bytes.size());
    Write(dir + "/data_plane/" + name, bytes);
  }
}

}  // namespace
}  // namespace tqkv::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR (fuzz/corpus)\n");
    return 2;
  }
  tqkv::fuzz::ServiceSeeds(argv[1]);
  tqkv::fuzz::DataPlaneSeeds(argv[1]);
  return 0;
}
