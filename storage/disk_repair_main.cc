// tqkv-disk-repair DIR: the repair path of a disk tier that tqkv-server
// refuses to open as damaged (DATA_LOSS naming DIR, its RocksDB directory:
// <data_dir>/rocksdb). Stop the server first. Keeps every block and model
// record that is intact, deletes the damaged ones (SpillStore::Repair,
// spill_store.h) and prints what it did; the server then starts and serves
// only verified bytes. Blocks sealed by encryption at rest are kept
// unverified (the server checks them when it reads them).
// Exit status: 0 repaired (or nothing to repair), 1 failed, 2 usage.
#include <cstdio>
#include <filesystem>
#include <string>

#include "storage/spill_store.h"

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]).rfind("-", 0) == 0) {
    std::fprintf(stderr, "usage: tqkv-disk-repair DIR   (the disk tier's RocksDB directory, "
                         "<data_dir>/rocksdb)\n");
    return 2;
  }
  const std::string dir = argv[1];
  if (!std::filesystem::exists(std::filesystem::path(dir) / "CURRENT") &&
      !std::filesystem::exists(std::filesystem::path(dir) / "IDENTITY")) {
    std::fprintf(stderr, "tqkv-disk-repair: %s does not hold a RocksDB database\n", dir.c_str());
    return 1;
  }
  auto report = tqkv::storage::SpillStore::Repair({.path = dir, .create_if_missing = false});
  if (!report.ok()) {
    std::fprintf(stderr, "tqkv-disk-repair: %s\n", report.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "tqkv-disk-repair: %s: %s%llu blocks intact, %llu damaged blocks deleted, %llu sealed "
      "blocks kept unverified, %llu model records\n",
      dir.c_str(), report->rebuilt ? "rebuilt from its table files; " : "",
      static_cast<unsigned long long>(report->intact_blocks),
      static_cast<unsigned long long>(report->dropped_blocks),
      static_cast<unsigned long long>(report->unverified_blocks),
      static_cast<unsigned long long>(report->model_records));
  return 0;
}
