// The caching allocator: rounding, pools, reuse, split/merge, exact stats, OOM behaviour.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/allocator.hpp"
#include "runtime/error.hpp"

namespace actbench {
namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;
constexpr int64_t GiB = int64_t{1} << 30;

// Counts what the allocator takes from the source, and can refuse.
class CountingSource final : public RawMemorySource {
 public:
  void* allocate(size_t bytes) override {
    if (refuse) return nullptr;
    live += bytes;
    ++calls;
    return inner->allocate(bytes);
  }
  void release(void* p, size_t bytes) override {
    live -= bytes;
    ++releases;
    inner->release(p, bytes);
  }
  Device device() const override { return Device::host; }
  std::unique_ptr<RawMemorySource> inner = make_host_source();
  size_t live = 0;
  int calls = 0, releases = 0;
  bool refuse = false;
};

TEST(Allocator, RoundsTo512) {
  EXPECT_EQ(CachingAllocator::round_size(0), 512u);
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::segment_size_for(512), 2 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size_for(MiB), 2 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size_for(MiB + 512), 20 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size_for(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size_for(10 * MiB), 10 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size_for(11 * MiB), 12 * MiB);
}

TEST(Allocator, ExactStatsForRequestedAllocatedReserved) {
  CachingAllocator a(make_host_source());
  Block* x = a.allocate(1000);
  Block* y = a.allocate(100);
  const auto& s = a.stats();
  EXPECT_EQ(s.requested_bytes.current, 1100);
  EXPECT_EQ(s.allocated_bytes.current, 1024 + 512);
  EXPECT_EQ(s.reserved_bytes.current, static_cast<int64_t>(2 * MiB));  // both from one small segment
  EXPECT_EQ(s.segments.current, 1);
  EXPECT_EQ(s.active_blocks.current, 2);
  std::memset(CachingAllocator::block_ptr(x), 1, 1000);  // host memory is real and writable
  a.free(x);
  EXPECT_EQ(s.requested_bytes.current, 100);
  EXPECT_EQ(s.requested_bytes.peak, 1100);
  EXPECT_EQ(s.allocated_bytes.current, 512);
  EXPECT_EQ(s.reserved_bytes.current, static_cast<int64_t>(2 * MiB));  // cached, not returned
  a.free(y);
  EXPECT_EQ(s.allocated_bytes.current, 0);
  EXPECT_EQ(s.active_blocks.current, 0);
  EXPECT_EQ(s.num_allocs, 2u);
  EXPECT_EQ(s.num_frees, 2u);
}

TEST(Allocator, SmallAndLargePoolsUseSeparateSegments) {
  CachingAllocator a(make_host_source());
  Block* small = a.allocate(MiB);
  Block* large = a.allocate(MiB + 1);
  EXPECT_EQ(a.stats().segments.current, 2);
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<int64_t>(2 * MiB + 20 * MiB));
  Block* mid = a.allocate(11 * MiB);  // fits in the large segment's 19 MiB remainder
  EXPECT_EQ(a.stats().segments.current, 2);
  Block* huge = a.allocate(25 * MiB);  // >= 10 MiB: its own segment, rounded to 2 MiB
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<int64_t>(2 * MiB + 20 * MiB + 26 * MiB));
  a.free(mid);
  a.free(small);
  a.free(large);
  a.free(huge);
}

TEST(Allocator, FreedBlockIsReusedWithoutNewSegment) {
  CountingSource* src = nullptr;
  auto owned = std::make_unique<CountingSource>();
  src = owned.get();
  CachingAllocator a(std::move(owned));
  Block* x = a.allocate(4 * MiB);
  void* p = CachingAllocator::block_ptr(x);
  a.free(x);
  Block* y = a.allocate(4 * MiB);
  EXPECT_EQ(CachingAllocator::block_ptr(y), p);
  EXPECT_EQ(src->calls, 1);
  a.free(y);
}

