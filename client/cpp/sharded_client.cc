#include "client/cpp/sharded_client.h"

#include <atomic>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tqkv::client {
namespace {

// Routing keys of a batched call's blocks (ShardedClient's contract).
absl::StatusOr<std::vector<absl::string_view>> BatchKeys(
    const google::protobuf::RepeatedPtrField<std::string>& hashes, const std::vector<std::string>& keys) {
  const size_t n = static_cast<size_t>(hashes.size());
  if (keys.size() > 1 && keys.size() != n)
    return absl::InvalidArgumentError(absl::StrCat(keys.size(), " routing keys for ", n, " blocks"));
  std::vector<absl::string_view> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = keys.empty() ? hashes[0] : keys.size() == 1 ? keys[0] : keys[i];
  return out;
}

absl::StatusOr<std::vector<absl::string_view>> PutKeys(const std::vector<v1::PutBlock>& blocks,
                                                      const std::vector<std::string>& keys) {
  if (keys.size() > 1 && keys.size() != blocks.size())
    return absl::InvalidArgumentError(absl::StrCat(keys.size(), " routing keys for ", blocks.size(), " blocks"));
  std::vector<absl::string_view> out(blocks.size());
  if (!keys.empty()) {
    for (size_t i = 0; i < blocks.size(); ++i) out[i] = keys.size() == 1 ? keys[0] : keys[i];
    return out;
  }
  std::map<absl::string_view, absl::string_view> key_of;  // block hash -> its chain's key
  for (size_t i = 0; i < blocks.size(); ++i) {
    const v1::PutBlock& b = blocks[i];
    if (b.parent_hash().empty()) {
      out[i] = b.block_hash();
    } else if (auto it = key_of.find(b.parent_hash()); it != key_of.end()) {
      out[i] = it->second;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "blocks[", i, "] continues a chain that starts before this call: pass routing keys"));
    }
    key_of.emplace(b.block_hash(), out[i]);
  }
  return out;
}

