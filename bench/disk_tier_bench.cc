// The disk tier at scale, through BlockStore (no server): for each index
// size N, a store whose host tier holds a few thousand blocks is filled with
// N blocks (all but the newest spill to RocksDB); then Lookups of 1,000-hash
// chains walk the disk range (each hit refreshes that block's place in the
// LRU, as a cache's readers do); then further puts, each of which spills an
// old host block. It prints fill and spill throughput, the Lookup latency,
// and the spill throughput after the Lookups at each N against the smallest
// N measured in the same run (eviction work per block must not grow with
// the index or with what was looked up). Then the store is closed and
// reopened on the same directory, its index loading in the background as
// the server's does: the time to reopen, to the first Lookup hit (a chain
// from a random place) and Get, and until the index is complete, the
// process's RSS at each point, and the rate of Gets of
// random disk blocks, read cold (the store's files are dropped from the
// page cache first). Baselines in the same run, on the same file system:
// a file of the fill's bytes written in 1 MiB writes and fdatasync'd (the
// fill's spill rate compares with it), and as many random block-sized reads
// of it, cold, as the Gets make.
//
// With --shutdown_mib M (after the sizes; `--sizes ""` for none): a graceful
// shutdown of a host tier holding M MiB (ShutdownRun).
//
// Usage: disk_tier_bench [--sizes 10000,1000000] [--block_bytes 1024]
//                        [--host_blocks 4096] [--lookups 300] [--spills 20000]
//                        [--dir /tmp] [--background_index 1]
//                        [--shutdown_mib 0] [--shutdown_block_bytes 262144]
//                        [--shutdown_deadline_s 30] [--shutdown_write_behind_pct 0]
#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "base/malloc_tuning.h"
#include "bench/latency.h"
#include "client/cli/args.h"
#include "storage/block_store.h"

