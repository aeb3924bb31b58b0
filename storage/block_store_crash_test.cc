// Blocks written to RocksDB survive a kill -9 of the writing process:
// crash_writer_main writes, spills and SIGKILLs itself; this test reopens
// the same directory.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "storage/block_store.h"
#include "storage/test_util.h"

namespace tqkv::storage {
namespace {

std::string HelperPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir != nullptr ? srcdir : ".") + "/" +
         (workspace != nullptr ? workspace : "tqkv") + "/storage/crash_writer";
}

TEST(BlockStoreCrash, SpilledAndDurableBlocksSurviveKill9) {
  TempDir dir;
  std::string helper = HelperPath();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(helper.c_str(), helper.c_str(), dir.path().c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "helper " << helper << " ended with status " << status;

  auto store = BlockStore::Open({.disk_path = dir.path()});
  ASSERT_TRUE(store.ok()) << store.status();
  for (int i : {0, 1, 100}) {
    BlockKey k{"acme", 7, "h" + std::to_string(i)};
    auto got = (*store)->Get(k);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status();
    EXPECT_EQ(got->payload->view(), TestPayload(k, 100)) << i;
    EXPECT_EQ(got->accounting, TestAccounting(100));
    EXPECT_EQ(got->tier, Tier::kDisk);
  }
  for (int i = 2; i < 10; ++i) {  // lived only in host memory
    EXPECT_EQ((*store)->Get({"acme", 7, "h" + std::to_string(i)}).status().code(),
              absl::StatusCode::kNotFound)
        << i;
  }
  EXPECT_EQ((*store)->Stats().blocks, 3u);
  EXPECT_EQ((*store)->Stats().counters.checksum_failures, 0u);
}

}  // namespace
}  // namespace tqkv::storage
