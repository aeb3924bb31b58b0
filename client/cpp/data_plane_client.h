// DataPlaneClient: bulk reads (packed or dense), puts, Attend and Append, over tqkv's data
// plane (TCP next to gRPC, TLS when options.tls is set; wire format in
// proto/tqkv/v1/tqkv.proto, "Data plane").
// One blocking connection, like a Redis client: a call writes one request
// frame and reads its reply into a caller-reusable buffer.
//
// Errors are absl::Status with the server's code and message (the same codes
// as gRPC GetBlocks). A broken connection or a timeout gives UNAVAILABLE /
// DEADLINE_EXCEEDED and closes the socket; the next call reconnects.
//
// Thread safety: not thread-safe; use one client per thread.
#ifndef TQKV_CLIENT_CPP_DATA_PLANE_CLIENT_H_
#define TQKV_CLIENT_CPP_DATA_PLANE_CLIENT_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cpp/tls_stream.h"
#include "proto/tqkv/v1/tqkv.pb.h"

namespace tqkv::client {

struct DataPlaneClientOptions {
  // The server's data-plane address HOST:PORT (printed by tqkv-server as
  // "data plane listening on"), or unix:PATH for its Unix-domain socket on
  // this host (--data_socket; no TLS there). Required.
  std::string target;
  // Bearer token when the server has auth on; empty: none. Default: empty.
  std::string token;
  // Longest wait for one send or receive step of a call. Default: 30 s.
  absl::Duration timeout = absl::Seconds(30);
  // Largest reply header accepted (the DataPlaneReply message). Default: 64 MiB.
  uint32_t max_header_bytes = 64u << 20;
  // TLS (set tls.ca_file; with a client certificate for mutual TLS): a
  // server with TLS accepts nothing else. Default: plain TCP.
  ClientTlsOptions tls;
  // Frames with raw payloads (preface TQKVDP02): put streams send their
  // tensors beside the messages, and the raw Attend/Append overloads work.
  // false: TQKVDP01 frames, everything inside the messages (servers that
  // predate raw payloads); the raw overloads are FAILED_PRECONDITION.
  // Default: true.
  bool raw_payloads = true;
  // How long a call polls its socket for the reply before sleeping in
  // recv. A decode worker that waits on each layer's reply anyway saves the
  // thread's wake-up (a core stays busy while it waits; plain TCP only).
  // Default: 0 (sleeps at once).
  absl::Duration reply_poll = absl::ZeroDuration();
  // With a unix: target, this many bytes of memory shared with the server
  // (a sealed memfd passed at connect; proto "Same-host shared memory"):
  // raw payloads that fit go through it instead of the socket, and so do
  // the replies' payloads (Attend outputs, read blocks) that fit what is
  // left. A frame of a put stream gets an eighth of it (up to 8 are in
  // flight). INVALID_ARGUMENT at connect with a TCP target; the server's
  // error if it refuses. Default: 0 (none).
  size_t shared_memory_bytes = 0;
  // With at least 192 KiB shared: raw Attend and Append calls go through a
  // doorbell in that memory (proto "Doorbell"), crossing no socket while
  // the server polls (--data_busy_poll); the client spins for reply_poll,
  // then sleeps on a futex until the reply. Default: false.
  bool doorbell = false;
};

// The reply to one GetBlocks: block i's packed bytes are payload(i).
// Reusing one object across calls reuses its buffer.
class DataPlaneBlocks {
 public:
  const v1::DataPlaneReply& reply() const { return reply_; }
  size_t size() const { return static_cast<size_t>(reply_.blocks_size()); }
  // Valid until the next call that fills this object.
  std::string_view payload(size_t i) const {
    return {buf_.get() + offsets_[i], static_cast<size_t>(reply_.blocks(static_cast<int>(i)).payload_bytes())};
  }
  uint64_t payload_bytes() const { return payload_bytes_; }

