#include "base/byte_size.h"

#include <cstdio>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tqkv {
namespace {

struct Unit {
  const char* name;
  uint64_t multiplier;
};
constexpr uint64_t kKi = 1024, kK = 1000;
constexpr Unit kUnits[] = {
    {"", 1},          {"B", 1},
    {"KiB", kKi},     {"MiB", kKi * kKi}, {"GiB", kKi * kKi * kKi}, {"TiB", kKi * kKi * kKi * kKi},
    {"PiB", kKi * kKi * kKi * kKi * kKi},
    {"Ki", kKi},      {"Mi", kKi * kKi},  {"Gi", kKi * kKi * kKi},  {"Ti", kKi * kKi * kKi * kKi},
    {"Pi", kKi * kKi * kKi * kKi * kKi},
    {"kB", kK},       {"KB", kK},         {"MB", kK * kK},          {"GB", kK * kK * kK},
    {"TB", kK * kK * kK * kK},            {"PB", kK * kK * kK * kK * kK},
    {"k", kK},        {"K", kK},          {"M", kK * kK},           {"G", kK * kK * kK},
    {"T", kK * kK * kK * kK},             {"P", kK * kK * kK * kK * kK},
};

}  // namespace

bool ParseByteSize(absl::string_view text, uint64_t* bytes, std::string* error) {
  const absl::string_view in = absl::StripAsciiWhitespace(text);
  size_t i = 0;
  unsigned __int128 whole = 0;
  bool digits = false;
  for (; i < in.size() && absl::ascii_isdigit(static_cast<unsigned char>(in[i])); ++i, digits = true) {
    whole = whole * 10 + static_cast<unsigned>(in[i] - '0');
    if (whole > std::numeric_limits<uint64_t>::max()) {
      *error = absl::StrCat("'", text, "' is over 2^64 bytes");
      return false;
    }
  }
  // The fraction as numerator / 10^scale.
  unsigned __int128 frac = 0, scale = 1;
  if (i < in.size() && in[i] == '.') {
    for (++i; i < in.size() && absl::ascii_isdigit(static_cast<unsigned char>(in[i])); ++i, digits = true) {
      if (scale >= 1000000000000000000ull) {
        *error = absl::StrCat("'", text, "' has more than 18 decimals");
        return false;
      }
      frac = frac * 10 + static_cast<unsigned>(in[i] - '0');
      scale *= 10;
    }
  }
  if (!digits) {
    *error = absl::StrCat("'", text, "' is not a byte count (e.g. 1073741824, 64GiB, 512MiB, 10GB)");
    return false;
  }
  const absl::string_view unit = absl::StripLeadingAsciiWhitespace(in.substr(i));
  const Unit* u = nullptr;
  for (const Unit& c : kUnits)
    if (unit == c.name) u = &c;
  if (u == nullptr) {
    *error = absl::StrCat("'", text, "' has an unknown unit '", unit,
                          "' (B, KiB, MiB, GiB, TiB, PiB, kB, MB, GB, TB, PB)");
    return false;
  }
  const unsigned __int128 total = whole * u->multiplier;
  const unsigned __int128 part = frac * u->multiplier;
  if (part % scale != 0) {
    *error = absl::StrCat("'", text, "' is not a whole number of bytes");
    return false;
  }
  const unsigned __int128 sum = total + part / scale;
  if (sum > std::numeric_limits<uint64_t>::max()) {
    *error = absl::StrCat("'", text, "' is over 2^64 bytes");
    return false;
  }
  *bytes = static_cast<uint64_t>(sum);
  return true;
}

std::string ExactByteSize(uint64_t bytes) {
  static constexpr const char* kBinary[] = {"PiB", "TiB", "GiB", "MiB", "KiB"};
  for (int k = 0; k < 5; ++k) {
    const uint64_t m = uint64_t{1} << (10 * (5 - k));
    if (bytes != 0 && bytes % m == 0) return absl::StrCat(bytes / m, kBinary[k]);
  }
  return absl::StrCat(bytes);
}

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int k = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && k < 6) {
    v /= 1024;
    ++k;
  }
  char buf[32];
  if (k == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, v >= 100 ? "%.0f %s" : v >= 10 ? "%.1f %s" : "%.2f %s", v, kNames[k]);
  }
  return buf;
}

bool AbslParseFlag(absl::string_view text, ByteSize* out, std::string* error) {
  return ParseByteSize(text, &out->bytes, error);
}

std::string AbslUnparseFlag(ByteSize size) { return ExactByteSize(size.bytes); }

}  // namespace tqkv
