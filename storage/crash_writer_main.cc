// Test helper for block_store_crash_test: writes blocks into a BlockStore at
// argv[1] and then kills itself with SIGKILL, so that nothing is closed or
// flushed. Writes (all 100 bytes, TestPayload, tenant "acme", model 7,
// hashes "h<i>"), with a 1000-byte host budget:
//   h0..h9  plain puts: admitting h9 spills h0 and h1 to RocksDB (unsynced)
//   h100    a durable put (synced WAL), which also stays in host memory
// Exit status 2..4 means the writes failed before the kill.
#include <signal.h>
#include <unistd.h>

#include <string>

#include "storage/block_store.h"
#include "storage/test_util.h"

int main(int argc, char** argv) {
  using namespace tqkv::storage;
  if (argc != 2) return 2;
  FakeClock clock;
  BlockStoreOptions o;
  o.host_capacity_bytes = 1000;
  o.disk_path = argv[1];
  o.clock = &clock;
  auto store = BlockStore::Open(o);
  if (!store.ok()) return 2;
  for (int i : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 100}) {
    clock.Advance(absl::Seconds(1));
    BlockKey k{"acme", 7, "h" + std::to_string(i)};
    auto c = (*store)->Put(k, "", TestAccounting(100), TestPayload(k, 100),
                           {.durable = i == 100});
    if (!c.ok()) return 3;
  }
  if ((*store)->Stats().counters.spills != 2) return 4;
  kill(getpid(), SIGKILL);
  return 5;
}
