// ComputeBackend: the seam between storage/service and the compute that
// encodes, decodes and attends over packed blocks. Implemented on the CPU in
// codec/ (CpuBackend) and on the GPU in gpu/ (CudaBackend).
//
// All pointers passed in and out are HOST memory. A backend may keep device
// copies of blocks and tails: BlockRef::id identifies a block's bytes for
// the life of the process (a new put of the same key gets a new id), and
// AttendSequence::tail_id a dense tail's rows, so a backend can cache them
// and must call nothing back into storage. Block ids, tail ids and
// sequence keys are distinct.
#ifndef TQKV_CODEC_BACKEND_H_
#define TQKV_CODEC_BACKEND_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec/attention.h"
#include "codec/model_codec.h"
#include "codec/tensor.h"

namespace tqkv {

struct BlockRef {
  uint64_t id = 0;                  // unique per block version
  const uint8_t* payload = nullptr; // ModelCodec::block_bytes() bytes
  // True: every layer's bytes are final (a stored block). False: a block
  // a sequence fills layer by layer as its tails pack; an Attend at layer l
  // lists it only once layer l is final, and its other layers may still
  // change, so a caching backend copies it layer by layer.
  bool complete = true;
};

// One stored sequence seen by one layer's attention.
struct AttendSequence {
  absl::Span<const BlockRef> blocks;  // in order; the last may be partially used (valid for the call)
  int64_t packed_tokens = 0;     // tokens in blocks
  DenseView tail_k, tail_v;      // dense recent tokens after them (this layer)
  // Optional (0: none) identity of the tail's rows: under one tail_id the
  // rows only grow (rows once given never change), so a caching backend
  // copies only the rows it has not seen. Retired through Forget(tail_id).
  uint64_t tail_id = 0;
  // Optional (0: none) identity of the sequence across calls: under one
  // key, the block lists of any two calls (at any layers) agree on their
  // common prefix, so a backend may keep the list's device slots and look
  // up only blocks past them. Retired through Forget(sequence_key).
  uint64_t sequence_key = 0;
  // This sequence's queries (rows [query_offsets[i], query_offsets[i+1])
  // of the batch) and where their outputs go, both [num_queries, q_heads,
  // d] in `dtype` (fp32, fp16 or bf16): a service passes its wire bytes
  // straight through, and the backend converts where its kernels need to.
  const void* q = nullptr;
  void* out = nullptr;
  DType dtype = DType::kF32;
};

// A block's layer to encode as part of an Attend (AttendBatch::packs): a
// layer that a sequence's tail (or its new rows) just filled.
struct PackItem {
  DenseView k, v;          // the layer's block_size rows [block_size, kv_heads, d]
  uint8_t* out = nullptr;  // receives the layer's packed bytes (layer_range_bytes(l, l + 1))
  uint64_t block_id = 0;   // the BlockRef::id a sequence of the batch lists the block under
};

// A batch of attention work on one layer. Sequence i has the queries
// [query_offsets[i], query_offsets[i+1]) (AttendSequence::q); each has an
// absolute position (decode: total_tokens − 1).
struct AttendBatch {
  int layer = 0;
  AttentionShape shape;
  std::vector<AttendSequence> sequences;
  std::vector<int64_t> query_offsets;  // size sequences.size() + 1
  std::vector<int64_t> positions;      // per query
  // Optional: layers to encode first, at `layer` (the bytes EncodeBlocks
  // writes for them), each into `out` and into the block as its sequence
  // attends it in this call (the block is listed being filled, BlockRef::
  // complete false, its layer `layer` not yet in its payload). A GPU
  // encodes them into its device copy of the block in the same pass. The
  // rows must stay valid for the call; `out` is written when Attend returns
  // OK (on an error, some may be).
  std::vector<PackItem> packs;
  // Optional: receives the device time of the attention kernels in
  // microseconds (GPU events); 0 where the backend has no device.
  double* device_micros = nullptr;
};

// Points sequence i's q and out at rows [query_offsets[i], ...) of the
// contiguous fp32 buffers `q` and `out` ([total queries, q_heads, d]).
// REQUIRES: query_offsets and shape set.
void PointAtContiguousF32(AttendBatch& batch, const float* q, float* out);

// Dense K/V in the GPU memory of another process on this host, shared by
// CUDA IPC (proto DeviceKv): for block slot s, layer i of a call's range,
// token t and kv head h, the head_dim elements of K start at byte
// layers[i].k_offset + s·block_stride + t·token_stride + h·head_stride of
// allocation ipc_handles[layers[i].k_buffer], V likewise.
struct DeviceKvRef {
  struct Layer {
    uint32_t k_buffer = 0;
    uint64_t k_offset = 0;
    uint32_t v_buffer = 0;
    uint64_t v_offset = 0;
  };
  std::vector<std::string> ipc_handles;  // cudaIpcMemHandle_t bytes (kIpcHandleBytes each)
  std::vector<Layer> layers;             // one per layer of the range
  DType dtype = DType::kF16;
  uint64_t block_stride = 0, token_stride = 0, head_stride = 0;
};
inline constexpr size_t kIpcHandleBytes = 64;

// A block of EncodeDeviceBlocks: its slot in the source, its tokens
// (1..block_size) and where its packed layer range goes (host memory).
struct DeviceEncodeItem {
  uint64_t slot = 0;
  int64_t tokens = 0;
  uint8_t* out = nullptr;
};
// A block of DecodeDeviceBlocks: its packed layer range (host memory) and
// the slot it is decoded into (block_size tokens).
struct DeviceDecodeItem {
  const uint8_t* payload = nullptr;
  uint64_t slot = 0;
};

// The checks every backend applies to a device call (INVALID_ARGUMENT
// naming the field): handles of kIpcHandleBytes, one layer entry per
// layer of [first, last) naming a handle, strides that keep a block's
// rows and heads apart, slots under 2^40, tokens in [1, block_size].
absl::Status ValidateDeviceKv(const ModelCodec& codec, int first, int last, const DeviceKvRef& ref);

struct BackendStats {
  uint64_t device_bytes_capacity = 0;  // GPU tier arena size (0 on CPU)
  uint64_t device_bytes_used = 0;      // packed bytes resident on the device
  uint64_t device_blocks = 0;
  uint64_t uploads = 0;                // blocks promoted host → device
  uint64_t evictions = 0;              // blocks demoted (dropped) from device
  uint64_t host_pinned_bytes = 0;      // of the host arena (UseHostArena) pinned so far
  std::string host_pinning_error;      // why pinning the host arena stopped short (empty: it did not)
};

// Argument checks every backend applies (INVALID_ARGUMENT naming the field).
absl::Status ValidateEncodeArgs(const ModelCodec& codec, int first, int last,
                                const std::vector<DenseView>& k, const std::vector<DenseView>& v);
absl::Status ValidateDecodeArgs(const ModelCodec& codec, int first, int last,
                                const std::vector<MutableDenseView>& k, const std::vector<MutableDenseView>& v);
absl::Status ValidateAttendBatch(const ModelCodec& codec, const AttendBatch& batch);

// Thread safety: every method may be called concurrently.
class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;
  // "cpu" or "cuda".
  virtual std::string name() const = 0;

