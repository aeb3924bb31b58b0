// DataPlaneServer::Loop: serving one request (data_plane_loop.h).
#include "service/data_plane_loop.h"



#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <utility>

#include "service/convert.h"

namespace tqkv::service {

using data_plane_internal::InputBuffer;
using data_plane_internal::Reply;
using data_plane_internal::Served;

absl::StatusOr<Identity> DataPlaneServer::Loop::Identify(const Conn* c, const v1::DataPlaneRequest& req) const {
  // As on gRPC (rpc_scope.cc): the client certificate counts where the
  // auth file maps certificates.
  static const PeerCertificate kNone;
  const PeerCertificate* peer = c->tls != nullptr ? &c->tls->peer() : &kNone;
  return env_->auth->uses_certificates() ? env_->auth->Authenticate(req.authorization(), peer)
                                         : env_->auth->Authenticate(req.authorization());
}

bool DataPlaneServer::Loop::UsesBackend(const v1::DataPlaneRequest& req) {
  switch (req.op_case()) {
    case v1::DataPlaneRequest::kPut:
      return true;
    case v1::DataPlaneRequest::kGetBlocks:
      return req.get_blocks().dense() || req.get_blocks().has_device_out();
    default:
      // Attend and Append (a decode step's call, tens of microseconds of
      // GPU work) stay on the loop: on the H200 the hand-off to a worker and
      // back added ~15 µs a call, 17% of a 32-layer step at 32K context.
      return false;
  }
}

void DataPlaneServer::Loop::Serve(Conn* c, v1::DataPlaneRequest* request, absl::Span<const uint8_t> raw_in,
                                  uint64_t frame_bytes) {
  Deliver(c, &c->out.emplace_back(), Compute(c, request, raw_in, frame_bytes));
}

void DataPlaneServer::Loop::Deliver(Conn* c, Reply* slot, Served s) {
  if (s.authenticated) c->authenticated = true;
  Fill(c, slot, s.head, std::move(s.payload), s.payload_bytes);
  slot->blocks = std::move(s.blocks);
  slot->owned = std::move(s.owned);
  slot->charge = std::move(s.charge);
  RecordCall(*env_, s.method, c->peer, s.status,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - s.start).count(), s.frame_bytes,
             slot->head_bytes + s.payload_bytes);
}