TEST(Allocator, SplitsAndMergesNeighbours) {
  CachingAllocator a(make_host_source());
  Block* b1 = a.allocate(1024);
  Block* b2 = a.allocate(1024);
  Block* b3 = a.allocate(1024);
  char* base = static_cast<char*>(CachingAllocator::block_ptr(b1));
  EXPECT_EQ(CachingAllocator::block_ptr(b2), base + 1024);  // carved from the same segment
  EXPECT_EQ(CachingAllocator::block_ptr(b3), base + 2048);
  a.free(b1);
  a.free(b3);
  a.free(b2);  // merges with both neighbours and the segment's tail
  // The whole segment is one free block again: two 1 MiB requests fill it from its base
  // (unmerged, the first would land after the three 1 KiB fragments).
  Block* h1 = a.allocate(MiB);
  Block* h2 = a.allocate(MiB);
  EXPECT_EQ(CachingAllocator::block_ptr(h1), base);
  EXPECT_EQ(CachingAllocator::block_ptr(h2), base + MiB);
  EXPECT_EQ(a.stats().segments.current, 1);
  a.free(h1);
  a.free(h2);
}

TEST(Allocator, LargePoolDoesNotSplitSmallRemainders) {
  CachingAllocator a(make_host_source());
  // 19.5 MiB from a 20 MiB segment: the 0.5 MiB remainder is not worth a block.
  Block* b = a.allocate(20 * MiB - 512 * KiB);
  EXPECT_EQ(CachingAllocator::block_size(b), 20 * MiB);
  EXPECT_EQ(a.stats().allocated_bytes.current, static_cast<int64_t>(20 * MiB));
  EXPECT_EQ(a.stats().requested_bytes.current, static_cast<int64_t>(20 * MiB - 512 * KiB));
  a.free(b);
  // 2 MiB from a 20 MiB segment: the 18 MiB rest is split off and reusable.
  Block* c = a.allocate(2 * MiB);
  Block* d = a.allocate(2 * MiB);
  EXPECT_EQ(CachingAllocator::block_size(c), 2 * MiB);
  EXPECT_EQ(a.stats().segments.current, 1);
  a.free(c);
  a.free(d);
}

TEST(Allocator, ResetPeakAndEmptyCache) {
  auto owned = std::make_unique<CountingSource>();
  CountingSource* src = owned.get();
  CachingAllocator a(std::move(owned));
  Block* x = a.allocate(30 * MiB);
  Block* y = a.allocate(512);
  a.free(x);
  EXPECT_EQ(a.stats().allocated_bytes.peak, static_cast<int64_t>(30 * MiB + 512));
  a.reset_peak();
  EXPECT_EQ(a.stats().allocated_bytes.peak, 512);
  EXPECT_EQ(a.stats().reserved_bytes.peak, static_cast<int64_t>(30 * MiB + 2 * MiB));
  a.empty_cache();  // the 30 MiB segment is free: returned; the small one holds y: kept
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<int64_t>(2 * MiB));
  EXPECT_EQ(src->live, 2 * MiB);
  EXPECT_EQ(src->releases, 1);
  a.free(y);
  a.empty_cache();
  EXPECT_EQ(src->live, 0u);
  EXPECT_EQ(a.stats().segments.current, 0);
}

TEST(Allocator, CapacityGivesOutOfMemoryWithClearMessage) {
  CachingAllocator a(make_host_source(), 64 * MiB);
  Block* x = a.allocate(40 * MiB);
  try {
    a.allocate(40 * MiB);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("40.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("64.00 MiB"), std::string::npos) << msg;
  }
  EXPECT_EQ(a.stats().num_ooms, 1u);
  EXPECT_EQ(a.stats().allocated_bytes.current, static_cast<int64_t>(40 * MiB));  // state unchanged
  a.free(x);
}

TEST(Allocator, FlushesCacheAndRetriesBeforeOom) {
  CachingAllocator a(make_host_source(), 64 * MiB);
  Block* x = a.allocate(40 * MiB);
  a.free(x);  // cached: reserved stays 40 MiB
  Block* y = a.allocate(50 * MiB);  // does not fit beside the cache; fits once it is flushed
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<int64_t>(50 * MiB));
  EXPECT_EQ(a.stats().num_ooms, 0u);
  EXPECT_EQ(a.stats().num_source_frees, 1u);
  a.free(y);
}