 private:
  friend class DataPlaneClient;
  v1::DataPlaneReply reply_;
  std::unique_ptr<char[]> buf_;
  size_t capacity_ = 0;
  uint64_t payload_bytes_ = 0;
  std::vector<uint64_t> offsets_;
};

class DataPlaneClient {
 public:
  // Connects (with TLS: handshakes) and sends the preface. UNAVAILABLE if
  // the server cannot be reached or the TLS handshake fails (OpenSSL's
  // reason in the message), INVALID_ARGUMENT for a malformed target or TLS
  // files that do not load (TlsStream::Connect).
  static absl::StatusOr<std::unique_ptr<DataPlaneClient>> Connect(
      const DataPlaneClientOptions& options);
  ~DataPlaneClient();
  DataPlaneClient(const DataPlaneClient&) = delete;
  DataPlaneClient& operator=(const DataPlaneClient&) = delete;

  // Bytes of memory shared with the server (0: none).
  size_t shared_memory_bytes() const { return shared_.size; }
  // Calls that went through the doorbell (options.doorbell).
  uint64_t doorbell_calls() const { return doorbell_calls_; }

  // The blocks of `req` into *out: all of them, in request order, or the
  // server's error (nothing in *out is valid then). Packed: payload(i) is
  // block i's layer range. Dense (req.dense): payload(i) is its K then its V
  // tensor, [layers, block_size, kv_heads, head_dim] of req.dense_dtype
  // each, decoded by the server's backend. With req.device_out the blocks
  // are decoded into that same-host GPU memory instead and payload(i) is
  // empty. `with_format`: also fill out->reply().format().
  absl::Status GetBlocks(const v1::GetBlocksRequest& req, DataPlaneBlocks* out,
                         bool with_format = false);
  // KvStore.Attend over the data plane: same request, response and errors
  // (items may carry new tokens: append, then attend, in one call).
  absl::StatusOr<v1::AttendResponse> Attend(const v1::AttendRequest& req);
  // The same, with the tensors beside the request (the data plane's raw
  // payloads: no protobuf copies of queries, new K/V or outputs). `req`'s
  // tensors carry dtype and shape with empty data; `inputs` hold their
  // bytes in request order (per item q, then k and v when set), back to
  // back across the spans (at least one byte). The outputs are received into `out`, back to
  // back in item order (they have their queries' sizes: `out` must be
  // that large, else INVALID_ARGUMENT before anything is sent); the
  // response's output tensors carry dtype and shape only.
  absl::StatusOr<v1::AttendResponse> Attend(const v1::AttendRequest& req,
                                            std::span<const std::span<const char>> inputs, std::span<char> out);
  // KvStore.Append over the data plane: same request, response and errors.
  absl::StatusOr<v1::AppendResponse> Append(const v1::AppendRequest& req);
  // The same, with k and v beside the request (raw payloads, as Attend's):
  // `inputs` hold the bytes of the tensors with empty data, k then v.
  absl::StatusOr<v1::AppendResponse> Append(const v1::AppendRequest& req,
                                            std::span<const std::span<const char>> inputs);
  // KvStore.PutBlocks over the data plane, as one two-phase stream: the
  // header, the blocks in frames of about `frame_bytes` (up to 8 frames in
  // flight), then the commit. Returns the commit's response (as gRPC
  // PutBlocks'), or the first error with nothing committed. `blocks` are
  // moved into the frames, their tensors and packed payloads sent as the
  // frames' raw payloads (no copy of them in user space). With `device`,
  // every frame carries it and the blocks name slots of it
  // (PutBlock.device_slot/device_tokens; proto "Same-host GPU memory"):
  // the server encodes from that GPU memory, FAILED_PRECONDITION where it
  // cannot (then send the tensors instead).
  absl::StatusOr<v1::PutBlocksResponse> PutBlocks(const v1::PutHeader& header, std::vector<v1::PutBlock> blocks,
                                                  size_t frame_bytes = size_t{8} << 20,
                                                  const v1::DeviceKv* device = nullptr);

