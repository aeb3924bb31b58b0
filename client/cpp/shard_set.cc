#include "client/cpp/shard_set.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tqkv::client {
namespace {

// Splits HOST:PORT ([IP6]:PORT too) into host and port; false if malformed.
bool SplitHostPort(absl::string_view target, std::string* host, std::string* port) {
  const size_t colon = target.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 || colon + 1 == target.size()) return false;
  absl::string_view h = target.substr(0, colon);
  if (h.front() == '[') {
    if (h.back() != ']') return false;
    h = h.substr(1, h.size() - 2);
  }
  int p = 0;
  if (!absl::SimpleAtoi(target.substr(colon + 1), &p) || p < 0 || p > 65535) return false;
  *host = std::string(h);
  *port = std::string(target.substr(colon + 1));
  return !host->empty();
}

}  // namespace

absl::StatusOr<std::vector<ShardSpec>> ParseShardList(absl::string_view list) {
  std::vector<ShardSpec> out;
  std::set<std::string> seen;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    ShardSpec spec;
    const size_t eq = entry.find('=');
    if (eq != absl::string_view::npos) {
      if (!absl::SimpleAtod(entry.substr(eq + 1), &spec.weight) || !(spec.weight > 0) ||
          spec.weight > 1e9)
        return absl::InvalidArgumentError(absl::StrCat("shard '", entry, "': weight must be a positive number"));
      entry = entry.substr(0, eq);
    }
    std::string host, port;
    if (!SplitHostPort(entry, &host, &port))
      return absl::InvalidArgumentError(absl::StrCat("shard '", entry, "' is not HOST:PORT"));
    spec.address = std::string(entry);
    if (!seen.insert(spec.address).second)
      return absl::InvalidArgumentError(absl::StrCat("shard ", spec.address, " is listed twice"));
    out.push_back(std::move(spec));
  }
  return out;
}

absl::StatusOr<std::vector<ShardSpec>> ResolveShards(absl::string_view host_port) {
  std::string host, port;
  if (!SplitHostPort(host_port, &host, &port))
    return absl::InvalidArgumentError(absl::StrCat("'", host_port, "' is not HOST:PORT"));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    const std::string msg = absl::StrCat("resolving ", host_port, ": ", gai_strerror(rc));
    return rc == EAI_NONAME || rc == EAI_NODATA ? absl::NotFoundError(msg) : absl::UnavailableError(msg);
  }
  std::set<std::string> addresses;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char ip[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, ip, sizeof(ip));
      addresses.insert(absl::StrCat(ip, ":", port));
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, ip, sizeof(ip));
      addresses.insert(absl::StrCat("[", ip, "]:", port));
    }
  }
  freeaddrinfo(res);
  if (addresses.empty()) return absl::NotFoundError(absl::StrCat(host_port, " has no addresses"));
  std::vector<ShardSpec> out;
  for (const std::string& a : addresses) out.push_back({a, 1.0});
  return out;
}

absl::Status ShardError(absl::string_view shard, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("shard ", shard, ": ", s.message()));
}

bool IsShardDown(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded;
}

Shard::Shard(std::string address, ClientOptions options)
    : name_(std::move(address)), options_([&] {
        options.target = name_;
        // Each shard's channel owns its connections: a fresh channel after a
        // down window does not inherit another channel's reconnect backoff.
        options.channel_args.emplace_back("grpc.use_local_subchannel_pool", 1);
        return options;
      }()) {}

absl::StatusOr<std::shared_ptr<Client>> Shard::Acquire(absl::Time now) {
  absl::MutexLock l(&mu_);
  if (now < down_until_)
    return absl::UnavailableError(absl::StrCat("shard ", name_, " is down: ", last_error_.message()));
  if (client_ == nullptr) {
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(options_);
    if (!c.ok()) return ShardError(name_, c.status());
    client_ = std::move(*c);
  }
  return client_;
}

void Shard::Report(const absl::Status& s, absl::Time now, absl::Duration down_for) {
  if (!IsShardDown(s)) return;
  absl::MutexLock l(&mu_);
  down_until_ = now + down_for;
  last_error_ = s;
  client_.reset();
  models_.clear();
}

bool Shard::HasModel(uint64_t model_id) {
  absl::MutexLock l(&mu_);
  return models_.count(model_id) > 0;
}

void Shard::AddModel(uint64_t model_id) {
  absl::MutexLock l(&mu_);
  models_.insert(model_id);
}

}  // namespace tqkv::client