  // Encodes layers [first, last) of one block: k[i], v[i] are the dense
  // [block_size, kv_heads, d] tensors of layer first+i (fewer tokens than
  // block_size allowed only via `tokens`; remaining rows are zero-filled).
  // Writes the layers' K/V pages into `out` (which points at the block's
  // layer `first` offset, layer_range_bytes(first, last) bytes).
  virtual absl::Status EncodeBlock(const ModelCodec& codec, int first, int last,
                                   const std::vector<DenseView>& k, const std::vector<DenseView>& v,
                                   uint8_t* out) = 0;

  // One block of EncodeBlocks: k, v and out as EncodeBlock takes them.
  struct EncodeItem {
    std::vector<DenseView> k, v;
    uint8_t* out = nullptr;
  };
  // Encodes layers [first, last) of several blocks: the bytes EncodeBlock
  // writes for each, in one batch where the backend can (a GPU: one upload,
  // one launch per layer, one download). On an error some outputs may be
  // written, others not. Default: EncodeBlock of each.
  virtual absl::Status EncodeBlocks(const ModelCodec& codec, int first, int last,
                                    std::span<const EncodeItem> items) {
    for (const EncodeItem& item : items) {
      absl::Status s = EncodeBlock(codec, first, last, item.k, item.v, item.out);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Decodes layers [first, last) of a block payload (pointing at layer
  // `first`) into dense tensors k[i], v[i] of `block_size` tokens.
  virtual absl::Status DecodeBlock(const ModelCodec& codec, int first, int last,
                                   const uint8_t* payload, const std::vector<MutableDenseView>& k,
                                   const std::vector<MutableDenseView>& v) = 0;

  // One block of DecodeBlocks: payload, k and v as DecodeBlock takes them.
  struct DecodeItem {
    const uint8_t* payload = nullptr;
    std::vector<MutableDenseView> k, v;
  };
  // Decodes layers [first, last) of several blocks: the values DecodeBlock
  // writes for each, in one batch where the backend can. Default:
  // DecodeBlock of each.
  virtual absl::Status DecodeBlocks(const ModelCodec& codec, int first, int last,
                                    std::span<const DecodeItem> items) {
    for (const DecodeItem& item : items) {
      absl::Status s = DecodeBlock(codec, first, last, item.payload, item.k, item.v);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // EncodeBlocks of dense K/V that lie in another process's GPU memory on
  // this host (CUDA IPC): item b's layers [first, last) from slot
  // items[b].slot of `src`, its packed bytes into items[b].out. Every byte
  // read must lie in the exported allocations (INVALID_ARGUMENT
  // otherwise). FAILED_PRECONDITION where the backend cannot map the
  // memory (default: a backend without a GPU).
  virtual absl::Status EncodeDeviceBlocks(const ModelCodec& codec, int first, int last, const DeviceKvRef& src,
                                          std::span<const DeviceEncodeItem> items);
  // DecodeBlocks into another process's GPU memory: item b's layers
  // [first, last), block_size tokens each, into slot items[b].slot of
  // `dst`, in dst.dtype. Errors as EncodeDeviceBlocks.
  virtual absl::Status DecodeDeviceBlocks(const ModelCodec& codec, int first, int last,
                                          std::span<const DeviceDecodeItem> items, const DeviceKvRef& dst);

  // Attention over stored sequences for one layer.
  virtual absl::Status Attend(const ModelCodec& codec, const AttendBatch& batch) = 0;

  // Tells a caching backend that a block id, tail id or sequence key will
  // never be used again, or (for a block being filled layer by layer) that
  // its cached copy may be stale: a later use uploads it anew.
  virtual void Forget(uint64_t id) { (void)id; }

  virtual BackendStats Stats() const { return {}; }

  // The host tier's memory (storage::HostArena): a backend that moves
  // blocks between host and device may pin [base, base + bytes), in the
  // background, and then copy the blocks that lie in it by DMA, with no
  // staging copy. Called at most once. REQUIRES: the range stays mapped
  // until the backend is destroyed. Default: nothing to do.
  virtual absl::Status UseHostArena(uint8_t* base, size_t bytes) {
    (void)base;
    (void)bytes;
    return absl::OkStatus();
  }
};

}  // namespace tqkv

#endif  // TQKV_CODEC_BACKEND_H_
