// InputBuffer: a connection's received, not yet parsed bytes, with room
// for the socket to read into directly (no intermediate copy). A frame
// whose length is known can be given room for all of it, so one frame is
// received into one contiguous run of bytes.
//
// Thread safety: none (one connection's event loop owns it).
#ifndef TQKV_SERVICE_INPUT_BUFFER_H_
#define TQKV_SERVICE_INPUT_BUFFER_H_

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>

namespace tqkv::service {

class InputBuffer {
 public:
  // The unparsed bytes.
  const char* data() const { return buf_.get() + begin_; }
  size_t size() const { return end_ - begin_; }

  // Room for at least `n` bytes after the unparsed ones: the unparsed
  // bytes move to the front, or to a larger buffer (never smaller than
  // twice the old one, so a frame arriving piecewise costs amortised O(1)
  // moves per byte).
  std::span<char> Spare(size_t n) {
    if (capacity_ - end_ < n) {
      const size_t have = size();
      if (capacity_ < have + n) {
        const size_t grown = std::max(have + n, 2 * capacity_);
        auto bigger = std::make_unique_for_overwrite<char[]>(grown);
        if (have > 0) std::memcpy(bigger.get(), data(), have);
        buf_ = std::move(bigger);
        capacity_ = grown;
      } else if (have > 0) {
        std::memmove(buf_.get(), data(), have);
      }
      begin_ = 0;
      end_ = have;
    }
    return {buf_.get() + end_, capacity_ - end_};
  }
  // `n` bytes were written at the start of Spare()'s span.
  void Commit(size_t n) { end_ += n; }
  // The first `n` unparsed bytes were parsed.
  void Consume(size_t n) {
    begin_ += n;
    if (begin_ == end_) begin_ = end_ = 0;
  }
  void Clear() { begin_ = end_ = 0; }
  size_t capacity() const { return capacity_; }

 private:
  std::unique_ptr<char[]> buf_;
  size_t capacity_ = 0;
  size_t begin_ = 0, end_ = 0;
};

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_INPUT_BUFFER_H_