// "SHARD/ID" -> {SHARD, ID}; NOT_FOUND when the id has no shard part.
absl::StatusOr<std::pair<absl::string_view, absl::string_view>> SplitSequenceId(absl::string_view id) {
  const size_t slash = id.rfind('/');
  if (slash == absl::string_view::npos || slash == 0)
    return absl::NotFoundError(absl::StrCat("sequence '", id, "' was not created by a sharded client"));
  return std::make_pair(id.substr(0, slash), id.substr(slash + 1));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardedClient>> ShardedClient::Connect(ShardedClientOptions options) {
  if (options.servers.empty() == options.dns.empty())
    return absl::InvalidArgumentError("set exactly one of servers and dns");
  std::vector<ShardSpec> servers = options.servers;
  if (!options.dns.empty()) {
    absl::StatusOr<std::vector<ShardSpec>> resolved = ResolveShards(options.dns);
    if (!resolved.ok()) return resolved.status();
    servers = *std::move(resolved);
  }
  auto c = std::unique_ptr<ShardedClient>(new ShardedClient(std::move(options)));
  if (absl::Status s = c->Install(servers); !s.ok()) return s;
  absl::MutexLock l(&c->resolve_mu_);
  c->next_resolve_ = c->Now() + c->options_.resolve_interval;
  return c;
}

absl::Status ShardedClient::SetServers(const std::vector<ShardSpec>& servers) { return Install(servers); }

absl::Status ShardedClient::Install(const std::vector<ShardSpec>& servers) {
  if (servers.empty()) return absl::InvalidArgumentError("no servers");
  std::set<std::string> names;
  for (const ShardSpec& s : servers) {
    if (!(s.weight > 0)) return absl::InvalidArgumentError(absl::StrCat("shard ", s.address, ": weight must be > 0"));
    if (s.address.empty()) return absl::InvalidArgumentError("empty shard address");
    if (!names.insert(s.address).second)
      return absl::InvalidArgumentError(absl::StrCat("shard ", s.address, " is listed twice"));
  }
  auto next = std::make_shared<Members>();
  absl::MutexLock l(&mu_);
  for (const ShardSpec& s : servers) {
    std::shared_ptr<Shard> shard = members_ ? ByName(*members_, s.address) : nullptr;
    if (shard == nullptr) shard = std::make_shared<Shard>(s.address, options_.shard);
    next->shards.push_back(std::move(shard));
    next->ring.push_back({s.address, s.weight});
  }
  members_ = std::move(next);
  return absl::OkStatus();
}

std::shared_ptr<const ShardedClient::Members> ShardedClient::Current() {
  // One caller re-resolves; the others go on with the current members. A
  // failed resolution keeps them until the next interval.
  if (!options_.dns.empty() && resolve_mu_.TryLock()) {
    const absl::Time now = Now();
    if (now >= next_resolve_) {
      next_resolve_ = now + options_.resolve_interval;
      absl::StatusOr<std::vector<ShardSpec>> resolved = ResolveShards(options_.dns);
      if (resolved.ok()) (void)Install(*resolved);  // resolved lists are valid
    }
    resolve_mu_.Unlock();
  }
  absl::MutexLock l(&mu_);
  return members_;
}

std::vector<std::string> ShardedClient::Shards() {
  std::vector<std::string> out;
  for (const RendezvousShard& r : Current()->ring) out.push_back(r.name);
  return out;
}

std::string ShardedClient::ShardFor(absl::string_view routing_key) {
  return Owner(*Current(), routing_key)->name();
}

std::shared_ptr<Shard> ShardedClient::Owner(const Members& m, absl::string_view key) const {
  return m.shards[RendezvousOwner(std::string_view(key.data(), key.size()), m.ring)];
}

std::shared_ptr<Shard> ShardedClient::ByName(const Members& m, absl::string_view name) const {
  for (const std::shared_ptr<Shard>& s : m.shards)
    if (s->name() == name) return s;
  return nullptr;
}

std::vector<ShardedClient::Group> ShardedClient::Split(const Members& m,
                                                       const std::vector<absl::string_view>& keys) const {
  // An empty call still goes to one shard, which answers it as a server does.
  if (keys.empty()) return {Group{Owner(m, ""), {}}};
  std::vector<Group> groups;
  std::map<const Shard*, size_t> index;
  for (size_t i = 0; i < keys.size(); ++i) {
    std::shared_ptr<Shard> s = Owner(m, keys[i]);
    auto [it, added] = index.emplace(s.get(), groups.size());
    if (added) groups.push_back({std::move(s), {}});
    groups[it->second].items.push_back(static_cast<int>(i));
  }
  return groups;
}

void ShardedClient::Parallel(size_t n, const std::function<void(size_t)>& fn) {
  std::vector<std::thread> threads;
  for (size_t i = 1; i < n; ++i) threads.emplace_back(fn, i);
  if (n > 0) fn(0);
  for (std::thread& t : threads) t.join();
}

absl::StatusOr<std::shared_ptr<Client>> ShardedClient::Prepare(Shard& shard, uint64_t model_id) {
  absl::StatusOr<std::shared_ptr<Client>> c = shard.Acquire(Now());
  if (!c.ok() || model_id == 0 || shard.HasModel(model_id)) return c;
  Registration reg;
  {
    absl::MutexLock l(&mu_);
    auto it = models_.find(model_id);
    if (it == models_.end()) return c;  // registered elsewhere: the server knows it or says NOT_FOUND
    reg = it->second;
  }
  absl::StatusOr<v1::RegisterModelResponse> r = (*c)->RegisterModel(reg.request);
  shard.Report(r.status(), Now(), options_.down_interval);
  if (!r.ok()) return ShardError(shard.name(), r.status());
  if (r->layout_fingerprint() != reg.fingerprint)
    return absl::FailedPreconditionError(absl::StrCat("shard ", shard.name(), ": model '", reg.request.model_name(),
                                                      "' has fingerprint ", r->layout_fingerprint(), " there, ",
                                                      reg.fingerprint, " on the other shards"));
  shard.AddModel(model_id);
  return c;
}

absl::Status ShardedClient::OnShard(Shard& shard, uint64_t model_id,
                                    const std::function<absl::Status(Client&)>& call) {
  absl::StatusOr<std::shared_ptr<Client>> c = Prepare(shard, model_id);
  if (!c.ok()) return c.status();
  absl::Status s = call(**c);
  shard.Report(s, Now(), options_.down_interval);
  return ShardError(shard.name(), s);
}

absl::Status ShardedClient::SplitCall(uint64_t model_id, const std::vector<absl::string_view>& keys,
                                      const std::function<absl::Status(Client&, const std::vector<int>&)>& call) {
  std::shared_ptr<const Members> m = Current();
  const std::vector<Group> groups = Split(*m, keys);
  std::vector<absl::Status> status(groups.size());
  Parallel(groups.size(), [&](size_t g) {
    status[g] = OnShard(*groups[g].shard, model_id, [&](Client& c) { return call(c, groups[g].items); });
  });
  for (const absl::Status& s : status)
    if (!s.ok()) return s;
  return absl::OkStatus();
}

absl::StatusOr<v1::RegisterModelResponse> ShardedClient::RegisterModel(const v1::RegisterModelRequest& req) {
  std::shared_ptr<const Members> m = Current();
  std::vector<absl::StatusOr<v1::RegisterModelResponse>> results(m->shards.size(), absl::UnknownError(""));
  Parallel(m->shards.size(), [&](size_t i) {
    Shard& shard = *m->shards[i];
    absl::StatusOr<std::shared_ptr<Client>> c = shard.Acquire(Now());
    if (!c.ok()) {
      results[i] = c.status();
      return;
    }
    absl::StatusOr<v1::RegisterModelResponse> r = (*c)->RegisterModel(req);
    shard.Report(r.status(), Now(), options_.down_interval);
    results[i] = r.ok() ? std::move(r) : ShardError(shard.name(), r.status());
  });
  const v1::RegisterModelResponse* first = nullptr;
  absl::Status down;
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok()) {
      if (!IsShardDown(results[i].status())) return results[i].status();
      if (down.ok()) down = results[i].status();
      continue;
    }
    if (first == nullptr) {
      first = &*results[i];
    } else if (results[i]->layout_fingerprint() != first->layout_fingerprint() ||
               results[i]->model_id() != first->model_id()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", m->shards[i]->name(), ": model '", req.model_name(), "' registered as ", results[i]->model_id(),
          "/", results[i]->layout_fingerprint(), ", other shards say ", first->model_id(), "/",
          first->layout_fingerprint(), " (mixed server versions?)"));
    }
  }
  if (first == nullptr) return absl::UnavailableError(absl::StrCat("no shard reachable; ", down.message()));
  {
    absl::MutexLock l(&mu_);
    models_[first->model_id()] = Registration{req, first->layout_fingerprint()};
  }
  for (size_t i = 0; i < results.size(); ++i)
    if (results[i].ok()) m->shards[i]->AddModel(first->model_id());
  return *first;
}

