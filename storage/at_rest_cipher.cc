#include "storage/at_rest_cipher.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace tqkv::storage {
namespace {

constexpr uint8_t kEnvelopeVersion = 1;
constexpr size_t kHeaderBytes = 24, kNonceBytes = 12, kTagBytes = 16;
constexpr char kSalt[] = "tqkv at-rest v1";

struct CtxDeleter {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};

void PutLe(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetLe(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

absl::StatusOr<AtRestCipher::Key> Hkdf(const AtRestCipher::Key& ikm, absl::string_view info) {
  AtRestCipher::Key out;
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  size_t len = out.size();
  const bool ok =
      ctx != nullptr && EVP_PKEY_derive_init(ctx) == 1 && EVP_PKEY_CTX_set_hkdf_md(ctx, EVP_sha256()) == 1 &&
      EVP_PKEY_CTX_set1_hkdf_salt(ctx, reinterpret_cast<const unsigned char*>(kSalt), sizeof kSalt - 1) == 1 &&
      EVP_PKEY_CTX_set1_hkdf_key(ctx, ikm.data(), static_cast<int>(ikm.size())) == 1 &&
      EVP_PKEY_CTX_add1_hkdf_info(ctx, reinterpret_cast<const unsigned char*>(info.data()),
                                  static_cast<int>(info.size())) == 1 &&
      EVP_PKEY_derive(ctx, out.data(), &len) == 1 && len == out.size();
  EVP_PKEY_CTX_free(ctx);
  ERR_clear_error();
  if (!ok) return absl::InternalError("HKDF-SHA256 failed");
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AtRestCipher>> AtRestCipher::FromFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return absl::NotFoundError(absl::StrCat("cannot read at-rest key file ", path));
  if ((st.st_mode & 077) != 0)
    return absl::FailedPreconditionError(absl::StrFormat(
        "at-rest key file %s has mode %04o: group and others must have no access (chmod 600)", path,
        st.st_mode & 07777));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read at-rest key file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<std::unique_ptr<AtRestCipher>> c = FromString(ss.str());
  if (!c.ok()) return absl::Status(c.status().code(), absl::StrCat(path, ": ", c.status().message()));
  return c;
}

absl::StatusOr<std::unique_ptr<AtRestCipher>> AtRestCipher::FromString(absl::string_view contents) {
  std::unique_ptr<AtRestCipher> c(new AtRestCipher());
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    uint32_t id = 0;
    if (f.size() != 2 || !absl::SimpleAtoi(f[0], &id) || id == 0 || f[1].size() != 64)
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": expected `ID HEX` (id 1..4294967295, 64 hex digits)"));
    Master m;
    for (size_t i = 0; i < 32; ++i) {
      int v = 0;
      for (char ch : f[1].substr(2 * i, 2)) {
        const int d = absl::ascii_isdigit(ch) ? ch - '0'
                      : (ch >= 'a' && ch <= 'f') ? ch - 'a' + 10
                      : (ch >= 'A' && ch <= 'F') ? ch - 'A' + 10
                                                 : -1;
        if (d < 0) return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": the key is not hex"));
        v = v * 16 + d;
      }
      m.key[i] = static_cast<uint8_t>(v);
    }
    absl::StatusOr<Key> check = Hkdf(m.key, "key check");
    if (!check.ok()) return check.status();
    m.check = GetLe(check->data(), 8);
    if (!c->masters_.emplace(id, m).second)
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": key id ", id, " appears twice"));
  }
  if (c->masters_.empty()) return absl::InvalidArgumentError("the at-rest key file holds no key");
  c->current_ = c->masters_.rbegin()->first;
  return c;
}

absl::StatusOr<AtRestCipher::Key> AtRestCipher::TenantKey(uint32_t id, absl::string_view tenant) const {
  const std::string name = absl::StrCat(id, "/", tenant);
  {
    absl::MutexLock l(&mu_);
    if (auto it = derived_.find(name); it != derived_.end()) return it->second;
  }
  absl::StatusOr<Key> k = Hkdf(masters_.at(id).key, absl::StrCat("tenant:", tenant));
  if (!k.ok()) return k.status();
  absl::MutexLock l(&mu_);
  derived_.emplace(name, *k);
  return k;
}

