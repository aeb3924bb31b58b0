#include "fuzz/service_harness.h"

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "fuzz/service_input.h"
#include "google/protobuf/stubs/logging.h"

namespace tqkv::fuzz {
namespace {

void CheckCode(const absl::Status& s) {
  if (s.code() == absl::StatusCode::kUnknown || s.code() == absl::StatusCode::kInternal) {
    std::fprintf(stderr, "service returned %s\n", s.ToString().c_str());
    std::abort();
  }
}

template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& r) {
  return r.status();
}

}  // namespace

SharedParts::SharedParts() {
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int,
                                     const std::string&) {});
}

ServiceHarness::ServiceHarness(SharedParts* shared) : shared_(shared) {
  shared_->clock.Set(absl::UnixEpoch() + absl::Hours(24));
  storage::BlockStoreOptions so;
  so.host_capacity_bytes = uint64_t{64} << 20;
  so.clock = &shared_->clock;
  auto store = storage::BlockStore::Open(so);
  if (!store.ok()) std::abort();
  store_ = std::move(*store);
  registry_ = std::make_unique<service::ModelRegistry>(
      store_.get(), service::ModelRegistryOptions{.max_models_per_tenant = 4, .max_codec_build_work = uint64_t{1} << 26});
  service::KvServiceOptions ko;
  ko.max_blocks_per_stream = 64;
  service_ = std::make_unique<service::KvService>(ko, store_.get(), registry_.get(),
                                                  &shared_->backend, &shared_->clock);
}

ServiceHarness::~ServiceHarness() {
  put_.reset();
  service_.reset();
  registry_.reset();
  store_.reset();
}

absl::Status ServiceHarness::Run(const uint8_t* data, size_t size) {
  absl::Status last;
  size_t i = 0;
  while (i + 3 <= size) {
    const uint8_t op = data[i];
    const size_t len = data[i + 1] | (size_t{data[i + 2]} << 8);
    i += 3;
    if (i + len > size) break;
    last = RunOne(op, std::string(reinterpret_cast<const char*>(data + i), len));
    CheckCode(last);
    i += len;
  }
  return last;
}

absl::Status ServiceHarness::RunOne(uint8_t raw_op, const std::string& bytes) {
  const bool current = raw_op & kUseCurrent;
  const uint8_t op = (raw_op & ~kUseCurrent) % kNumOps;
  service::KvService& kv = *service_;
  auto parse = [&](google::protobuf::MessageLite& m) { return m.ParseFromString(bytes); };
  auto bad = [] { return absl::InvalidArgumentError("unparsable record"); };
  switch (op) {
    case kRegister: {
      v1::RegisterModelRequest req;
      if (!parse(req)) return bad();
      auto r = kv.RegisterModel(identity_, req);
      if (r.ok()) {
        model_.set_model_id(r->model_id());
        model_.set_layout_fingerprint(r->layout_fingerprint());
      }
      return StatusOf(r);
    }
    case kPutMessage: {
      v1::PutBlocksRequest req;
      if (!parse(req)) return bad();
      if (current && req.has_header()) *req.mutable_header()->mutable_model() = model_;
      if (!put_) {
        absl::StatusOr<std::unique_ptr<service::PutSession>> s = kv.NewPutSession(identity_);
        if (!s.ok()) return s.status();
        put_ = std::move(*s);
      }
      return put_->OnMessage(req);
    }
    case kPutFinish: {
      if (!put_) return absl::FailedPreconditionError("no open stream");
      auto r = put_->Finish();
      put_.reset();
      return StatusOf(r);
    }
    case kLookup: {
      v1::LookupRequest req;
      if (!parse(req)) return bad();
      if (current) *req.mutable_model() = model_;
      return StatusOf(kv.Lookup(identity_, req));
    }
    case kGet: {
      v1::GetBlocksRequest req;
      if (!parse(req)) return bad();
      if (current) *req.mutable_model() = model_;
      auto plan = kv.PrepareGet(identity_, req);
      if (!plan.ok()) return plan.status();
      for (size_t b = 0; b < plan->blocks.size(); ++b) {
        auto r = kv.RenderGet(*plan, b);
        if (!r.ok()) return r.status();
      }
      if (plan->dense && !plan->blocks.empty()) {
        std::vector<uint8_t> out(2 * plan->blocks.size() * service::KvService::DenseTensorBytes(*plan));
        return kv.DecodeDenseBlocks(*plan, out.data());
      }
      return absl::OkStatus();
    }
    case kCreateSeq: {
      v1::CreateSequenceRequest req;
      if (!parse(req)) return bad();
      if (current) *req.mutable_model() = model_;
      auto r = kv.CreateSequence(identity_, req);
      if (r.ok()) sequence_ = r->sequence_id();
      return StatusOf(r);
    }
    case kAppend: {
      v1::AppendRequest req;
      if (!parse(req)) return bad();
      if (current) req.set_sequence_id(sequence_);
      return StatusOf(kv.Append(identity_, req));
    }
    case kAttend: {
      v1::AttendRequest req;
      if (!parse(req)) return bad();
      if (current) {
        for (auto& item : *req.mutable_items()) item.set_sequence_id(sequence_);
      }
      return StatusOf(kv.Attend(identity_, req));
    }
    case kDropSeq: {
      v1::DropSequenceRequest req;
      if (!parse(req)) return bad();
      if (current) req.set_sequence_id(sequence_);
      return StatusOf(kv.DropSequence(identity_, req));
    }
    case kPin: {
      v1::PinRequest req;
      if (!parse(req)) return bad();
      if (current) *req.mutable_model() = model_;
      return StatusOf(kv.Pin(identity_, req));
    }
    case kUnpin: {
      v1::UnpinRequest req;
      if (!parse(req)) return bad();
      if (current) *req.mutable_model() = model_;
      return StatusOf(kv.Unpin(identity_, req));
    }
    case kDelete: {
      v1::DeleteRequest req;
      if (!parse(req)) return bad();
      if (current) *req.mutable_model() = model_;
      return StatusOf(kv.Delete(identity_, req));
    }
    case kEvict: {
      v1::EvictRequest req;
      if (!parse(req)) return bad();
      if (current) req.set_model_id(model_.model_id());
      return StatusOf(kv.Evict(identity_, req));
    }
    case kStats: {
      v1::StatsRequest req;
      if (!parse(req)) return bad();
      return StatusOf(kv.Stats(identity_, req));
    }
    case kMaintain:
      shared_->clock.Advance(absl::Seconds(bytes.size()));
      kv.Maintain();
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace tqkv::fuzz