Served DataPlaneServer::Loop::Compute(Conn* c, v1::DataPlaneRequest* request, absl::Span<const uint8_t> raw_in,
                                      uint64_t frame_bytes) {
  const v1::DataPlaneRequest& req = *request;
  Served out;
  out.start = std::chrono::steady_clock::now();
  out.frame_bytes = frame_bytes;
  const bool attend = req.op_case() == v1::DataPlaneRequest::kAttend;
  const bool append = req.op_case() == v1::DataPlaneRequest::kAppend;
  const bool put = req.op_case() == v1::DataPlaneRequest::kPut;
  out.method = attend ? "DataAttend" : append ? "DataAppend" : put ? "DataPutBlocks" : "DataGetBlocks";
  absl::Status& status = out.status;
  v1::DataPlaneReply& head = out.head;
  GetPlan plan;
  std::unique_ptr<uint8_t[]>& owned = out.owned;  // what the reply's payload points into, when not stored blocks
  TenantBudget::Reservation& charge = out.charge;  // the reply's payload bytes, charged before they are built
  std::vector<iovec>& payload = out.payload;
  uint64_t& payload_bytes = out.payload_bytes;
  // A frame whose payloads lie in the connection's shared memory: it is
  // charged as if it had carried its payload.
  absl::Span<uint8_t> shared_reply;
  const absl::Status shared_status =
      req.has_shared() ? SharedSpans(c, req.shared(), &raw_in, &shared_reply) : absl::OkStatus();
  const uint64_t in_bytes = frame_bytes + (req.has_shared() ? raw_in.size() : 0);
  const absl::Status bad_payload =
      raw_in.empty() || attend || append || put
          ? absl::OkStatus()
          : absl::InvalidArgumentError("only attend, append and put frames carry a raw payload");
  absl::StatusOr<Identity> id = Identify(c, req);
  out.authenticated = id.ok();
  if (put) {
    // A bad `shared` fails the stream, as a bad identity does.
    status = ServePut(c, shared_status.ok() ? id : absl::StatusOr<Identity>(shared_status), request->mutable_put(),
                      raw_in, &head);
  } else if (!id.ok()) {
    status = id.status();
  } else if (!shared_status.ok()) {
    status = shared_status;
  } else if (!bad_payload.ok()) {
    status = bad_payload;
  } else if (req.op_case() == v1::DataPlaneRequest::kShareMemory) {
    status = ShareMemory(c, req.share_memory(), &head);
  } else if (attend) {
    // A frame with a payload gets its outputs as the reply's payload, at
    // most its queries' bytes (within the frame): the frame's size is
    // charged before the call (an Attend that appends must not fail after
    // it), the rest given back after.
    RawTensors raw{TensorPayload(raw_in)};
    raw.out_into = shared_reply;  // outputs straight into the shared memory where they fit
    status = raw_in.empty() ? absl::OkStatus() : shared_->replies->Charge(id->tenant, in_bytes, &charge);
    absl::StatusOr<v1::AttendResponse> r =
        status.ok() ? service_->Attend(*id, req.attend(), raw_in.empty() ? nullptr : &raw) : status;
    if (r.ok()) {
      charge.Release(charge.amount() - std::min<uint64_t>(charge.amount(), raw.out_bytes));
      *head.mutable_attend() = std::move(*r);
      if (raw.out == nullptr && raw.out_bytes > 0) {
        head.set_shared_reply_bytes(raw.out_bytes);
        charge.Reset();
      } else {
        owned = std::move(raw.out);
        if (raw.out_bytes > 0) payload.push_back({owned.get(), raw.out_bytes});
        payload_bytes = raw.out_bytes;
      }
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
    // Dense blocks are decoded straight into the shared reply area where
    // they fit, else into a buffer of the reply's.
    const bool dense_shared = plan.dense && reply <= shared_reply.size();
    uint8_t* dense = dense_shared ? shared_reply.data() : nullptr;
    if (status.ok() && plan.dense) {
      if (!dense_shared) {
        owned.reset(new uint8_t[2 * t * plan.blocks.size()]);  // every byte is decoded into: no zero fill
        dense = owned.get();
      }
      status = service_->DecodeDenseBlocks(plan, dense);
    }
    for (size_t i = 0; status.ok() && i < plan.blocks.size(); ++i) {
      const KvService::Span span =
          plan.dense ? KvService::Span{dense + 2 * t * i, 2 * t} : KvService::PackedBytes(plan, i);
      v1::DataPlaneBlock* b = head.add_blocks();
      b->set_block_hash(plan.hashes[i]);
      b->set_tier(ToProtoTier(plan.blocks[i].tier));
      b->set_payload_bytes(span.size);
      if (span.size > 0 && !dense_shared) payload.push_back({const_cast<uint8_t*>(span.data), span.size});
      payload_bytes += span.size;
    }
    if (status.ok() && dense_shared) {
      head.set_shared_reply_bytes(payload_bytes);
      payload_bytes = 0;
      plan.blocks.clear();
      charge.Reset();
    }
  }
  // A reply payload that fits the frame's shared reply area goes there.
  if (status.ok() && payload_bytes > 0 && payload_bytes <= shared_reply.size()) {
    uint8_t* to = shared_reply.data();
    for (const iovec& v : payload) {
      std::memcpy(to, v.iov_base, v.iov_len);
      to += v.iov_len;
    }
    head.set_shared_reply_bytes(payload_bytes);
    payload.clear();
    payload_bytes = 0;
    owned.reset();
    plan.blocks.clear();
    charge.Reset();
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
  out.blocks = std::move(plan.blocks);
  return out;
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


bool DataPlaneServer::Loop::Submit(Conn* c, v1::DataPlaneRequest* req, size_t prefix, uint32_t n, uint64_t payload,
                                   size_t frame) {
  struct Task {
    v1::DataPlaneRequest req;
    InputBuffer input;  // holds the frame at `at`
    size_t at = 0;
    uint64_t charged = 0;
  };
  auto owned = std::make_unique<Task>();
  Task* t = owned.get();
  t->req.Swap(req);
  t->at = c->in_off;
  t->charged = std::exchange(c->charged, 0);
  t->input = std::move(c->in);
  // What came after the frame (the start of the next one) stays.
  const size_t end = t->at + frame, rest = t->input.size() - end;
  if (rest > 0) {
    std::memcpy(c->in.Room(rest), t->input.data() + end, rest);
    c->in.Received(rest);
  }
  WorkQueue::Task run = [this, c, t = std::move(owned), prefix, n, payload, frame] {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(t->input.data() + t->at);
    Served s = Compute(c, &t->req, {p + prefix + n, payload}, frame);
    // The frame's bytes (and their share of the budget) are given back
    // before the loop hears of it, so that its next frame can be charged.
    t->input = InputBuffer();
    shared_->buffered_bytes.fetch_sub(t->charged, std::memory_order_relaxed);
    {
      absl::MutexLock l(&mu_);
      finished_.push_back({c, std::move(s)});
    }
    finished_ready_.store(true, std::memory_order_release);
    Wake();
    shared_->tasks.fetch_sub(1, std::memory_order_release);  // last: Shutdown waits for it
  };
  shared_->tasks.fetch_add(1, std::memory_order_relaxed);
  if (!env_->backend_work->TrySubmit(run)) {  // full: everything back as it was
    shared_->tasks.fetch_sub(1, std::memory_order_relaxed);
    c->in = std::move(t->input);
    c->charged = t->charged;
    req->Swap(&t->req);
    return false;
  }
  c->in_off = 0;
  c->busy = true;
  c->out.emplace_back().pending = true;
  ++in_flight_;
  poll_until_ = std::chrono::steady_clock::now() + kPollWhileBusy;
  return true;
}

void DataPlaneServer::Loop::TakeFinished() {
  std::vector<Finished> finished;
  finished_ready_.store(false, std::memory_order_relaxed);  // before the swap: a later push sets it again
  {
    absl::MutexLock l(&mu_);
    finished.swap(finished_);
  }
  for (Finished& f : finished) {
    Conn* c = f.c;
    c->busy = false;
    --in_flight_;
    if (c->closed) {
      Close(c);  // its reply has no reader
      continue;
    }
    auto slot = std::find_if(c->out.begin(), c->out.end(), [](const Reply& r) { return r.pending; });
    slot->pending = false;
    Deliver(c, &*slot, std::move(f.served));
    Resume(c);
  }
}

void DataPlaneServer::Loop::Resume(Conn* c) {
  c->stalled = false;
  if (c->tls != nullptr && c->tls->established() && !ReadInput(c)) return;  // what OpenSSL holds, epoll does not see
  Process(c);
  ServeDoorbell(c);
  if (!Flush(c)) return;
  Settle(c);
}

}  // namespace tqkv::service