absl::StatusOr<std::string> AtRestCipher::Seal(absl::string_view tenant, absl::string_view aad,
                                               absl::string_view plaintext) const {
  absl::StatusOr<Key> key = TenantKey(current_, tenant);
  if (!key.ok()) return key.status();
  std::string out(kOverheadBytes + plaintext.size(), '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  p[0] = kEnvelopeVersion;
  PutLe(p + 4, current_, 4);
  PutLe(p + 8, masters_.at(current_).check, 8);
  uint8_t* nonce = p + kHeaderBytes;
  uint8_t* body = nonce + kNonceBytes;
  uint8_t* tag = body + plaintext.size();
  std::unique_ptr<EVP_CIPHER_CTX, CtxDeleter> ctx(EVP_CIPHER_CTX_new());
  int n = 0;
  const bool ok =
      ctx != nullptr && RAND_bytes(nonce, kNonceBytes) == 1 &&
      EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key->data(), nonce) == 1 &&
      EVP_EncryptUpdate(ctx.get(), nullptr, &n, p, kHeaderBytes) == 1 &&
      EVP_EncryptUpdate(ctx.get(), nullptr, &n, reinterpret_cast<const uint8_t*>(aad.data()),
                        static_cast<int>(aad.size())) == 1 &&
      EVP_EncryptUpdate(ctx.get(), body, &n, reinterpret_cast<const uint8_t*>(plaintext.data()),
                        static_cast<int>(plaintext.size())) == 1 &&
      EVP_EncryptFinal_ex(ctx.get(), body + n, &n) == 1 &&
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, tag) == 1;
  ERR_clear_error();
  if (!ok) return absl::InternalError("AES-256-GCM sealing failed");
  return out;
}

absl::StatusOr<std::unique_ptr<HostBuffer>> AtRestCipher::Open(absl::string_view tenant, absl::string_view aad,
                                                               absl::string_view sealed, HostArena* arena) const {
  if (sealed.size() < kOverheadBytes)
    return absl::DataLossError(absl::StrCat("sealed record of ", sealed.size(), " bytes is truncated"));
  const auto* p = reinterpret_cast<const uint8_t*>(sealed.data());
  if (p[0] != kEnvelopeVersion)
    return absl::DataLossError(absl::StrCat("unknown at-rest envelope version ", p[0]));
  const uint32_t id = static_cast<uint32_t>(GetLe(p + 4, 4));
  auto master = masters_.find(id);
  if (master == masters_.end())
    return absl::FailedPreconditionError(
        absl::StrCat("sealed with at-rest key id ", id, ", which the key file does not hold"));
  if (master->second.check != GetLe(p + 8, 8))
    return absl::FailedPreconditionError(
        absl::StrCat("at-rest key id ", id, " of the key file is not the key this record was sealed with"));
  absl::StatusOr<Key> key = TenantKey(id, tenant);
  if (!key.ok()) return key.status();
  const size_t size = sealed.size() - kOverheadBytes;
  absl::StatusOr<std::unique_ptr<HostBuffer>> out = HostBuffer::Allocate(size, arena);
  if (!out.ok()) return out.status();
  const uint8_t* nonce = p + kHeaderBytes;
  const uint8_t* body = nonce + kNonceBytes;
  uint8_t tag[kTagBytes];
  std::memcpy(tag, body + size, kTagBytes);
  std::unique_ptr<EVP_CIPHER_CTX, CtxDeleter> ctx(EVP_CIPHER_CTX_new());
  int n = 0;
  const bool ready =
      ctx != nullptr && EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key->data(), nonce) == 1 &&
      EVP_DecryptUpdate(ctx.get(), nullptr, &n, p, kHeaderBytes) == 1 &&
      EVP_DecryptUpdate(ctx.get(), nullptr, &n, reinterpret_cast<const uint8_t*>(aad.data()),
                        static_cast<int>(aad.size())) == 1 &&
      (size == 0 || EVP_DecryptUpdate(ctx.get(), (*out)->data(), &n, body, static_cast<int>(size)) == 1) &&
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes, tag) == 1;
  uint8_t final_block[16];
  const bool authentic = ready && EVP_DecryptFinal_ex(ctx.get(), final_block, &n) == 1;
  ERR_clear_error();
  if (!ready) return absl::InternalError("AES-256-GCM opening failed");
  if (!authentic) {
    if (size > 0) std::memset((*out)->data(), 0, size);  // no unauthenticated byte leaves
    return absl::DataLossError("sealed record fails authentication (edited, or not this block's record)");
  }
  return out;
}

}  // namespace tqkv::storage
