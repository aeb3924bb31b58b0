// CpuBackend: ComputeBackend on the host, using the codec reference code and
// a thread pool. Always available; the server's default without a GPU.
#ifndef TQKV_CODEC_CPU_BACKEND_H_
#define TQKV_CODEC_CPU_BACKEND_H_

#include <memory>

#include "codec/backend.h"
#include "codec/thread_pool.h"

namespace tqkv {

class CpuBackend : public ComputeBackend {
 public:
  struct Options {
    // Worker threads besides the caller; -1 means hardware_concurrency − 1.
    int threads = -1;
  };
  explicit CpuBackend(const Options& options);

  std::string name() const override { return "cpu"; }
  absl::Status EncodeBlock(const ModelCodec& codec, int first, int last,
                           const std::vector<DenseView>& k, const std::vector<DenseView>& v,
                           uint8_t* out) override;
  absl::Status DecodeBlock(const ModelCodec& codec, int first, int last, const uint8_t* payload,
                           const std::vector<MutableDenseView>& k,
                           const std::vector<MutableDenseView>& v) override;
  absl::Status Attend(const ModelCodec& codec, const AttendBatch& batch) override;

 private:
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace tqkv

#endif  // TQKV_CODEC_CPU_BACKEND_H_