absl::StatusOr<v1::PutBlocksResponse> ShardedClient::PutBlocks(const v1::PutHeader& header,
                                                               const std::vector<v1::PutBlock>& blocks,
                                                               const std::vector<std::string>& routing_keys) {
  absl::StatusOr<std::vector<absl::string_view>> keys = PutKeys(blocks, routing_keys);
  if (!keys.ok()) return keys.status();
  absl::Mutex mu;
  v1::PutBlocksResponse total;
  absl::Status s = SplitCall(header.model().model_id(), *keys, [&](Client& c, const std::vector<int>& items) {
    std::vector<v1::PutBlock> part;
    part.reserve(items.size());
    for (int i : items) part.push_back(blocks[i]);
    absl::StatusOr<v1::PutBlocksResponse> r = c.PutBlocks(header, part);
    if (!r.ok()) return r.status();
    absl::MutexLock l(&mu);
    total.set_committed(total.committed() + r->committed());
    total.set_already_present(total.already_present() + r->already_present());
    total.set_staged(total.staged() + r->staged());
    total.set_packed_bytes(total.packed_bytes() + r->packed_bytes());
    total.set_dense_equivalent_bytes(total.dense_equivalent_bytes() + r->dense_equivalent_bytes());
    return absl::OkStatus();
  });
  if (!s.ok())
    return absl::Status(s.code(), absl::StrCat(s.message(), " (other shards committed ", total.committed(),
                                               " blocks, ", total.already_present(), " already present)"));
  return total;
}

