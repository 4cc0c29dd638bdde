#pragma once
// A caching allocator in the manner of PyTorch's CUDA caching allocator, over any raw
// memory source (host malloc, cudaMalloc, or the meta backend's virtual addresses).
//
// - requests are rounded up to 512 bytes;
// - small requests (<= 1 MiB) are served from 2 MiB segments, large ones from segments of
//   20 MiB (requests < 10 MiB) or the request rounded up to 2 MiB;
// - a free block larger than needed is split; freed blocks merge with free neighbours of the
//   same segment; segments are returned to the source only by empty_cache() or when a
//   source allocation fails (then the cache is flushed and the allocation retried once);
// - stats: requested (exact), allocated (rounded) and reserved bytes, {current, peak}.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

namespace actbench {

enum class Device : uint8_t { host, cuda, meta };
const char* device_name(Device d);

// Where segments come from. allocate() returns nullptr when the memory is not available.
class RawMemorySource {
 public:
  virtual ~RawMemorySource() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* ptr, size_t bytes) = 0;
  virtual Device device() const = 0;
};

// 64-byte aligned host memory.
std::unique_ptr<RawMemorySource> make_host_source();
// Virtual addresses that are never dereferenced: the meta backend's "memory".
std::unique_ptr<RawMemorySource> make_meta_source();

struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  void add(int64_t v) {
    current += v;
    if (current > peak) peak = current;
  }
  void sub(int64_t v) { current -= v; }
  void reset_peak() { peak = current; }
};

struct AllocatorStats {
  Stat requested_bytes;  // exactly what callers asked for
  Stat allocated_bytes;  // rounded sizes of blocks in use
  Stat reserved_bytes;   // segments obtained from the source
  Stat active_blocks;
  Stat segments;
  uint64_t num_allocs = 0;
  uint64_t num_frees = 0;
  uint64_t num_source_allocs = 0;
  uint64_t num_source_frees = 0;
  uint64_t num_ooms = 0;
};

struct Block;  // opaque; defined in allocator.cpp

class CachingAllocator {
 public:
  static constexpr size_t kRound = 512;
  static constexpr size_t kSmallSize = 1 << 20;         // requests <= 1 MiB use the small pool
  static constexpr size_t kSmallBuffer = 2 << 20;       // small-pool segment size
  static constexpr size_t kMinLargeAlloc = 10 << 20;    // below this, large segments are 20 MiB
  static constexpr size_t kLargeBuffer = 20 << 20;
  static constexpr size_t kRoundLarge = 2 << 20;        // large segments round to 2 MiB

  // capacity_bytes > 0 caps reserved bytes (an emulated device of that size): allocations
  // beyond it throw OutOfMemory exactly as a real device would.
  explicit CachingAllocator(std::unique_ptr<RawMemorySource> source, size_t capacity_bytes = 0);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns a block of at least `bytes` (rounded to 512). Throws OutOfMemory.
  Block* allocate(size_t bytes);
  void free(Block* block);
  static void* block_ptr(const Block* block);
  static size_t block_size(const Block* block);  // rounded size

  const AllocatorStats& stats() const { return stats_; }
  void reset_peak();
  // Returns every fully free segment to the source.
  void empty_cache();
  Device device() const { return source_->device(); }
  size_t capacity_bytes() const { return capacity_; }

  static size_t round_size(size_t bytes);
  static size_t segment_size_for(size_t rounded);

 private:
  struct Pool;
  Block* try_pool(Pool& pool, size_t rounded);
  Block* new_segment(Pool& pool, size_t rounded);
  void release_free_segments(Pool& pool);
  Pool& pool_for(size_t rounded);

  std::unique_ptr<RawMemorySource> source_;
  size_t capacity_ = 0;
  std::unique_ptr<Pool> small_;
  std::unique_ptr<Pool> large_;
  AllocatorStats stats_;
  std::map<void*, Block*> segments_;  // segment base -> its first block
};

std::string format_bytes(int64_t bytes);

}  // namespace actbench
