#include "codec/format.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codec/packing.h"

namespace tqkv {
namespace {

bool ValidBits(int b) { return (b >= 2 && b <= 5) || b == 8; }

GroupLayout MakeGroup(int channels, int bits, bool qjl, bool fp16_norms, size_t offset) {
  GroupLayout g;
  g.channels = channels;
  g.bits = bits;
  g.qjl = qjl;
  g.mse_bits = qjl ? bits - 1 : bits;
  g.fp16_norms = fp16_norms;
  g.index_offset = offset;
  g.index_bytes = PackedBytes(channels, g.mse_bits);
  size_t p = offset + g.index_bytes;
  if (qjl) {
    g.sign_offset = p;
    g.sign_bytes = PackedBytes(channels, 1);
    p += g.sign_bytes;
  }
  g.norm_offset = p;
  p += fp16_norms ? 2 : 4;
  if (qjl) {
    g.residual_offset = p;
    p += fp16_norms ? 2 : 4;
  }
  g.bytes = p - offset;
  return g;
}

}  // namespace

int RecipeHighChannels(RecipeKind recipe, int dim) {
  double ratio = recipe == RecipeKind::kTurboQuant25 ? 0.25 : 0.5;
  // Round half to even, as the reference writer's Python round() does (and as
  // HighPrecisionChannelCount in metadata.h): 80·0.5/16 = 2.5 → 2 groups of 16.
  return static_cast<int>(std::nearbyint(dim * ratio / 16.0)) * 16;
}

std::string RecipeName(RecipeKind r) {
  switch (r) {
    case RecipeKind::kTurboQuant25: return "turboquant25";
    case RecipeKind::kTurboQuant35: return "turboquant35";
    case RecipeKind::kNone: break;
  }
  return "none";
}

absl::StatusOr<RowLayout> MakeRowLayout(const ComponentSpec& spec, int dim) {
  if (dim < 8) return absl::InvalidArgumentError(absl::StrCat("head dim ", dim, " < 8"));
  RowLayout layout;
  layout.spec = spec;
  layout.dim = dim;
  switch (spec.kind) {
    case ComponentSpec::Kind::kDense:
      layout.row_bytes = 2 * static_cast<size_t>(dim);
      return layout;
    case ComponentSpec::Kind::kMse:
      if (!ValidBits(spec.bits))
        return absl::InvalidArgumentError(
            absl::StrCat("unsupported bits ", spec.bits, " (supported: 2, 3, 4, 5, 8)"));
      if (spec.qjl && spec.bits < 2)
        return absl::InvalidArgumentError("QJL needs at least 2 bits (1 mse + 1 sign)");
      layout.groups.push_back(MakeGroup(dim, spec.bits, spec.qjl, false, 0));
      break;
    case ComponentSpec::Kind::kRecipe: {
      if (dim % 16 != 0)
        return absl::InvalidArgumentError(
            absl::StrCat(RecipeName(spec.recipe), " needs a head dim that is a multiple of 16, got ", dim));
      int high = RecipeHighChannels(spec.recipe, dim);
      if (high <= 0 || high >= dim)
        return absl::InvalidArgumentError(absl::StrCat(
            RecipeName(spec.recipe), " leaves an empty channel group at head dim ", dim));
      int hb = spec.recipe == RecipeKind::kTurboQuant25 ? 3 : 4;
      int lb = hb - 1;
      layout.groups.push_back(MakeGroup(high, hb, spec.qjl, true, 0));
      layout.groups.push_back(MakeGroup(dim - high, lb, spec.qjl, true, layout.groups[0].bytes));
      break;
    }
  }
  for (const GroupLayout& g : layout.groups) layout.row_bytes += g.bytes;
  return layout;
}

absl::StatusOr<Format> ParseFormat(const std::string& raw) {
  std::string n = raw;
  absl::AsciiStrToLower(&n);
  auto mse = [](int b) {
    ComponentSpec s;
    s.kind = ComponentSpec::Kind::kMse;
    s.bits = b;
    s.qjl = false;
    return s;
  };
  auto recipe = [](RecipeKind r, bool qjl) {
    ComponentSpec s;
    s.kind = ComponentSpec::Kind::kRecipe;
    s.recipe = r;
    s.qjl = qjl;
    s.bits = 0;
    return s;
  };
  Format f;
  if (n == "tq4" || n == "tq4_kv" || n == "k4v4") {
    f = {"k4v4", mse(4), mse(4)};
  } else if (n == "fp16" || n == "dense") {
    ComponentSpec d;
    d.kind = ComponentSpec::Kind::kDense;
    d.bits = 16;
    f = {"fp16", d, d};
  } else if (n == "turboquant25" || n == "turboquant35" || n == "turboquant25_noqjl" ||
             n == "turboquant35_noqjl") {
    RecipeKind r = n.starts_with("turboquant25") ? RecipeKind::kTurboQuant25
                                                  : RecipeKind::kTurboQuant35;
    bool qjl = !n.ends_with("_noqjl");
    f = {n, recipe(r, qjl), recipe(r, qjl)};
  } else {
    // Exactly "k{b}v{b}" or "tq{b}", one digit each: no signs, spaces,
    // leading zeros or trailing bytes.
    auto digit = [](char c) { return c >= '0' && c <= '9' ? c - '0' : -1; };
    const int kb = n.size() == 4 && n[0] == 'k' && n[2] == 'v' ? digit(n[1])
                   : n.size() == 3 && n.starts_with("tq")       ? digit(n[2])
                                                                 : -1;
    const int vb = n.size() == 4 ? digit(n[3]) : kb;
    if (n.size() == 4 && ValidBits(kb) && ValidBits(vb)) {
      f = {absl::StrCat("k", kb, "v", vb), mse(kb), mse(vb)};
    } else if (n.size() == 3 && ValidBits(kb)) {
      f = {absl::StrCat("k", kb, "v", kb), mse(kb), mse(kb)};
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown cache format '", raw,
          "' (expected tq4, tq4_kv, k4v4, tq{b}, k{b}v{b} with b in 2,3,4,5,8, turboquant25, "
          "turboquant35, turboquant25_noqjl, turboquant35_noqjl or fp16)"));
    }
  }
  return f;
}

std::vector<std::string> AllFormatNames() {
  std::vector<std::string> names;
  const int bits[] = {2, 3, 4, 5, 8};
  for (int k : bits)
    for (int v : bits) names.push_back(absl::StrCat("k", k, "v", v));
  for (const char* r :
       {"turboquant25", "turboquant35", "turboquant25_noqjl", "turboquant35_noqjl", "fp16"})
    names.push_back(r);
  return names;
}

}  // namespace tqkv