absl::StatusOr<v1::LookupResponse> ShardedClient::Lookup(const v1::LookupRequest& req, absl::string_view routing_key) {
  if (routing_key.empty() && req.block_hashes_size() > 0) routing_key = req.block_hashes(0);
  std::shared_ptr<Shard> shard = Owner(*Current(), routing_key);
  v1::LookupResponse resp;
  absl::Status s = OnShard(*shard, req.model().model_id(), [&](Client& c) {
    absl::StatusOr<v1::LookupResponse> r = c.Lookup(req);
    if (r.ok()) resp = *std::move(r);
    return r.status();
  });
  if (IsShardDown(s)) return v1::LookupResponse();  // the chain is a miss
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<std::vector<v1::GetBlocksResponse>> ShardedClient::GetBlocks(
    const v1::GetBlocksRequest& req, const std::vector<std::string>& routing_keys) {
  absl::StatusOr<std::vector<absl::string_view>> keys = BatchKeys(req.block_hashes(), routing_keys);
  if (!keys.ok()) return keys.status();
  std::vector<v1::GetBlocksResponse> out(req.block_hashes_size());
  absl::Status s = SplitCall(req.model().model_id(), *keys, [&](Client& c, const std::vector<int>& items) {
    v1::GetBlocksRequest part = req;
    part.clear_block_hashes();
    for (int i : items) part.add_block_hashes(req.block_hashes(i));
    absl::StatusOr<std::vector<v1::GetBlocksResponse>> r = c.GetBlocks(part);
    if (!r.ok()) return r.status();
    if (r->size() != items.size())
      return absl::InternalError(absl::StrCat("returned ", r->size(), " blocks for ", items.size(), " hashes"));
    for (size_t k = 0; k < items.size(); ++k) out[items[k]] = std::move((*r)[k]);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  // As from one server: the format only with the first block.
  for (size_t i = 1; i < out.size(); ++i) out[i].clear_format();
  return out;
}

// Pin, Unpin and Delete: split by shard, counts summed.
#define TQKV_SPLIT_COUNT(Method, Req, Resp, field)                                                   \
  absl::StatusOr<v1::Resp> ShardedClient::Method(const v1::Req& req,                                 \
                                                 const std::vector<std::string>& routing_keys) {     \
    absl::StatusOr<std::vector<absl::string_view>> keys = BatchKeys(req.block_hashes(), routing_keys); \
    if (!keys.ok()) return keys.status();                                                            \
    std::atomic<uint32_t> n{0};                                                                      \
    absl::Status s = SplitCall(req.model().model_id(), *keys, [&](Client& c, const std::vector<int>& items) { \
      v1::Req part = req;                                                                            \
      part.clear_block_hashes();                                                                     \
      for (int i : items) part.add_block_hashes(req.block_hashes(i));                                \
      absl::StatusOr<v1::Resp> r = c.Method(part);                                                   \
      if (r.ok()) n += r->field();                                                                   \
      return r.status();                                                                             \
    });                                                                                              \
    if (!s.ok()) return s;                                                                           \
    v1::Resp resp;                                                                                   \
    resp.set_##field(n.load());                                                                      \
    return resp;                                                                                     \
  }
TQKV_SPLIT_COUNT(Pin, PinRequest, PinResponse, pinned)
TQKV_SPLIT_COUNT(Unpin, UnpinRequest, UnpinResponse, unpinned)
TQKV_SPLIT_COUNT(Delete, DeleteRequest, DeleteResponse, deleted)
#undef TQKV_SPLIT_COUNT

absl::StatusOr<v1::CreateSequenceResponse> ShardedClient::CreateSequence(const v1::CreateSequenceRequest& req,
                                                                         absl::string_view routing_key) {
  if (routing_key.empty()) routing_key = req.block_hashes_size() > 0 ? req.block_hashes(0) : req.tail_k().data();
  std::shared_ptr<Shard> shard = Owner(*Current(), routing_key);
  v1::CreateSequenceResponse resp;
  absl::Status s = OnShard(*shard, req.model().model_id(), [&](Client& c) {
    absl::StatusOr<v1::CreateSequenceResponse> r = c.CreateSequence(req);
    if (r.ok()) resp = *std::move(r);
    return r.status();
  });
  if (!s.ok()) return s;
  resp.set_sequence_id(absl::StrCat(shard->name(), "/", resp.sequence_id()));
  return resp;
}

absl::StatusOr<v1::AppendResponse> ShardedClient::Append(const v1::AppendRequest& req) {
  auto id = SplitSequenceId(req.sequence_id());
  if (!id.ok()) return id.status();
  std::shared_ptr<Shard> shard = ByName(*Current(), id->first);
  if (shard == nullptr)
    return absl::NotFoundError(absl::StrCat("sequence '", req.sequence_id(), "': shard ", id->first, " is not a member"));
  v1::AppendRequest part = req;
  part.set_sequence_id(std::string(id->second));
  v1::AppendResponse resp;
  absl::Status s = OnShard(*shard, 0, [&](Client& c) {
    absl::StatusOr<v1::AppendResponse> r = c.Append(part);
    if (r.ok()) resp = *std::move(r);
    return r.status();
  });
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::AttendResponse> ShardedClient::Attend(const v1::AttendRequest& req) {
  std::shared_ptr<const Members> m = Current();
  std::vector<Group> groups;
  std::vector<std::string> local_ids(req.items_size());
  for (int i = 0; i < req.items_size(); ++i) {
    auto id = SplitSequenceId(req.items(i).sequence_id());
    if (!id.ok()) return id.status();
    std::shared_ptr<Shard> shard = ByName(*m, id->first);
    if (shard == nullptr)
      return absl::NotFoundError(
          absl::StrCat("sequence '", req.items(i).sequence_id(), "': shard ", id->first, " is not a member"));
    local_ids[i] = std::string(id->second);
    size_t g = 0;
    while (g < groups.size() && groups[g].shard != shard) ++g;
    if (g == groups.size()) groups.push_back({shard, {}});
    groups[g].items.push_back(i);
  }
  if (groups.empty()) groups.push_back({Owner(*m, ""), {}});  // the server answers an empty call
  v1::AttendResponse total;
  total.mutable_outputs()->Reserve(req.items_size());
  for (int i = 0; i < req.items_size(); ++i) total.add_outputs();
  std::vector<absl::Status> status(groups.size());
  absl::Mutex mu;
  Parallel(groups.size(), [&](size_t g) {
    v1::AttendRequest part = req;
    part.clear_items();
    for (int i : groups[g].items) {
      v1::AttendItem* item = part.add_items();
      *item = req.items(i);
      item->set_sequence_id(local_ids[i]);
    }
    status[g] = OnShard(*groups[g].shard, 0, [&](Client& c) {
      absl::StatusOr<v1::AttendResponse> r = c.Attend(part);
      if (!r.ok()) return r.status();
      if (r->outputs_size() != static_cast<int>(groups[g].items.size()))
        return absl::InternalError(absl::StrCat("returned ", r->outputs_size(), " outputs for ",
                                                groups[g].items.size(), " items"));
      absl::MutexLock l(&mu);
      for (size_t k = 0; k < groups[g].items.size(); ++k)
        total.mutable_outputs(groups[g].items[k])->Swap(r->mutable_outputs(static_cast<int>(k)));
      total.set_kernel_micros(total.kernel_micros() + r->kernel_micros());
      total.set_device_micros(total.device_micros() + r->device_micros());
      total.set_service_micros(std::max(total.service_micros(), r->service_micros()));
      return absl::OkStatus();
    });
  });
  for (const absl::Status& s : status)
    if (!s.ok()) return s;
  return total;
}

absl::StatusOr<v1::DropSequenceResponse> ShardedClient::DropSequence(const v1::DropSequenceRequest& req) {
  auto id = SplitSequenceId(req.sequence_id());
  if (!id.ok()) return id.status();
  std::shared_ptr<Shard> shard = ByName(*Current(), id->first);
  if (shard == nullptr)
    return absl::NotFoundError(absl::StrCat("sequence '", req.sequence_id(), "': shard ", id->first, " is not a member"));
  v1::DropSequenceRequest part;
  part.set_sequence_id(std::string(id->second));
  absl::Status s = OnShard(*shard, 0, [&](Client& c) { return c.DropSequence(part).status(); });
  if (!s.ok()) return s;
  return v1::DropSequenceResponse();
}

std::vector<ShardResult<v1::StatsResponse>> ShardedClient::Stats(const v1::StatsRequest& req) {
  std::shared_ptr<const Members> m = Current();
  std::vector<ShardResult<v1::StatsResponse>> out(m->shards.size());
  Parallel(m->shards.size(), [&](size_t i) {
    out[i].shard = m->shards[i]->name();
    v1::StatsResponse resp;
    absl::Status s = OnShard(*m->shards[i], 0, [&](Client& c) {
      absl::StatusOr<v1::StatsResponse> r = c.Stats(req);
      if (r.ok()) resp = *std::move(r);
      return r.status();
    });
    out[i].result = s.ok() ? absl::StatusOr<v1::StatsResponse>(std::move(resp)) : s;
  });
  return out;
}

std::vector<ShardResult<v1::EvictResponse>> ShardedClient::Evict(const v1::EvictRequest& req) {
  std::shared_ptr<const Members> m = Current();
  std::vector<ShardResult<v1::EvictResponse>> out(m->shards.size());
  Parallel(m->shards.size(), [&](size_t i) {
    out[i].shard = m->shards[i]->name();
    v1::EvictResponse resp;
    absl::Status s = OnShard(*m->shards[i], 0, [&](Client& c) {
      absl::StatusOr<v1::EvictResponse> r = c.Evict(req);
      if (r.ok()) resp = *std::move(r);
      return r.status();
    });
    out[i].result = s.ok() ? absl::StatusOr<v1::EvictResponse>(std::move(resp)) : s;
  });
  return out;
}

std::vector<ShardResult<bool>> ShardedClient::Health() {
  std::shared_ptr<const Members> m = Current();
  std::vector<ShardResult<bool>> out(m->shards.size());
  Parallel(m->shards.size(), [&](size_t i) {
    out[i].shard = m->shards[i]->name();
    bool serving = false;
    absl::Status s = OnShard(*m->shards[i], 0, [&](Client& c) {
      absl::StatusOr<bool> r = c.Health();
      if (r.ok()) serving = *r;
      return r.status();
    });
    out[i].result = s.ok() ? absl::StatusOr<bool>(serving) : s;
  });
  return out;
}

}  // namespace tqkv::client
