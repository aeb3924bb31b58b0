// Conversions between the wire types (tqkv.v1 protobuf messages) and the
// codec/storage value types. Protobuf types stop at service/: everything
// below this file speaks ModelShape, CodecOptions, DenseView and Tier.
//
// Every function is pure and thread-compatible. Errors are INVALID_ARGUMENT
// naming the offending field unless stated otherwise.
#ifndef TQKV_SERVICE_CONVERT_H_
#define TQKV_SERVICE_CONVERT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "codec/backend.h"
#include "codec/dtype.h"
#include "codec/metadata.h"
#include "codec/model_codec.h"
#include "codec/tensor.h"
#include "proto/tqkv/v1/tqkv.pb.h"
#include "storage/block_key.h"

namespace tqkv::service {

// DTYPE_FP16/BF16/FP32 → DType. INVALID_ARGUMENT naming `field` for
// DTYPE_UNSPECIFIED or an unknown value.
absl::StatusOr<DType> FromProtoDType(v1::DType d, const char* field);
v1::DType ToProtoDType(DType d);

v1::Tier ToProtoTier(storage::Tier t);

// ModelLayout → ModelShape, validated (codec ValidateShape).
absl::StatusOr<ModelShape> ShapeFromLayout(const v1::ModelLayout& layout);

// CodecConfig → CodecOptions (empty cache_dtype means "k4v4"; rotation ""
// means the codec default). Parses recipe_metadata_json when non-empty into
// *metadata (set to nullopt otherwise).
absl::StatusOr<CodecOptions> OptionsFromCodecConfig(const v1::CodecConfig& config,
                                                    std::optional<RecipeMetadata>* metadata);

// The FormatDescriptor of a codec's block layout. Offsets are within the
// whole block; a layer-range payload starts at layers[first_layer].offset.
v1::FormatDescriptor DescribeFormat(const ModelCodec& codec);

// DeviceKv → DeviceKvRef (dtype checked; the backend checks the rest:
// ValidateDeviceKv). INVALID_ARGUMENT naming `field`.
absl::StatusOr<DeviceKvRef> DeviceKvFromProto(const v1::DeviceKv& d, const char* field);

// A validated view of a wire Tensor: dtype known, shape dims non-negative,
// and data exactly prod(shape) · sizeof(dtype) bytes. The view aliases the
// message's bytes: valid while `t` is alive and unmodified.
struct TensorView {
  DType dtype = DType::kF16;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
};
absl::StatusOr<TensorView> ViewTensor(const v1::Tensor& t, const char* field);

// Tensor bytes that travel beside a request instead of inside it (the data
// plane's raw payloads, proto "Data plane"): ViewTensor(t, field, payload)
// takes the bytes of a tensor whose `data` is empty from here, the next
// prod(shape) · sizeof(dtype) of them, so the tensors read in request order
// lie back to back. A request must use all of it (Finish).
class TensorPayload {
 public:
  explicit TensorPayload(absl::Span<const uint8_t> bytes) : bytes_(bytes) {}
  // The next `n` bytes, or nullptr when fewer are left.
  const uint8_t* Take(size_t n);
  // INVALID_ARGUMENT unless every byte was taken.
  absl::Status Finish() const;

 private:
  absl::Span<const uint8_t> bytes_;
  size_t used_ = 0;
};
// As above; a tensor with empty data takes its bytes from `payload` (when
// not null). The view aliases the payload then.
absl::StatusOr<TensorView> ViewTensor(const v1::Tensor& t, const char* field, TensorPayload* payload);

// INVALID_ARGUMENT "<field> has shape [..], expected [..]" unless
// t.shape == expected, where a -1 entry in `expected` matches any size.
absl::Status ExpectShape(const TensorView& t, const std::vector<int64_t>& expected,
                         const char* field);

// A [tokens, heads, dim] DenseView of rows [row0, row0 + tokens) of the
// leading index `outer` of a tensor shaped [outer, tokens_total, heads, dim]
// (or, for 3-d tensors, [tokens_total, heads, dim] with outer == 0).
DenseView SliceView(const TensorView& t, int64_t outer, int64_t row0, int64_t tokens);

// Checks a list of block hashes: each 1..64 bytes, no duplicates, at most
// `max_count` entries. `field` names the repeated field in errors.
absl::Status CheckHashList(const google::protobuf::RepeatedPtrField<std::string>& hashes,
                           size_t max_count, const char* field);

// Lower-case hex of bytes (for messages and ids).
std::string Hex(const std::string& bytes);

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_CONVERT_H_
