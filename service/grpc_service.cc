#include "service/grpc_service.h"

#include <memory>
#include <utility>

namespace tqkv::service {
namespace {

// Runs a unary call: fn(identity) -> StatusOr<Resp>.
template <typename Req, typename Resp, typename Fn>
grpc::ServerUnaryReactor* Unary(const RpcEnv* env, const char* method,
                                grpc::CallbackServerContext* ctx, const Req* req, Resp* resp,
                                Fn fn) {
  RpcScope scope(*env, method, ctx);
  scope.Received(req->ByteSizeLong());
  absl::Status s = scope.identity().status();
  if (s.ok()) {
    absl::StatusOr<Resp> r = fn(*scope.identity());
    if (r.ok()) {
      *resp = std::move(*r);
      scope.Sent(resp->ByteSizeLong());
    } else {
      s = r.status();
    }
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(scope.Finish(s));
  return reactor;
}

// Runs `work` on the backend work queue (RpcEnv::backend_work), or on
// this thread when there is none or it is full: a gRPC call is not failed
// for the server's own queueing.
void OnBackend(WorkQueue* queue, WorkQueue::Task work) {
  if (queue == nullptr || !queue->TrySubmit(work)) std::move(work)();
}

class PutReactor final : public grpc::ServerReadReactor<v1::PutBlocksRequest> {
 public:
  PutReactor(KvService* service, const RpcEnv* env, grpc::CallbackServerContext* ctx,
             v1::PutBlocksResponse* resp)
      : scope_(*env, "PutBlocks", ctx), ctx_(ctx), resp_(resp), work_(env->backend_work) {
    if (!scope_.identity().ok()) {
      Done(scope_.identity().status());
      return;
    }
    absl::StatusOr<std::unique_ptr<PutSession>> session = service->NewPutSession(*scope_.identity());
    if (!session.ok()) {
      Done(session.status());
      return;
    }
    session_ = std::move(*session);
    StartRead(&msg_);
  }

  void OnReadDone(bool ok) override {
    if (!ok && ctx_->IsCancelled()) {  // not the end of the client's stream
      Done(absl::CancelledError("PutBlocks stream cancelled; nothing committed"));
      return;
    }
    // A message's blocks are encoded, and the commit made, on the backend
    // work queue when there is one; no read is outstanding meanwhile.
    OnBackend(work_, [this, ok] { ok ? Next() : Commit(); });
  }

  void OnDone() override { delete this; }

 private:
  void Next() {
    scope_.Received(msg_.ByteSizeLong());
    absl::Status s = session_->OnMessage(msg_);
    if (!s.ok()) {
      Done(s);
      return;
    }
    StartRead(&msg_);
  }

  void Commit() {
    absl::StatusOr<v1::PutBlocksResponse> r = session_->Finish();
    if (r.ok()) {
      *resp_ = std::move(*r);
      scope_.Sent(resp_->ByteSizeLong());
    }
    Done(r.status());
  }

  void Done(const absl::Status& s) {
    session_.reset();  // releases uncommitted reservations before replying
    Finish(scope_.Finish(s));
  }

  RpcScope scope_;
  grpc::CallbackServerContext* const ctx_;
  v1::PutBlocksResponse* const resp_;
  WorkQueue* const work_;  // null: the backend's work runs in the reactions
  std::unique_ptr<PutSession> session_;
  v1::PutBlocksRequest msg_;
};

class GetReactor final : public grpc::ServerWriteReactor<v1::GetBlocksResponse> {
 public:
  GetReactor(KvService* service, const RpcEnv* env, grpc::CallbackServerContext* ctx,
             const v1::GetBlocksRequest* req)
      : service_(service), scope_(*env, "GetBlocks", ctx), work_(env->backend_work) {
    scope_.Received(req->ByteSizeLong());
    if (!scope_.identity().ok()) {
      Done(scope_.identity().status());
      return;
    }
    if (req->has_device_out()) {
      Done(absl::InvalidArgumentError("device_out (CUDA IPC) is served on the data plane only"));
      return;
    }
    absl::StatusOr<GetPlan> plan = service->PrepareGet(*scope_.identity(), *req);
    if (!plan.ok()) {
      Done(plan.status());
      return;
    }
    plan_ = std::move(*plan);
    Render();
  }

  void OnWriteDone(bool ok) override {
    if (next_ == plan_.blocks.size() && !plan_.blocks.empty()) return;  // written and finished
    if (!ok) {
      Done(absl::CancelledError("GetBlocks stream broken by the client"));
      return;
    }
    Render();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (next_ == plan_.blocks.size()) {
      Done(absl::OkStatus());
      return;
    }
    absl::StatusOr<v1::GetBlocksResponse> r = service_->RenderGet(plan_, next_);
    if (!r.ok()) {
      Done(r.status());
      return;
    }
    plan_.blocks[next_].payload.reset();  // sent: let the bytes go
    ++next_;
    out_ = std::move(*r);
    scope_.Sent(out_.ByteSizeLong());
    if (next_ == plan_.blocks.size()) {
      // The last block carries the final status in the same write.
      StartWriteAndFinish(&out_, grpc::WriteOptions(), scope_.Finish(absl::OkStatus()));
      return;
    }
    StartWrite(&out_);
  }

  // The next message: a dense block is decoded on the backend work queue
  // when there is one (no write is outstanding meanwhile).
  void Render() {
    if (!plan_.dense || next_ == plan_.blocks.size()) return WriteNext();
    OnBackend(work_, [this] { WriteNext(); });
  }

  void Done(const absl::Status& s) { Finish(scope_.Finish(s)); }

  KvService* const service_;
  RpcScope scope_;
  WorkQueue* const work_;  // null: dense blocks are decoded in the reactions
  GetPlan plan_;
  size_t next_ = 0;
  v1::GetBlocksResponse out_;
};

}  // namespace

grpc::ServerUnaryReactor* KvStoreHandler::RegisterModel(grpc::CallbackServerContext* ctx,
                                                        const v1::RegisterModelRequest* req,
                                                        v1::RegisterModelResponse* resp) {
  return Unary(env_, "RegisterModel", ctx, req, resp,
               [&](const Identity& id) { return service_->RegisterModel(id, *req); });
}

grpc::ServerReadReactor<v1::PutBlocksRequest>* KvStoreHandler::PutBlocks(
    grpc::CallbackServerContext* ctx, v1::PutBlocksResponse* resp) {
  return new PutReactor(service_, env_, ctx, resp);
}

grpc::ServerUnaryReactor* KvStoreHandler::Lookup(grpc::CallbackServerContext* ctx,
                                                 const v1::LookupRequest* req,
                                                 v1::LookupResponse* resp) {
  return Unary(env_, "Lookup", ctx, req, resp,
               [&](const Identity& id) { return service_->Lookup(id, *req); });
}

grpc::ServerWriteReactor<v1::GetBlocksResponse>* KvStoreHandler::GetBlocks(
    grpc::CallbackServerContext* ctx, const v1::GetBlocksRequest* req) {
  return new GetReactor(service_, env_, ctx, req);
}

grpc::ServerUnaryReactor* KvStoreHandler::Pin(grpc::CallbackServerContext* ctx,
                                              const v1::PinRequest* req, v1::PinResponse* resp) {
  return Unary(env_, "Pin", ctx, req, resp, [&](const Identity& id) { return service_->Pin(id, *req); });
}

grpc::ServerUnaryReactor* KvStoreHandler::Unpin(grpc::CallbackServerContext* ctx,
                                                const v1::UnpinRequest* req,
                                                v1::UnpinResponse* resp) {
  return Unary(env_, "Unpin", ctx, req, resp,
               [&](const Identity& id) { return service_->Unpin(id, *req); });
}

grpc::ServerUnaryReactor* KvStoreHandler::Delete(grpc::CallbackServerContext* ctx,
                                                 const v1::DeleteRequest* req,
                                                 v1::DeleteResponse* resp) {
  return Unary(env_, "Delete", ctx, req, resp,
               [&](const Identity& id) { return service_->Delete(id, *req); });
}

grpc::ServerUnaryReactor* KvStoreHandler::CreateSequence(grpc::CallbackServerContext* ctx,
                                                         const v1::CreateSequenceRequest* req,
                                                         v1::CreateSequenceResponse* resp) {
  return Unary(env_, "CreateSequence", ctx, req, resp,
               [&](const Identity& id) { return service_->CreateSequence(id, *req); });
}

grpc::ServerUnaryReactor* KvStoreHandler::Append(grpc::CallbackServerContext* ctx,
                                                 const v1::AppendRequest* req,
                                                 v1::AppendResponse* resp) {
  return Unary(env_, "Append", ctx, req, resp,
               [&](const Identity& id) { return service_->Append(id, *req); });
}

grpc::ServerUnaryReactor* KvStoreHandler::Attend(grpc::CallbackServerContext* ctx,
                                                 const v1::AttendRequest* req,
                                                 v1::AttendResponse* resp) {
  return Unary(env_, "Attend", ctx, req, resp,
               [&](const Identity& id) { return service_->Attend(id, *req); });
}

grpc::ServerUnaryReactor* KvStoreHandler::DropSequence(grpc::CallbackServerContext* ctx,
                                                       const v1::DropSequenceRequest* req,
                                                       v1::DropSequenceResponse* resp) {
  return Unary(env_, "DropSequence", ctx, req, resp,
               [&](const Identity& id) { return service_->DropSequence(id, *req); });
}

grpc::ServerUnaryReactor* KvStoreHandler::Stats(grpc::CallbackServerContext* ctx,
                                                const v1::StatsRequest* req,
                                                v1::StatsResponse* resp) {
  return Unary(env_, "Stats", ctx, req, resp,
               [&](const Identity& id) { return service_->Stats(id, *req); });
}

grpc::ServerUnaryReactor* KvStoreHandler::ListModels(grpc::CallbackServerContext* ctx,
                                                     const v1::ListModelsRequest* req,
                                                     v1::ListModelsResponse* resp) {
  return Unary(env_, "ListModels", ctx, req, resp,
               [&](const Identity& id) { return service_->ListModels(id, *req); });
}

grpc::ServerUnaryReactor* AdminHandler::Evict(grpc::CallbackServerContext* ctx,
                                              const v1::EvictRequest* req,
                                              v1::EvictResponse* resp) {
  return Unary(env_, "Evict", ctx, req, resp,
               [&](const Identity& id) { return service_->Evict(id, *req); });
}

grpc::ServerUnaryReactor* AdminHandler::UnregisterModel(grpc::CallbackServerContext* ctx,
                                                        const v1::UnregisterModelRequest* req,
                                                        v1::UnregisterModelResponse* resp) {
  return Unary(env_, "UnregisterModel", ctx, req, resp,
               [&](const Identity& id) { return service_->UnregisterModel(id, *req); });
}

}  // namespace tqkv::service
