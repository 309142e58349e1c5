// The file-system calls in flight (base/storage_calls.h): what the storage watch and the liveness
// messages name when one does not return.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "base/storage_calls.h"

namespace trainer {
namespace {

TEST(StorageCalls, NamesTheOldestCallInFlightUntilItEnds) {
  EXPECT_FALSE(oldest_storage_call());
  {
    const StorageCallScope listing("listing", "/fsx/imagenet/train-*");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const StorageCallScope read("reading", "/fsx/imagenet/train-00001", 4096);
    const auto oldest = oldest_storage_call();
    ASSERT_TRUE(oldest);
    EXPECT_EQ(describe_call(*oldest), "listing /fsx/imagenet/train-*");
  }
  EXPECT_FALSE(oldest_storage_call());
}

TEST(StorageCalls, SaysWhereAReadStartedAndHowLongItHasWaited) {
  const StorageCallScope read("reading", "/fsx/imagenet/train-00001", 4096);
  const auto call = oldest_storage_call();
  ASSERT_TRUE(call);
  EXPECT_EQ(describe_stuck(*call, call->since + std::chrono::seconds(61)),
            "reading /fsx/imagenet/train-00001 at byte 4096 has not returned for 61 s");
}

TEST(StorageCalls, TellsOneThreadsCallsFromAnothers) {
  const StorageCallScope mine("opening", "/fsx/mine");
  std::thread other([] {
    const StorageCallScope theirs("opening", "/fsx/theirs");
    const auto found = oldest_storage_call(std::this_thread::get_id());
    ASSERT_TRUE(found);
    EXPECT_EQ(found->path, "/fsx/theirs");
  });
  other.join();
  const auto found = oldest_storage_call(std::this_thread::get_id());
  ASSERT_TRUE(found);
  EXPECT_EQ(found->path, "/fsx/mine");
}

}  // namespace
}  // namespace trainer
