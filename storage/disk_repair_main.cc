// tqkv-disk-repair [--at_rest_key_file FILE] DIR: the repair path of a disk
// tier that tqkv-server refuses to open as damaged (DATA_LOSS naming DIR,
// its RocksDB directory: <data_dir>/rocksdb). Stop the server first. Keeps
// every block and model record that is intact, deletes the damaged ones
// (SpillStore::Repair, spill_store.h) and prints what it did; the server
// then starts and serves only verified bytes. Blocks sealed by encryption
// at rest are opened and verified with the server's key file when it is
// given (a block that fails authentication is damaged; a key missing from
// the file stops the repair, changing nothing of that block); without it
// they are kept unverified (the server checks them when it reads them).
// Exit status: 0 repaired (or nothing to repair), 1 failed, 2 usage.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/at_rest_cipher.h"
#include "storage/spill_store.h"

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: tqkv-disk-repair [--at_rest_key_file FILE] DIR\n"
               "  DIR: the disk tier's RocksDB directory, <data_dir>/rocksdb\n"
               "  --at_rest_key_file: the server's key file, to verify blocks sealed at rest\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, key_file;
  const std::string key_flag = "--at_rest_key_file";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == key_flag && i + 1 < argc) {
      key_file = argv[++i];
    } else if (a.rfind(key_flag + "=", 0) == 0) {
      key_file = a.substr(key_flag.size() + 1);
    } else if (a.rfind("-", 0) == 0 || !dir.empty()) {
      return Usage();
    } else {
      dir = a;
    }
  }
  if (dir.empty()) return Usage();
  if (!std::filesystem::exists(std::filesystem::path(dir) / "CURRENT") &&
      !std::filesystem::exists(std::filesystem::path(dir) / "IDENTITY")) {
    std::fprintf(stderr, "tqkv-disk-repair: %s does not hold a RocksDB database\n", dir.c_str());
    return 1;
  }
  std::unique_ptr<tqkv::storage::AtRestCipher> cipher;
  if (!key_file.empty()) {
    auto c = tqkv::storage::AtRestCipher::FromFile(key_file);
    if (!c.ok()) {
      std::fprintf(stderr, "tqkv-disk-repair: %s\n", c.status().ToString().c_str());
      return 1;
    }
    cipher = *std::move(c);
  }
  auto report =
      tqkv::storage::SpillStore::Repair({.path = dir, .create_if_missing = false, .cipher = cipher.get()});
  if (!report.ok()) {
    std::fprintf(stderr, "tqkv-disk-repair: %s\n", report.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "tqkv-disk-repair: %s: %s%llu blocks intact, %llu damaged blocks deleted, %llu sealed "
      "blocks kept unverified, %llu model records%s\n",
      dir.c_str(), report->rebuilt ? "rebuilt from its table files; " : "",
      static_cast<unsigned long long>(report->intact_blocks),
      static_cast<unsigned long long>(report->dropped_blocks),
      static_cast<unsigned long long>(report->unverified_blocks),
      static_cast<unsigned long long>(report->model_records),
      report->salvaged_blocks == 0
          ? ""
          : absl::StrCat(" (", report->salvaged_blocks, " payloads read back from the blob files)").c_str());
  return 0;
}
