// The gRPC adapters (callback API) of the KvStore and Admin services. Each
// handler is thin: it runs in an RpcScope (auth, timing, metrics, status
// mapping), hands the request to KvService and sends what comes back.
// Streaming handlers are reactors: PutBlocks feeds a PutSession message by
// message and commits at the end of a successful stream (a cancelled stream
// commits nothing); GetBlocks prepares every block first, then writes one
// response per block.
//
// Thread safety: the handler objects are immutable after construction; the
// KvService and RpcEnv they point at are thread-safe and must outlive the
// grpc::Server.
#ifndef TQKV_SERVICE_GRPC_SERVICE_H_
#define TQKV_SERVICE_GRPC_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "proto/tqkv/v1/tqkv.grpc.pb.h"
#include "service/kv_service.h"
#include "service/rpc_scope.h"

namespace tqkv::service {

class KvStoreHandler final : public v1::KvStore::CallbackService {
 public:
  KvStoreHandler(KvService* service, const RpcEnv* env) : service_(service), env_(env) {}

  grpc::ServerUnaryReactor* RegisterModel(grpc::CallbackServerContext* ctx,
                                          const v1::RegisterModelRequest* req,
                                          v1::RegisterModelResponse* resp) override;
  grpc::ServerReadReactor<v1::PutBlocksRequest>* PutBlocks(grpc::CallbackServerContext* ctx,
                                                           v1::PutBlocksResponse* resp) override;
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* ctx, const v1::LookupRequest* req,
                                   v1::LookupResponse* resp) override;
  grpc::ServerWriteReactor<v1::GetBlocksResponse>* GetBlocks(
      grpc::CallbackServerContext* ctx, const v1::GetBlocksRequest* req) override;
  grpc::ServerUnaryReactor* Pin(grpc::CallbackServerContext* ctx, const v1::PinRequest* req,
                                v1::PinResponse* resp) override;
  grpc::ServerUnaryReactor* Unpin(grpc::CallbackServerContext* ctx, const v1::UnpinRequest* req,
                                  v1::UnpinResponse* resp) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx, const v1::DeleteRequest* req,
                                   v1::DeleteResponse* resp) override;
  grpc::ServerUnaryReactor* CreateSequence(grpc::CallbackServerContext* ctx,
                                           const v1::CreateSequenceRequest* req,
                                           v1::CreateSequenceResponse* resp) override;
  grpc::ServerUnaryReactor* Append(grpc::CallbackServerContext* ctx, const v1::AppendRequest* req,
                                   v1::AppendResponse* resp) override;
  grpc::ServerUnaryReactor* Attend(grpc::CallbackServerContext* ctx, const v1::AttendRequest* req,
                                   v1::AttendResponse* resp) override;
  grpc::ServerUnaryReactor* DropSequence(grpc::CallbackServerContext* ctx,
                                         const v1::DropSequenceRequest* req,
                                         v1::DropSequenceResponse* resp) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const v1::StatsRequest* req,
                                  v1::StatsResponse* resp) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* ctx, const v1::ListModelsRequest* req,
                                       v1::ListModelsResponse* resp) override;

 private:
  KvService* const service_;
  const RpcEnv* const env_;
};

class AdminHandler final : public v1::Admin::CallbackService {
 public:
  AdminHandler(KvService* service, const RpcEnv* env) : service_(service), env_(env) {}
  grpc::ServerUnaryReactor* Evict(grpc::CallbackServerContext* ctx, const v1::EvictRequest* req,
                                  v1::EvictResponse* resp) override;
  grpc::ServerUnaryReactor* UnregisterModel(grpc::CallbackServerContext* ctx,
                                            const v1::UnregisterModelRequest* req,
                                            v1::UnregisterModelResponse* resp) override;

 private:
  KvService* const service_;
  const RpcEnv* const env_;
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_GRPC_SERVICE_H_
