#include "fuzz/seed_world.h"

#include "base/status_macros.h"
#include "client/cpp/synthetic.h"

namespace tqkv::fuzz {

SeedWorld WorldRequests() {
  SeedWorld w;
  w.registration = client::SmallModel("fuzz");
  w.hashes = client::HashChain(1, kSeedBlocks);
  std::string parent;
  for (int i = 0; i < kSeedBlocks; ++i) {
    w.blocks.push_back(
        client::DenseBlock(w.registration.layout(), w.hashes[i], parent, 100 + i));
    parent = w.hashes[i];
  }
  return w;
}

v1::Tensor Rows(int tokens, int heads, uint64_t seed) {
  return client::RandomTensor(v1::DTYPE_FP16, {tokens, heads, 64}, seed);
}

absl::StatusOr<SeedWorld> BuildWorld(service::KvService& service, const service::Identity& id) {
  SeedWorld w = WorldRequests();
  TQ_ASSIGN_OR_RETURN(v1::RegisterModelResponse reg, service.RegisterModel(id, w.registration));
  w.model.set_model_id(reg.model_id());
  w.model.set_layout_fingerprint(reg.layout_fingerprint());
  TQ_ASSIGN_OR_RETURN(std::unique_ptr<service::PutSession> put, service.NewPutSession(id));
  v1::PutBlocksRequest msg;
  *msg.mutable_header()->mutable_model() = w.model;
  TQ_RETURN_IF_ERROR(put->OnMessage(msg));
  for (const v1::PutBlock& b : w.blocks) {
    *msg.mutable_block() = b;
    TQ_RETURN_IF_ERROR(put->OnMessage(msg));
  }
  TQ_RETURN_IF_ERROR(put->Finish().status());
  v1::CreateSequenceRequest cs;
  *cs.mutable_model() = w.model;
  for (const std::string& h : w.hashes) cs.add_block_hashes(h);
  TQ_ASSIGN_OR_RETURN(v1::CreateSequenceResponse seq, service.CreateSequence(id, cs));
  w.sequence_id = seq.sequence_id();
  return w;
}

}  // namespace tqkv::fuzz
