// Fuzz target: cache-format and dtype names (codec/format.h ParseFormat,
// codec/dtype.h ParseDType), the strings a client sends as
// CodecConfig.cache_dtype, layer overrides and tensor dtypes. Parsing is
// strict: a name is accepted only if it is, ignoring ASCII case, one of the
// documented spellings, and the canonical name it yields parses to the
// same format.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "codec/dtype.h"
#include "codec/format.h"

namespace {

const std::set<std::string>& AcceptedFormatNames() {
  static const auto* names = [] {
    auto* s = new std::set<std::string>{"tq4_kv", "dense"};
    for (const std::string& n : tqkv::AllFormatNames()) s->insert(n);
    for (int b : {2, 3, 4, 5, 8}) s->insert("tq" + std::to_string(b));
    return s;
  }();
  return *names;
}

const std::set<std::string>& AcceptedDTypeNames() {
  static const auto* names = new std::set<std::string>{
      "fp16", "float16", "half", "bf16", "bfloat16", "fp32", "float32", "float"};
  return *names;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string name(reinterpret_cast<const char*>(data), size);
  const std::string lower = absl::AsciiStrToLower(name);

  absl::StatusOr<tqkv::Format> format = tqkv::ParseFormat(name);
  if (format.ok() != (AcceptedFormatNames().count(lower) == 1)) std::abort();
  if (format.ok()) {
    absl::StatusOr<tqkv::Format> canonical = tqkv::ParseFormat(format->name);
    if (!canonical.ok() || !(*canonical == *format)) std::abort();
  } else if (format.status().code() != absl::StatusCode::kInvalidArgument) {
    std::abort();
  }

  absl::StatusOr<tqkv::DType> dtype = tqkv::ParseDType(name);
  if (dtype.ok() != (AcceptedDTypeNames().count(lower) == 1)) std::abort();
  if (!dtype.ok() && dtype.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
  return 0;
}