namespace tqkv {
namespace {

using bench::Clock;
using bench::Micros;
using bench::Percentile;

std::string Hash(int64_t i) {
  std::string h(16, '\0');
  for (int b = 0; b < 8; ++b) h[b] = static_cast<char>((i >> (8 * b)) & 0xff);
  h[15] = 'h';
  return h;
}

struct Result {
  double fill_per_s = 0, spill_per_s = 0, lookup_p50 = 0, lookup_p99 = 0;
};

// Drops every file under `dir` from the page cache (after syncing it), so
// the next reads come from the device.
void DropFromPageCache(const std::string& dir) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

// The device under `dir`: MB/s of writing `bytes` in 1 MiB writes and
// fdatasync, then of `reads` cold random reads of `block` bytes.
std::pair<double, double> RawDevice(const std::string& dir, uint64_t bytes, int64_t block, int64_t reads) {
  const std::string path = dir + "/raw_device_baseline";
  const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR, 0600);
  if (fd < 0) return {0, 0};
  std::string chunk(1 << 20, 'r');
  auto t0 = Clock::now();
  for (uint64_t done = 0; done < bytes; done += chunk.size())
    if (write(fd, chunk.data(), chunk.size()) != static_cast<ssize_t>(chunk.size())) break;
  fdatasync(fd);
  const double write_mb_s = bytes / (Micros(t0, Clock::now()) / 1e6) / 1e6;
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  std::mt19937_64 rng(11);
  std::string buf(block, '\0');
  const uint64_t slots = std::max<uint64_t>(1, bytes / block);
  t0 = Clock::now();
  for (int64_t i = 0; i < reads; ++i) {
    if (pread(fd, buf.data(), block, static_cast<off_t>(rng() % slots) * block) != block) break;
  }
  const double read_mb_s = reads * block / (Micros(t0, Clock::now()) / 1e6) / 1e6;
  close(fd);
  std::filesystem::remove(path);
  return {write_mb_s, read_mb_s};
}

// Graceful shutdown as the server makes it (service/server.cc Shutdown): a
// host tier holding `bytes` of `block`-byte blocks, one in ten put durable
// (on disk at once), with write-behind above `write_behind` of its budget
// (the server's --write_behind_fraction; 0: off) while it fills, is evicted
// to disk under a deadline of `deadline_s`,
// synced and closed; then reopened, where every durable block must be found.
// Prints the shutdown's time against the deadline, what it spilled and what
// it left (lost with the process), and the device's fdatasync'd sequential
// write of the same bytes. Returns non-zero when a durable block is missing.
int ShutdownRun(const std::string& root, uint64_t bytes, int64_t block, double deadline_s, double write_behind) {
  const std::string dir = root + "/tqkv_shutdown_bench_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  const int64_t n = static_cast<int64_t>(bytes / block);
  storage::BlockStoreOptions o;
  o.host_capacity_bytes = bytes + bytes / 8;
  o.disk_path = dir;
  o.disk_capacity_bytes = 2 * bytes;
  o.write_behind_above_bytes = static_cast<uint64_t>(write_behind * static_cast<double>(o.host_capacity_bytes));
  auto store = storage::BlockStore::Open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "disk_tier_bench: %s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  const storage::BlockAccounting acc{.dense_equivalent_bytes = static_cast<uint64_t>(4 * block),
                                     .packed_k_bytes = static_cast<uint64_t>(block / 2),
                                     .packed_v_bytes = static_cast<uint64_t>(block / 2),
                                     .total_bytes = static_cast<uint64_t>(block)};
  std::string payload(block, 's');
  auto t0 = Clock::now();
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(payload.data(), &i, sizeof i);
    auto r = (*store)->Put({"bench", 2, Hash(i)}, "", acc, payload, {.durable = i % 10 == 0});
    if (!r.ok()) {
      std::fprintf(stderr, "disk_tier_bench: shutdown fill %lld: %s\n", (long long)i,
                   std::string(r.status().message()).c_str());
      return 1;
    }
  }
  const double fill_s = Micros(t0, Clock::now()) / 1e6;
  const uint64_t written_behind = (*store)->Stats().counters.written_behind_bytes;
  // The server's steps: the shutdown spill, then the close.
  t0 = Clock::now();
  auto ev = (*store)->SpillForShutdown(absl::Seconds(deadline_s));
  store->reset();
  const double shutdown_s = Micros(t0, Clock::now()) / 1e6;
  if (!ev.ok()) {
    std::fprintf(stderr, "disk_tier_bench: shutdown: %s\n", std::string(ev.status().message()).c_str());
    return 1;
  }
  o.load_index_in_background = false;  // every block is indexed before it is counted
  store = storage::BlockStore::Open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "disk_tier_bench: reopen: %s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  int64_t durable_missing = 0, found = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto hit = (*store)->Lookup("bench", 2, {Hash(i)});
    const bool there = hit.ok() && hit->hits == 1;
    found += there;
    if (i % 10 == 0 && !there) ++durable_missing;
  }
  store->reset();
  const auto [raw_write, raw_read] = RawDevice(root, bytes, block, 0);
  (void)raw_read;
  std::printf("\n[shutdown] %lld blocks of %lld bytes (%.2f GB) in host memory, one in ten durable, filled in %.1f s "
              "(written behind meanwhile: %.2f GB, above %.2f of the host budget)\n"
              "  shutdown (spill until a %.0f s deadline, sync, close): %.1f s; spilled %llu blocks (%.2f GB, %.0f MB/s), "
              "left %llu (%.2f GB, lost with the process)\n"
              "  after the restart: %lld of %lld blocks, durable ones missing: %lld; the device's sequential write "
              "with fdatasync: %.0f MB/s\n",
              (long long)n, (long long)block, bytes / 1e9, fill_s, written_behind / 1e9, write_behind, deadline_s,
              shutdown_s,
              (unsigned long long)ev->blocks, ev->bytes / 1e9, ev->bytes / 1e6 / shutdown_s,
              (unsigned long long)ev->left_blocks, ev->left_bytes / 1e9, (long long)found, (long long)n,
              (long long)durable_missing, raw_write);
  std::fflush(stdout);
  std::filesystem::remove_all(dir);
  return durable_missing == 0 ? 0 : 1;
}

// This process's resident set (VmRSS), in bytes; 0 if unreadable.
double RssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) * 1024;
  return 0;
}

