#include "service/convert.h"

#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codec/rotation.h"
#include "base/status_macros.h"

namespace tqkv::service {
namespace {

// Largest value a uint32 layout field may carry before the codec's own
// range checks (keeps the int conversion exact).
constexpr uint32_t kMaxLayoutField = 1u << 20;

absl::StatusOr<int> LayoutInt(uint32_t v, const char* field) {
  if (v > kMaxLayoutField)
    return absl::InvalidArgumentError(absl::StrCat("layout.", field, " ", v, " is too large"));
  return static_cast<int>(v);
}

std::string ShapeString(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

}  // namespace

absl::StatusOr<DType> FromProtoDType(v1::DType d, const char* field) {
  switch (d) {
    case v1::DTYPE_FP16: return DType::kF16;
    case v1::DTYPE_BF16: return DType::kBF16;
    case v1::DTYPE_FP32: return DType::kF32;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": dtype ", static_cast<int>(d), " is not one of fp16, bf16, fp32"));
  }
}

v1::DType ToProtoDType(DType d) {
  switch (d) {
    case DType::kF16: return v1::DTYPE_FP16;
    case DType::kBF16: return v1::DTYPE_BF16;
    case DType::kF32: return v1::DTYPE_FP32;
  }
  return v1::DTYPE_UNSPECIFIED;
}

v1::Tier ToProtoTier(storage::Tier t) {
  switch (t) {
    case storage::Tier::kGpu: return v1::TIER_GPU;
    case storage::Tier::kHost: return v1::TIER_HOST;
    case storage::Tier::kDisk: return v1::TIER_DISK;
  }
  return v1::TIER_UNSPECIFIED;
}

absl::StatusOr<ModelShape> ShapeFromLayout(const v1::ModelLayout& layout) {
  ModelShape s;
  TQ_ASSIGN_OR_RETURN(s.num_layers, LayoutInt(layout.num_layers(), "num_layers"));
  TQ_ASSIGN_OR_RETURN(s.num_kv_heads, LayoutInt(layout.num_kv_heads(), "num_kv_heads"));
  TQ_ASSIGN_OR_RETURN(s.num_q_heads, LayoutInt(layout.num_q_heads(), "num_q_heads"));
  TQ_ASSIGN_OR_RETURN(s.head_dim, LayoutInt(layout.head_dim(), "head_dim"));
  TQ_ASSIGN_OR_RETURN(s.block_size, LayoutInt(layout.block_size(), "block_size"));
  absl::Status st = ValidateShape(s);
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("layout: ", st.message()));
  if (layout.dtype() != v1::DTYPE_UNSPECIFIED) {
    TQ_RETURN_IF_ERROR(FromProtoDType(layout.dtype(), "layout.dtype").status());
  }
  return s;
}

absl::StatusOr<CodecOptions> OptionsFromCodecConfig(const v1::CodecConfig& config,
                                                    std::optional<RecipeMetadata>* metadata) {
  CodecOptions o;
  if (!config.cache_dtype().empty()) o.format = config.cache_dtype();
  for (const auto& [layer, name] : config.layer_cache_dtypes()) {
    if (layer > kMaxLayoutField)
      return absl::InvalidArgumentError(
          absl::StrCat("codec.layer_cache_dtypes: layer ", layer, " is too large"));
    o.layer_formats[static_cast<int>(layer)] = name;
  }
  if (config.dense_first_layers() > kMaxLayoutField || config.dense_last_layers() > kMaxLayoutField)
    return absl::InvalidArgumentError("codec.dense_first_layers/dense_last_layers too large");
  o.dense_first_layers = static_cast<int>(config.dense_first_layers());
  o.dense_last_layers = static_cast<int>(config.dense_last_layers());
  if (!config.rotation().empty()) {
    absl::StatusOr<RotationKind> r = ParseRotationKind(config.rotation());
    if (!r.ok())
      return absl::InvalidArgumentError(absl::StrCat("codec.rotation: ", r.status().message()));
    o.rotation = *r;
  }
  o.seed = config.rotation_seed();
  metadata->reset();
  if (!config.recipe_metadata_json().empty()) {
    absl::StatusOr<RecipeMetadata> m = ParseMetadataJson(config.recipe_metadata_json());
    if (!m.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("codec.recipe_metadata_json: ", m.status().message()));
    *metadata = std::move(*m);
  }
  return o;
}

v1::FormatDescriptor DescribeFormat(const ModelCodec& codec) {
  v1::FormatDescriptor f;
  const ModelShape& s = codec.shape();
  for (int l = 0; l < s.num_layers; ++l) {
    v1::FormatDescriptor::Layer* d = f.add_layers();
    d->set_cache_dtype(codec.layer(l).format().name);
    d->set_offset(codec.layer_offset(l));
    d->set_k_page_bytes(codec.k_page_bytes(l));
    d->set_v_page_bytes(codec.v_page_bytes(l));
    d->set_k_row_bytes(static_cast<uint32_t>(codec.layer(l).k_row_bytes()));
    d->set_v_row_bytes(static_cast<uint32_t>(codec.layer(l).v_row_bytes()));
  }
  f.set_block_bytes(codec.block_bytes());
  f.set_block_size(s.block_size);
  f.set_num_kv_heads(s.num_kv_heads);
  f.set_head_dim(s.head_dim);
  f.set_bit_order("lsb-first");
  return f;
}

