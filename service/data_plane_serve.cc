// DataPlaneServer::Loop: serving one request (data_plane_loop.h).
#include "service/data_plane_loop.h"

#include <chrono>
#include <optional>

#include "service/convert.h"

namespace tqkv::service {

absl::StatusOr<Identity> DataPlaneServer::Loop::Identify(Conn* c, const v1::DataPlaneRequest& req) {
  // As on gRPC (rpc_scope.cc): the client certificate counts where the
  // auth file maps certificates.
  static const PeerCertificate kNone;
  const PeerCertificate* peer = c->tls != nullptr ? &c->tls->peer() : &kNone;
  absl::StatusOr<Identity> id = env_->auth->uses_certificates() ? env_->auth->Authenticate(req.authorization(), peer)
                                                                : env_->auth->Authenticate(req.authorization());
  if (id.ok()) c->authenticated = true;
  return id;
}

void DataPlaneServer::Loop::Serve(Conn* c, v1::DataPlaneRequest* request, absl::Span<const uint8_t> raw_in,
                                  uint64_t frame_bytes) {
  const v1::DataPlaneRequest& req = *request;
  const auto start = std::chrono::steady_clock::now();
  const bool attend = req.op_case() == v1::DataPlaneRequest::kAttend;
  const bool append = req.op_case() == v1::DataPlaneRequest::kAppend;
  const bool put = req.op_case() == v1::DataPlaneRequest::kPut;
  absl::Status status;
  v1::DataPlaneReply head;
  GetPlan plan;
  std::unique_ptr<uint8_t[]> owned;  // what the reply's payload points into, when not stored blocks
  TenantBudget::Reservation charge;  // the reply's payload bytes, charged before they are built
  std::vector<iovec> payload;
  uint64_t payload_bytes = 0;
  const absl::Status bad_payload =
      raw_in.empty() || attend || append || put
          ? absl::OkStatus()
          : absl::InvalidArgumentError("only attend, append and put frames carry a raw payload");
  if (absl::StatusOr<Identity> id = Identify(c, req); put) {
    status = ServePut(c, id, request->mutable_put(), raw_in, &head);
  } else if (!id.ok()) {
    status = id.status();
  } else if (!bad_payload.ok()) {
    status = bad_payload;
  } else if (attend) {
    // A frame with a payload gets its outputs as the reply's payload, at
    // most its queries' bytes (within the frame): the frame's size is
    // charged before the call (an Attend that appends must not fail after
    // it), the rest given back after.
    RawTensors raw{TensorPayload(raw_in)};
    status = raw_in.empty() ? absl::OkStatus() : shared_->replies->Charge(id->tenant, frame_bytes, &charge);
    absl::StatusOr<v1::AttendResponse> r =
        status.ok() ? service_->Attend(*id, req.attend(), raw_in.empty() ? nullptr : &raw) : status;
    if (r.ok()) {
      charge.Release(charge.amount() - std::min<uint64_t>(charge.amount(), raw.out_bytes));
      *head.mutable_attend() = std::move(*r);
      owned = std::move(raw.out);
      if (raw.out_bytes > 0) payload.push_back({owned.get(), raw.out_bytes});
      payload_bytes = raw.out_bytes;
    } else {
      status = r.status();
    }
  } else if (append) {
    RawTensors raw{TensorPayload(raw_in)};
    absl::StatusOr<v1::AppendResponse> r = service_->Append(*id, req.append(), raw_in.empty() ? nullptr : &raw);
    if (r.ok()) {
      *head.mutable_append() = std::move(*r);
    } else {
      status = r.status();
    }
  } else if (req.op_case() != v1::DataPlaneRequest::kGetBlocks) {
    status = absl::InvalidArgumentError("DataPlaneRequest names no operation (get_blocks, attend, append, put)");
  } else if (absl::StatusOr<GetPlan> p = service_->PrepareGet(*id, req.get_blocks()); !p.ok()) {
    status = p.status();
  } else if (p->device) {
    // Decoded into the worker's GPU memory: the reply lists the blocks.
    plan = std::move(*p);
    absl::StatusOr<DeviceKvRef> out = DeviceSource(c, req.get_blocks().device_out(), "get_blocks.device_out");
    status = out.ok() ? service_->DecodeDeviceBlocks(plan, *out) : out.status();
    if (req.with_format()) *head.mutable_format() = plan.model->format;
    for (size_t i = 0; status.ok() && i < plan.blocks.size(); ++i) {
      v1::DataPlaneBlock* b = head.add_blocks();
      b->set_block_hash(plan.hashes[i]);
      b->set_tier(ToProtoTier(plan.blocks[i].tier));
    }
    plan.blocks.clear();  // nothing of them is in the reply
  } else {
    plan = std::move(*p);
    if (req.with_format()) *head.mutable_format() = plan.model->format;
    // Dense: K then V of each block, decoded by the backend into one buffer.
    const size_t t = plan.dense ? KvService::DenseTensorBytes(plan) : 0;
    uint64_t reply = 2 * t * plan.blocks.size();
    for (size_t i = 0; !plan.dense && i < plan.blocks.size(); ++i) reply += KvService::PackedBytes(plan, i).size;
    if (plan.dense && reply > options_.max_dense_reply_bytes) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("a dense reply of ", reply, " bytes is over the data plane's limit of ",
                       options_.max_dense_reply_bytes, "; ask for fewer blocks a request"));
    } else {
      status = shared_->replies->Charge(id->tenant, reply, &charge);
    }
    if (status.ok() && plan.dense) {
      owned.reset(new uint8_t[2 * t * plan.blocks.size()]);  // every byte is decoded into: no zero fill
      status = service_->DecodeDenseBlocks(plan, owned.get());
    }
    for (size_t i = 0; status.ok() && i < plan.blocks.size(); ++i) {
      const KvService::Span span =
          plan.dense ? KvService::Span{owned.get() + 2 * t * i, 2 * t} : KvService::PackedBytes(plan, i);
      v1::DataPlaneBlock* b = head.add_blocks();
      b->set_block_hash(plan.hashes[i]);
      b->set_tier(ToProtoTier(plan.blocks[i].tier));
      b->set_payload_bytes(span.size);
      if (span.size > 0) payload.push_back({const_cast<uint8_t*>(span.data), span.size});
      payload_bytes += span.size;
    }
  }
  if (!status.ok()) {
    head.Clear();
    head.set_code(static_cast<uint32_t>(status.code()));
    head.set_message(std::string(status.message()));
    payload.clear();
    payload_bytes = 0;
    plan.blocks.clear();
  }
  if (!status.ok()) {
    owned.reset();
    charge.Reset();
  }
  Queue(c, head, std::move(payload), payload_bytes);
  c->out.back().blocks = std::move(plan.blocks);
  c->out.back().owned = std::move(owned);
  c->out.back().charge = std::move(charge);
  RecordCall(*env_, attend ? "DataAttend" : append ? "DataAppend" : put ? "DataPutBlocks" : "DataGetBlocks", c->peer, status,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), frame_bytes,
             c->out.back().head_bytes + payload_bytes);
}

