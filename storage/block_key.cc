#include "storage/block_key.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tqkv::storage {

const char* TierName(Tier tier) {
  switch (tier) {
    case Tier::kGpu:
      return "gpu";
    case Tier::kHost:
      return "host";
    case Tier::kDisk:
      return "disk";
  }
  return "unknown";
}

BlockAccounting& BlockAccounting::operator+=(const BlockAccounting& o) {
  dense_equivalent_bytes += o.dense_equivalent_bytes;
  packed_k_bytes += o.packed_k_bytes;
  packed_v_bytes += o.packed_v_bytes;
  norms_metadata_bytes += o.norms_metadata_bytes;
  dense_window_bytes += o.dense_window_bytes;
  total_bytes += o.total_bytes;
  return *this;
}

BlockAccounting& BlockAccounting::operator-=(const BlockAccounting& o) {
  dense_equivalent_bytes -= o.dense_equivalent_bytes;
  packed_k_bytes -= o.packed_k_bytes;
  packed_v_bytes -= o.packed_v_bytes;
  norms_metadata_bytes -= o.norms_metadata_bytes;
  dense_window_bytes -= o.dense_window_bytes;
  total_bytes -= o.total_bytes;
  return *this;
}

absl::Status ValidateTenant(absl::string_view tenant) {
  if (tenant.size() > kMaxTenantBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant is ", tenant.size(), " bytes; the limit is ", kMaxTenantBytes));
  }
  return absl::OkStatus();
}

absl::Status ValidateBlockHash(absl::string_view hash) {
  if (hash.size() < kMinBlockHashBytes || hash.size() > kMaxBlockHashBytes) {
    return absl::InvalidArgumentError(absl::StrCat("block hash is ", hash.size(),
                                                   " bytes; it must be ", kMinBlockHashBytes,
                                                   "..", kMaxBlockHashBytes));
  }
  return absl::OkStatus();
}

absl::Status ValidateBlockKey(const BlockKey& key) {
  absl::Status s = ValidateTenant(key.tenant);
  if (!s.ok()) return s;
  return ValidateBlockHash(key.block_hash);
}

namespace {

void AppendVarint32(std::string* out, uint32_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Returns false on truncated or over-long input.
bool ParseVarint32(absl::string_view* in, uint32_t* v) {
  uint32_t result = 0;
  for (int shift = 0; shift <= 28 && !in->empty(); shift += 7) {
    uint32_t byte = static_cast<uint8_t>(in->front());
    in->remove_prefix(1);
    result |= (byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      *v = result;
      return true;
    }
  }
  return false;
}

void AppendBigEndian64(std::string* out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

std::string EncodeModelPrefix(absl::string_view tenant, uint64_t model_id) {
  std::string out;
  out.reserve(5 + tenant.size() + 8 + kMaxBlockHashBytes);
  AppendVarint32(&out, static_cast<uint32_t>(tenant.size()));
  out.append(tenant.data(), tenant.size());
  AppendBigEndian64(&out, model_id);
  return out;
}

std::string EncodeBlockKey(const BlockKey& key) {
  std::string out = EncodeModelPrefix(key.tenant, key.model_id);
  out.append(key.block_hash);
  return out;
}

absl::StatusOr<BlockKey> DecodeBlockKey(absl::string_view in) {
  uint32_t tenant_len = 0;
  if (!ParseVarint32(&in, &tenant_len) || in.size() < static_cast<size_t>(tenant_len) + 8) {
    return absl::InvalidArgumentError("encoded block key is truncated");
  }
  BlockKey key;
  key.tenant = std::string(in.substr(0, tenant_len));
  in.remove_prefix(tenant_len);
  for (int i = 0; i < 8; ++i) {
    key.model_id = (key.model_id << 8) | static_cast<uint8_t>(in[i]);
  }
  in.remove_prefix(8);
  key.block_hash = std::string(in);
  absl::Status s = ValidateBlockKey(key);
  if (!s.ok()) return s;
  return key;
}

std::string DebugString(const BlockKey& key) {
  return absl::StrCat(absl::CHexEscape(key.tenant), "/", key.model_id, "/",
                      absl::BytesToHexString(key.block_hash));
}

}  // namespace tqkv::storage