const uint8_t* TensorPayload::Take(size_t n) {
  if (n > bytes_.size() - used_) return nullptr;
  const uint8_t* p = bytes_.data() + used_;
  used_ += n;
  return p;
}

absl::Status TensorPayload::Finish() const {
  if (used_ == bytes_.size()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("the frame's payload has ", bytes_.size(),
                                                 " bytes, its tensors use ", used_));
}

absl::StatusOr<DeviceKvRef> DeviceKvFromProto(const v1::DeviceKv& d, const char* field) {
  DeviceKvRef r;
  TQ_ASSIGN_OR_RETURN(r.dtype, FromProtoDType(d.dtype(), absl::StrCat(field, ".dtype").c_str()));
  r.ipc_handles.assign(d.ipc_handles().begin(), d.ipc_handles().end());
  for (const v1::DeviceKv::Layer& l : d.layers())
    r.layers.push_back({l.k_buffer(), l.k_offset(), l.v_buffer(), l.v_offset()});
  r.block_stride = d.block_stride();
  r.token_stride = d.token_stride();
  r.head_stride = d.head_stride();
  return r;
}

absl::StatusOr<TensorView> ViewTensor(const v1::Tensor& t, const char* field) {
  return ViewTensor(t, field, nullptr);
}

absl::StatusOr<TensorView> ViewTensor(const v1::Tensor& t, const char* field, TensorPayload* payload) {
  TensorView v;
  TQ_ASSIGN_OR_RETURN(v.dtype, FromProtoDType(t.dtype(), field));
  uint64_t elems = 1;
  for (int64_t d : t.shape()) {
    if (d < 0 || d > (int64_t{1} << 32))
      return absl::InvalidArgumentError(absl::StrCat(field, ": bad dimension ", d));
    if (d != 0 && elems > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d))
      return absl::InvalidArgumentError(absl::StrCat(field, ": shape overflows"));
    elems *= static_cast<uint64_t>(d);
    v.shape.push_back(d);
  }
  const uint64_t want = elems * DTypeSize(v.dtype);
  if (elems > (uint64_t{1} << 40))
    return absl::InvalidArgumentError(absl::StrCat(field, ": shape ", ShapeString(v.shape), " is too large"));
  if (payload != nullptr && t.data().empty()) {
    v.data = payload->Take(want);
    v.bytes = want;
    if (v.data == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(field, ": shape ", ShapeString(v.shape), " of ",
                                                     std::string(DTypeName(v.dtype)), " needs ", want,
                                                     " bytes, more than the frame's payload has left"));
    return v;
  }
  if (want != t.data().size())
    return absl::InvalidArgumentError(absl::StrCat(field, ": shape ", ShapeString(v.shape), " of ",
                                                   std::string(DTypeName(v.dtype)), " needs ", want,
                                                   " bytes, data has ", t.data().size()));
  v.data = reinterpret_cast<const uint8_t*>(t.data().data());
  v.bytes = t.data().size();
  return v;
}

absl::Status ExpectShape(const TensorView& t, const std::vector<int64_t>& expected,
                         const char* field) {
  bool ok = t.shape.size() == expected.size();
  for (size_t i = 0; ok && i < expected.size(); ++i)
    ok = expected[i] < 0 || expected[i] == t.shape[i];
  if (ok) return absl::OkStatus();
  std::vector<std::string> want;
  for (int64_t e : expected) want.push_back(e < 0 ? "*" : absl::StrCat(e));
  return absl::InvalidArgumentError(absl::StrCat(field, " has shape ", ShapeString(t.shape),
                                                 ", expected [", absl::StrJoin(want, ", "), "]"));
}

DenseView SliceView(const TensorView& t, int64_t outer, int64_t row0, int64_t tokens) {
  const size_t n = t.shape.size();
  const int64_t total = t.shape[n - 3];
  const int heads = static_cast<int>(t.shape[n - 2]);
  const int dim = static_cast<int>(t.shape[n - 1]);
  const size_t row_bytes = static_cast<size_t>(heads) * dim * DTypeSize(t.dtype);
  const uint8_t* p = t.data + (static_cast<size_t>(outer) * total + row0) * row_bytes;
  return DenseView{p, t.dtype, tokens, heads, dim};
}

absl::Status CheckHashList(const google::protobuf::RepeatedPtrField<std::string>& hashes,
                           size_t max_count, const char* field) {
  if (static_cast<size_t>(hashes.size()) > max_count)
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", hashes.size(), " entries; at most ", max_count, " allowed"));
  absl::flat_hash_set<std::string> seen;
  for (int i = 0; i < hashes.size(); ++i) {
    absl::Status s = storage::ValidateBlockHash(hashes[i]);
    if (!s.ok())
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: ", s.message()));
    if (!seen.insert(hashes[i]).second)
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: duplicate hash ", Hex(hashes[i])));
  }
  return absl::OkStatus();
}

std::string Hex(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

}  // namespace tqkv::service