TEST(Allocator, SourceFailureIsOutOfMemory) {
  auto owned = std::make_unique<CountingSource>();
  CountingSource* src = owned.get();
  CachingAllocator a(std::move(owned));
  src->refuse = true;
  EXPECT_THROW(a.allocate(512), OutOfMemory);
  src->refuse = false;
  Block* b = a.allocate(512);
  EXPECT_NE(CachingAllocator::block_ptr(b), nullptr);
  a.free(b);
}

TEST(Allocator, MetaSourceHoldsHundredsOfGiB) {
  CachingAllocator a(make_meta_source());
  std::vector<Block*> blocks;
  for (int i = 0; i < 50; ++i) blocks.push_back(a.allocate(100 * static_cast<size_t>(GiB)));
  EXPECT_EQ(a.stats().allocated_bytes.current, 50 * 100 * GiB);
  EXPECT_EQ(a.device(), Device::meta);
  for (size_t i = 1; i < blocks.size(); ++i)  // distinct, non-overlapping address ranges
    EXPECT_GE(reinterpret_cast<uintptr_t>(CachingAllocator::block_ptr(blocks[i])),
              reinterpret_cast<uintptr_t>(CachingAllocator::block_ptr(blocks[i - 1])) + 100 * static_cast<uintptr_t>(GiB));
  for (Block* b : blocks) a.free(b);
  EXPECT_EQ(a.stats().allocated_bytes.current, 0);
}

TEST(Allocator, RandomStressKeepsInvariants) {
  // Meta addresses: gigabytes of live blocks cost nothing, and the bookkeeping is the same.
  CachingAllocator a(make_meta_source());
  std::mt19937_64 rng(7);
  struct Live {
    Block* b;
    size_t req;
  };
  std::vector<Live> live;
  int64_t requested = 0, allocated = 0;
  for (int step = 0; step < 20000; ++step) {
    bool do_alloc = live.empty() || rng() % 100 < 55;
    if (do_alloc) {
      size_t req = (rng() % 4 == 0) ? rng() % (24 * MiB) : rng() % (64 * KiB);
      Block* b = a.allocate(req);
      ASSERT_GE(CachingAllocator::block_size(b), CachingAllocator::round_size(req));
      ASSERT_EQ(reinterpret_cast<uintptr_t>(CachingAllocator::block_ptr(b)) % 64, 0u);
      live.push_back({b, req});
      requested += static_cast<int64_t>(req);
      allocated += static_cast<int64_t>(CachingAllocator::block_size(b));
    } else {
      size_t i = rng() % live.size();
      requested -= static_cast<int64_t>(live[i].req);
      allocated -= static_cast<int64_t>(CachingAllocator::block_size(live[i].b));
      a.free(live[i].b);
      live[i] = live.back();
      live.pop_back();
    }
    ASSERT_EQ(a.stats().requested_bytes.current, requested);
    ASSERT_EQ(a.stats().allocated_bytes.current, allocated);
    ASSERT_LE(a.stats().allocated_bytes.current, a.stats().reserved_bytes.current);
    ASSERT_EQ(a.stats().active_blocks.current, static_cast<int64_t>(live.size()));
  }
  // Live blocks never overlap.
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  for (auto& l : live) {
    auto p = reinterpret_cast<uintptr_t>(CachingAllocator::block_ptr(l.b));
    ranges.push_back({p, p + CachingAllocator::block_size(l.b)});
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) ASSERT_LE(ranges[i - 1].second, ranges[i].first);
  for (auto& l : live) a.free(l.b);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes.current, 0);
  EXPECT_EQ(a.stats().segments.current, 0);
}

TEST(Allocator, FormatsBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(20 * static_cast<int64_t>(MiB)), "20.00 MiB");
  EXPECT_EQ(format_bytes(3 * GiB), "3.00 GiB");
}

}  // namespace
}  // namespace actbench