 private:
  explicit DataPlaneClient(const DataPlaneClientOptions& options) : options_(options) {}
  absl::Status EnsureConnected();
  // fd_ connected to the Unix-domain socket of target "unix:PATH"
  // (INVALID_ARGUMENT with TLS options: it has none).
  absl::Status OpenUnix(const std::string& path);
  // The connected fd_ made ready: options_.timeout, TLS (certificate name
  // `host`) when configured, the preface.
  absl::Status Ready(const std::string& host);
  // FAILED_PRECONDITION unless options_.raw_payloads.
  absl::Status NeedsRaw() const;
  // Sends *req (adding the token; `field`, `body` and `payload` as
  // SendFrame takes them) and receives its reply into *out, or its payload
  // into `into` when that is not empty (the reply's payload must be that
  // large).
  absl::Status Exchange(v1::DataPlaneRequest* req, DataPlaneBlocks* out, int field = 0,
                        const google::protobuf::MessageLite* body = nullptr,
                        std::span<const std::span<const char>> payload = {}, std::span<char> into = {});
  // Sends `req` as one frame (adding the token); a `body` (optional) is sent as its field
  // `field` without being copied into it (a protobuf field appended to a
  // serialized message is that message with the field set).
  // `payload`: the frame's raw payload, sent from the caller's memory.
  // With shared memory, a payload that fits `area` (default: all of it;
  // an index 0..7: that eighth) goes through it (the frame's `shared`).
  absl::Status SendFrame(v1::DataPlaneRequest* req, int field = 0,
                         const google::protobuf::MessageLite* body = nullptr,
                         std::span<const std::span<const char>> payload = {}, int area = -1);
  // Maps options_.shared_memory_bytes of a sealed memfd (once) and shares
  // it with the server over the fresh connection.
  absl::Status ShareMemory();
  // Serializes the frame SendFrame sends into frame_ (its payload through
  // the shared memory where it fits); returns the payload parts that must
  // follow it on the wire (empty: none).
  absl::StatusOr<std::span<const std::span<const char>>> BuildFrame(
      v1::DataPlaneRequest* req, int field, const google::protobuf::MessageLite* body,
      std::span<const std::span<const char>> payload, int area = -1);
  // Exchange's call through the doorbell (*rang), or nothing done (!*rang:
  // it does not fit the doorbell; send it on the socket).
  absl::Status RingDoorbell(v1::DataPlaneRequest* req, DataPlaneBlocks* out, int field,
                            const google::protobuf::MessageLite* body,
                            std::span<const std::span<const char>> payload, std::span<char> into, bool* rang);
  // Receives one reply that carries no payload into *reply, reading exactly
  // its bytes (replies of pipelined frames follow it); its status.
  absl::Status ReceiveBare(v1::DataPlaneReply* reply);
  absl::Status SendAll(const char* p, size_t n);
  // Sends the parts back to back (one sendmsg while the socket takes them).
  absl::Status SendParts(std::span<std::span<const char>> parts);
  // Receives into p[*have, cap) until *have >= want.
  absl::Status Recv(char* p, size_t cap, size_t want, size_t* have, int flags);
  // Returns once the socket is readable or options_.reply_poll has passed.
  void PollForReply();
  // The status of a send/recv that returned r <= 0 (errno set if r < 0).
  absl::Status Failed(ssize_t r, const char* op);
  // Failed for a send; a connection the server closed stays open for
  // reading its last replies (write_failed_) until the next call.
  absl::Status SendFailed(ssize_t w);
  // Closes the socket and returns `s` (an I/O failure leaves the stream in
  // an unknown state).
  absl::Status Broken(const absl::Status& s);

  const DataPlaneClientOptions options_;
  int fd_ = -1;
  // The memory shared with the server (options_.shared_memory_bytes).
  struct Shared {
    int fd = -1;
    uint8_t* base = nullptr;
    size_t size = 0;
  } shared_;
  uint32_t doorbell_seq_ = 0;  // the last request number rung
  uint64_t doorbell_calls_ = 0;
  std::unique_ptr<TlsStream> tls_;  // over fd_ when options_.tls is set
  bool write_failed_ = false;       // the server closed fd_; only reading is left
  std::string frame_;  // request scratch
  std::string head_;   // reply prefix + header (+ the payload's first bytes)
  DataPlaneBlocks scratch_;  // replies without payload (Attend, Append)
};

}  // namespace tqkv::client

#endif  // TQKV_CLIENT_CPP_DATA_PLANE_CLIENT_H_
