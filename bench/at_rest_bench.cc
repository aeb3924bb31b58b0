// Encryption at rest's cost on the disk tier: durable puts of N blocks
// through BlockStore (each written to RocksDB, sealed or in clear), then,
// after reopening the store, reads of every block from disk; MB/s of
// payload and the sealed/clear ratio, measured in the same run.
//
// Usage: at_rest_bench [--blocks 2000] [--block_kib 64] [--dir /tmp]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "storage/at_rest_cipher.h"
#include "storage/block_store.h"

namespace {

using tqkv::storage::AtRestCipher;
using tqkv::storage::BlockKey;
using tqkv::storage::BlockStore;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "at_rest_bench: %s\n", what.c_str());
  std::exit(1);
}

struct Result {
  double put_mbs = 0, get_mbs = 0;
};

Result Run(const std::string& dir, const AtRestCipher* cipher, int blocks, size_t bytes) {
  std::filesystem::remove_all(dir);
  tqkv::storage::BlockStoreOptions o;
  o.host_capacity_bytes = uint64_t{64} << 20;
  o.disk_capacity_bytes = uint64_t{64} << 30;
  o.disk_path = dir;
  o.at_rest_cipher = cipher;
  std::string payload(bytes, '\0');
  uint64_t x = 88172645463325252ull;
  for (char& c : payload) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  tqkv::storage::BlockAccounting acc;
  acc.total_bytes = bytes;
  Result r;
  {
    auto s = BlockStore::Open(o);
    if (!s.ok()) Die(s.status().ToString());
    const auto t0 = Clock::now();
    for (int i = 0; i < blocks; ++i) {
      payload[0] = static_cast<char>(i), payload[1] = static_cast<char>(i >> 8);
      auto put = (*s)->Put({"acme", 1, "h" + std::to_string(i)}, "", acc, payload, {.durable = true});
      if (!put.ok()) Die(put.status().ToString());
    }
    r.put_mbs = blocks * bytes / 1e6 / std::chrono::duration<double>(Clock::now() - t0).count();
  }
  auto s = BlockStore::Open(o);  // host tier empty: every read comes from disk
  if (!s.ok()) Die(s.status().ToString());
  const auto t0 = Clock::now();
  for (int i = 0; i < blocks; ++i) {
    auto got = (*s)->Get({"acme", 1, "h" + std::to_string(i)});
    if (!got.ok() || got->payload->size() != bytes) Die("read failed");
  }
  r.get_mbs = blocks * bytes / 1e6 / std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int blocks = 2000;
  size_t kib = 64;
  std::string dir = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--blocks") blocks = std::stoi(v);
    else if (k == "--block_kib") kib = std::stoul(v);
    else if (k == "--dir") dir = v;
    else Die("unknown flag " + k);
  }
  auto cipher = AtRestCipher::FromString("1 " + std::string(64, '7'));
  if (!cipher.ok()) Die(cipher.status().ToString());
  const std::string path = dir + "/tqkv-at-rest-bench";
  Result clear{}, sealed{};
  for (int round = 0; round < 2; ++round) {  // interleaved; the second round counts
    clear = Run(path, nullptr, blocks, kib << 10);
    sealed = Run(path, cipher->get(), blocks, kib << 10);
  }
  std::filesystem::remove_all(path);
  std::printf("%d durable blocks of %zu KiB through BlockStore\n", blocks, kib);
  std::printf("durable put  clear %7.0f MB/s  sealed %7.0f MB/s  sealed/clear %.2fx\n", clear.put_mbs,
              sealed.put_mbs, sealed.put_mbs / clear.put_mbs);
  std::printf("disk read    clear %7.0f MB/s  sealed %7.0f MB/s  sealed/clear %.2fx\n", clear.get_mbs,
              sealed.get_mbs, sealed.get_mbs / clear.get_mbs);
  return 0;
}