int Run(int argc, char** argv) {
  auto args = cli::Args::Parse(argc, argv, 1, {"sizes", "block_bytes", "host_blocks", "lookups", "spills", "dir", "background_index", "shutdown_mib",
                                                   "shutdown_block_bytes", "shutdown_deadline_s",
                                                   "shutdown_write_behind_pct"});
  if (!args.ok()) {
    std::fprintf(stderr, "disk_tier_bench: %s\n", std::string(args.status().message()).c_str());
    return 2;
  }
  const int64_t block = *args->GetInt("block_bytes", 1024), host_blocks = *args->GetInt("host_blocks", 4096),
                lookups = *args->GetInt("lookups", 300), spills = *args->GetInt("spills", 20000);
  const bool background_index = *args->GetInt("background_index", 1) != 0;
  const int64_t shutdown_mib = *args->GetInt("shutdown_mib", 0);
  std::vector<int64_t> sizes;
  const std::string size_list = args->Get("sizes", "10000,1000000");
  for (absl::string_view s : absl::StrSplit(size_list, ',', absl::SkipEmpty())) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 2000) {
      std::fprintf(stderr, "disk_tier_bench: bad size '%s' (at least 2000)\n", std::string(s).c_str());
      return 2;
    }
    sizes.push_back(n);
  }
  const std::string dir = args->Get("dir", "/tmp") + "/tqkv_disk_tier_bench_" + std::to_string(getpid());
  std::printf("block %lld bytes, host tier %lld blocks, %lld Lookups of 1,000-hash chains, %lld spilling puts\n",
              (long long)block, (long long)host_blocks, (long long)lookups, (long long)spills);
  const storage::BlockAccounting acc{.dense_equivalent_bytes = static_cast<uint64_t>(4 * block),
                                     .packed_k_bytes = static_cast<uint64_t>(block / 2),
                                     .packed_v_bytes = static_cast<uint64_t>(block / 2),
                                     .total_bytes = static_cast<uint64_t>(block)};
  std::string payload(block, 'x');
  std::vector<Result> results;
  for (int64_t n : sizes) {
    std::filesystem::remove_all(dir);
    storage::BlockStoreOptions o;
    o.host_capacity_bytes = static_cast<uint64_t>(host_blocks * block);
    o.disk_path = dir;
    o.disk_capacity_bytes = static_cast<uint64_t>(n + spills + 1) * block * 2;
    auto store = storage::BlockStore::Open(o);
    if (!store.ok()) {
      std::fprintf(stderr, "disk_tier_bench: %s\n", std::string(store.status().message()).c_str());
      return 1;
    }
    auto put = [&](int64_t i) {
      std::memcpy(payload.data(), &i, sizeof i);  // distinct bytes per block
      return (*store)->Put({"bench", 1, Hash(i)}, "", acc, payload).status();
    };
    Result r;
    auto t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) {
      if (absl::Status s = put(i); !s.ok()) {
        std::fprintf(stderr, "disk_tier_bench: put %lld: %s\n", (long long)i, std::string(s.message()).c_str());
        return 1;
      }
    }
    r.fill_per_s = n / (Micros(t0, Clock::now()) / 1e6);
    // Lookups over the disk range (blocks 0 .. n - host_blocks), each a
    // chain of 1,000 consecutive hashes from a random start.
    std::mt19937_64 rng(7);
    const int64_t disk_range = std::max<int64_t>(1000, n - 2 * host_blocks);
    std::vector<double> us;
    std::vector<std::string> chain(1000);
    for (int64_t l = 0; l < lookups; ++l) {
      const int64_t start = static_cast<int64_t>(rng() % static_cast<uint64_t>(disk_range - 999));
      for (int j = 0; j < 1000; ++j) chain[j] = Hash(start + j);
      const auto a = Clock::now();
      auto hits = (*store)->Lookup("bench", 1, chain);
      us.push_back(Micros(a, Clock::now()));
      if (!hits.ok() || hits->hits != 1000) {
        std::fprintf(stderr, "disk_tier_bench: lookup at %lld found %zu of 1000\n", (long long)start,
                     hits.ok() ? hits->hits : 0);
        return 1;
      }
    }
    r.lookup_p50 = Percentile(us, 0.5);
    r.lookup_p99 = Percentile(us, 0.99);
    t0 = Clock::now();
    for (int64_t i = n; i < n + spills; ++i) {
      if (absl::Status s = put(i); !s.ok()) {
        std::fprintf(stderr, "disk_tier_bench: put %lld: %s\n", (long long)i, std::string(s.message()).c_str());
        return 1;
      }
    }
    r.spill_per_s = spills / (Micros(t0, Clock::now()) / 1e6);
    const storage::StoreStats st = (*store)->Stats();
    results.push_back(r);
    std::printf("\n[%lld blocks indexed] %llu spills in all\n"
                "  fill: %.0f puts/s\n"
                "  Lookup of a 1,000-hash chain over the disk range: p50 %.0f us, p99 %.0f us\n"
                "  after the Lookups, puts that each spill a block: %.0f puts/s (%.2fx the %lld-block store)\n",
                (long long)n, (unsigned long long)st.counters.spills, r.fill_per_s, r.lookup_p50, r.lookup_p99,
                r.spill_per_s, r.spill_per_s / results[0].spill_per_s, (long long)sizes[0]);
    std::fflush(stdout);
    store->reset();
    malloc_trim(0);  // what the closed store freed goes back to the system: the restart's RSS starts clean
    DropFromPageCache(dir);

    // Restart on the same directory, serving while the index loads (as the
    // server does) unless --background_index 0.
    const double rss_closed = RssBytes();
    o.load_index_in_background = background_index;
    t0 = Clock::now();
    store = storage::BlockStore::Open(o);
    if (!store.ok()) {
      std::fprintf(stderr, "disk_tier_bench: reopen: %s\n", std::string(store.status().message()).c_str());
      return 1;
    }
    const double open_s = Micros(t0, Clock::now()) / 1e6;
    // A chain from a random place in the disk range (the scan goes in key
    // order, which is not the chain's).
    const int64_t first_start = static_cast<int64_t>(rng() % static_cast<uint64_t>(disk_range - 999));
    for (int j = 0; j < 1000; ++j) chain[j] = Hash(first_start + j);
    auto first = (*store)->Lookup("bench", 1, chain);
    auto got = (*store)->Get({"bench", 1, Hash(first_start + 999)});
    const double first_hit_s = Micros(t0, Clock::now()) / 1e6;
    if (!first.ok() || first->hits != 1000 || !got.ok()) {
      std::fprintf(stderr, "disk_tier_bench: after the reopen the first blocks do not answer\n");
      return 1;
    }
    const bool was_loading = (*store)->Stats().index_loading;
    const double rss_first = RssBytes();
    if (absl::Status s = (*store)->AwaitIndexLoaded(); !s.ok()) {
      std::fprintf(stderr, "disk_tier_bench: index load: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    const double indexed_s = Micros(t0, Clock::now()) / 1e6;
    const double rss_open = RssBytes();
    const int64_t gets = std::min<int64_t>(20000, n / 2);
    t0 = Clock::now();
    uint64_t got_bytes = 0;
    for (int64_t g = 0; g < gets; ++g) {
      auto b = (*store)->Get({"bench", 1, Hash(static_cast<int64_t>(rng() % static_cast<uint64_t>(disk_range)))});
      if (!b.ok()) {
        std::fprintf(stderr, "disk_tier_bench: get after the reopen: %s\n", std::string(b.status().message()).c_str());
        return 1;
      }
      got_bytes += b->payload->size();
    }
    const double get_s = Micros(t0, Clock::now()) / 1e6;
    const auto [raw_write, raw_read] = RawDevice(args->Get("dir", "/tmp"), static_cast<uint64_t>(n) * block, block, gets);
    std::printf("  restart (%s): open %.2f s, first Lookup hit (1,000 hashes) and Get %.2f s%s, index complete "
                "%.2f s; RSS %.0f MB closed, %.0f MB at the first hit, %.0f MB indexed (%.0f bytes a block)\n"
                "  Gets of random disk blocks after the restart, cold: %.0f /s (%.1f MB/s; the device's random "
                "%lld-byte reads: %.1f MB/s, %.2fx)\n"
                "  fill (every put spills one block): %.1f MB/s; the device's sequential write with fdatasync: "
                "%.1f MB/s, %.2fx\n",
                background_index ? "index loaded in the background" : "index loaded before serving", open_s,
                first_hit_s, was_loading ? " (index still loading)" : "", indexed_s, rss_closed / 1e6, rss_first / 1e6,
                rss_open / 1e6, (rss_open - rss_closed) / static_cast<double>(n), gets / get_s, got_bytes / get_s / 1e6,
                (long long)block, raw_read, raw_read > 0 ? got_bytes / get_s / 1e6 / raw_read : 0.0,
                r.fill_per_s * block / 1e6, raw_write, raw_write > 0 ? r.fill_per_s * block / 1e6 / raw_write : 0.0);
    std::fflush(stdout);
    store->reset();
  }
  std::filesystem::remove_all(dir);
  if (shutdown_mib > 0)
    return ShutdownRun(args->Get("dir", "/tmp"), static_cast<uint64_t>(shutdown_mib) << 20,
                       *args->GetInt("shutdown_block_bytes", 262144), *args->GetInt("shutdown_deadline_s", 30),
                       *args->GetInt("shutdown_write_behind_pct", 0) / 100.0);
  return 0;
}

}  // namespace
}  // namespace tqkv

int main(int argc, char** argv) {
  tqkv::KeepFreedMemoryForReuse(tqkv::kDefaultKeepFreeBytes);  // as tqkv-server does
  return tqkv::Run(argc, argv);
}