absl::StatusOr<DeviceKvRef> DataPlaneServer::Loop::DeviceSource(const Conn* c, const v1::DeviceKv& d,
                                                                 const char* field) const {
  if (!options_.cuda_ipc)
    return absl::FailedPreconditionError(
        "this server does not take CUDA IPC handles (--data_cuda_ipc=false); send the tensors instead");
  if (!c->local)
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA IPC handles are taken only from this host's loopback, not from ", c->peer, "; send the tensors instead"));
  return DeviceKvFromProto(d, field);
}

absl::Status DataPlaneServer::Loop::ServePut(Conn* c, const absl::StatusOr<Identity>& id, v1::DataPlanePut* put,
                                             absl::Span<const uint8_t> raw_in, v1::DataPlaneReply* head) {
  if (!c->put_open) {
    c->put_error = absl::OkStatus();
    if (id.ok()) {
      absl::StatusOr<std::unique_ptr<PutSession>> session = service_->NewPutSession(*id);
      if (session.ok()) c->put = std::move(*session);
      else c->put_error = session.status();  // the stream fails; its commit frame ends it
    }
    c->put_tenant = id.ok() ? id->tenant : "";
    c->put_open = true;
  }
  absl::Status s = c->put_error;
  if (s.ok() && !id.ok()) s = id.status();
  if (s.ok() && id->tenant != c->put_tenant)
    s = absl::PermissionDeniedError("every frame of a data-plane put stream must carry the same identity");
  if (s.ok() && put->has_header()) {
    v1::PutBlocksRequest msg;
    msg.mutable_header()->Swap(put->mutable_header());
    s = c->put->OnMessage(msg);
  }
  TensorPayload payload(raw_in);
  std::optional<DeviceKvRef> device;
  if (s.ok() && put->has_device()) {
    absl::StatusOr<DeviceKvRef> d = DeviceSource(c, put->device(), "put.device");
    if (d.ok()) device = std::move(*d);
    else s = d.status();
  }
  if (s.ok() && (put->blocks_size() > 0 || !raw_in.empty()))  // one batch: dense blocks are encoded together
    s = c->put->OnBlocks(put->blocks(), raw_in.empty() ? nullptr : &payload, device ? &*device : nullptr);
  if (s.ok() && put->commit()) {
    absl::StatusOr<v1::PutBlocksResponse> r = c->put->Finish();
    if (r.ok()) *head->mutable_put() = std::move(*r);
    s = r.status();
  }
  if (!s.ok()) {
    c->put.reset();  // releases the stream's reservations; nothing was committed
    c->put_error = s;
  }
  if (put->commit()) {
    c->put.reset();
    c->put_open = false;
  }
  return s;
}

}  // namespace tqkv::service
