// The caching allocator (see allocator.hpp for the policy). Blocks of one segment form a
// doubly-linked list in address order, so a freed block finds its neighbours in O(1);
// free blocks of a pool sit in a set ordered by (size, address): best fit is lower_bound.
#include "runtime/allocator.hpp"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "runtime/error.hpp"

namespace actbench {

struct Block {
  size_t size = 0;       // rounded bytes
  size_t requested = 0;  // what the caller asked for (0 while free)
  void* ptr = nullptr;
  bool allocated = false;
  bool small_pool = false;
  Block* prev = nullptr;  // neighbours inside the same segment
  Block* next = nullptr;
  size_t segment_bytes = 0;  // only meaningful on a segment's first block
};

namespace {

struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->size != b->size) return a->size < b->size;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};

bool segment_head(const Block* b) { return b->prev == nullptr; }

}  // namespace

struct CachingAllocator::Pool {
  bool small = false;
  std::set<Block*, BlockLess> free_blocks;
};

const char* device_name(Device d) {
  switch (d) {
    case Device::host: return "host";
    case Device::cuda: return "cuda";
    case Device::meta: return "meta";
  }
  return "?";
}

namespace {

class HostSource final : public RawMemorySource {
 public:
  void* allocate(size_t bytes) override {
    // aligned_alloc wants a size that is a multiple of the alignment; segments always are.
    return std::aligned_alloc(64, bytes);
  }
  void release(void* ptr, size_t) override { std::free(ptr); }
  Device device() const override { return Device::host; }
};

// Addresses from a region no process maps; ops never dereference them. Never runs out:
// capacity (an emulated device) is enforced by the allocator, not the source.
class MetaSource final : public RawMemorySource {
 public:
  void* allocate(size_t bytes) override {
    uintptr_t p = next_;
    next_ += (bytes + 511) / 512 * 512;
    return reinterpret_cast<void*>(p);
  }
  void release(void*, size_t) override {}
  Device device() const override { return Device::meta; }

 private:
  uintptr_t next_ = uintptr_t{0x100000000000};
};

}  // namespace

std::unique_ptr<RawMemorySource> make_host_source() { return std::make_unique<HostSource>(); }
std::unique_ptr<RawMemorySource> make_meta_source() { return std::make_unique<MetaSource>(); }

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes == 0) return kRound;
  return (bytes + kRound - 1) / kRound * kRound;
}

size_t CachingAllocator::segment_size_for(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

CachingAllocator::CachingAllocator(std::unique_ptr<RawMemorySource> source, size_t capacity_bytes)
    : source_(std::move(source)), capacity_(capacity_bytes), small_(std::make_unique<Pool>()), large_(std::make_unique<Pool>()) {
  small_->small = true;
}

CachingAllocator::~CachingAllocator() {
  // Live tensors must not outlive their allocator; if some do (a bug elsewhere) we say so;
  // every segment goes back to the source either way.
  if (stats_.active_blocks.current != 0) {
    std::fprintf(stderr, "actbench: warning: allocator destroyed with %lld live blocks\n",
                 static_cast<long long>(stats_.active_blocks.current));
  }
  for (auto& [ptr, head] : segments_) {
    source_->release(ptr, head->segment_bytes);
    Block* b = head;
    while (b) {
      Block* n = b->next;
      delete b;
      b = n;
    }
  }
}

CachingAllocator::Pool& CachingAllocator::pool_for(size_t rounded) { return rounded <= kSmallSize ? *small_ : *large_; }

Block* CachingAllocator::try_pool(Pool& pool, size_t rounded) {
  Block key;
  key.size = rounded;
  key.ptr = nullptr;
  auto it = pool.free_blocks.lower_bound(&key);
  if (it == pool.free_blocks.end()) return nullptr;
  Block* b = *it;
  pool.free_blocks.erase(it);
  return b;
}

Block* CachingAllocator::new_segment(Pool& pool, size_t rounded) {
  size_t seg = segment_size_for(rounded);
  auto over_capacity = [&] {
    return capacity_ > 0 && static_cast<size_t>(stats_.reserved_bytes.current) + seg > capacity_;
  };
  void* p = over_capacity() ? nullptr : source_->allocate(seg);
  if (!p) {
    // As PyTorch does: give cached, fully free segments back and try once more.
    release_free_segments(*small_);
    release_free_segments(*large_);
    p = over_capacity() ? nullptr : source_->allocate(seg);
  }
  if (!p) return nullptr;
  Block* b = new Block;
  b->size = seg;
  b->ptr = p;
  b->small_pool = pool.small;
  b->segment_bytes = seg;
  segments_.emplace(p, b);
  stats_.reserved_bytes.add(static_cast<int64_t>(seg));
  stats_.segments.add(1);
  ++stats_.num_source_allocs;
  return b;
}

void CachingAllocator::release_free_segments(Pool& pool) {
  std::vector<Block*> whole;
  for (Block* b : pool.free_blocks)
    if (segment_head(b) && b->next == nullptr) whole.push_back(b);
  for (Block* b : whole) {
    pool.free_blocks.erase(b);
    segments_.erase(b->ptr);
    source_->release(b->ptr, b->segment_bytes);
    stats_.reserved_bytes.sub(static_cast<int64_t>(b->segment_bytes));
    stats_.segments.sub(1);
    ++stats_.num_source_frees;
    delete b;
  }
}

Block* CachingAllocator::allocate(size_t bytes) {
  const size_t rounded = round_size(bytes);
  Pool& pool = pool_for(rounded);
  Block* b = try_pool(pool, rounded);
  if (!b) b = new_segment(pool, rounded);
  if (!b) {
    ++stats_.num_ooms;
    throw OutOfMemory("out of memory: tried to allocate " + format_bytes(static_cast<int64_t>(bytes)) + " (reserved " +
                      format_bytes(stats_.reserved_bytes.current) + " of capacity " +
                      (capacity_ > 0 ? format_bytes(static_cast<int64_t>(capacity_)) : std::string("unlimited")) +
                      ", allocated " + format_bytes(stats_.allocated_bytes.current) + ")");
  }
  // Split off the tail when it is worth keeping: any 512 B in the small pool; in the large
  // pool only more than 1 MiB, so that large segments are not shredded into slivers.
  const size_t remaining = b->size - rounded;
  const bool split = pool.small ? remaining >= kRound : remaining > kSmallSize;
  if (split) {
    Block* rest = new Block;
    rest->size = remaining;
    rest->ptr = static_cast<char*>(b->ptr) + rounded;
    rest->small_pool = b->small_pool;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = rounded;
    pool.free_blocks.insert(rest);
  }
  b->allocated = true;
  b->requested = bytes;
  stats_.requested_bytes.add(static_cast<int64_t>(bytes));
  stats_.allocated_bytes.add(static_cast<int64_t>(b->size));
  stats_.active_blocks.add(1);
  ++stats_.num_allocs;
  return b;
}

void CachingAllocator::free(Block* b) {
  if (!b) return;
  ACTBENCH_CHECK(b->allocated, "CachingAllocator::free of a block that is not allocated");
  Pool& pool = b->small_pool ? *small_ : *large_;
  stats_.requested_bytes.sub(static_cast<int64_t>(b->requested));
  stats_.allocated_bytes.sub(static_cast<int64_t>(b->size));
  stats_.active_blocks.sub(1);
  ++stats_.num_frees;
  b->allocated = false;
  b->requested = 0;
  // Merge with free neighbours of the same segment.
  if (Block* n = b->next; n && !n->allocated) {
    pool.free_blocks.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
  }
  if (Block* p = b->prev; p && !p->allocated) {
    pool.free_blocks.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    delete b;
    b = p;
  }
  pool.free_blocks.insert(b);
}

void* CachingAllocator::block_ptr(const Block* b) { return b->ptr; }
size_t CachingAllocator::block_size(const Block* b) { return b->size; }

void CachingAllocator::reset_peak() {
  stats_.requested_bytes.reset_peak();
  stats_.allocated_bytes.reset_peak();
  stats_.reserved_bytes.reset_peak();
  stats_.active_blocks.reset_peak();
  stats_.segments.reset_peak();
}

void CachingAllocator::empty_cache() {
  release_free_segments(*small_);
  release_free_segments(*large_);
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while ((v >= 1024.0 || v <= -1024.0) && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace actbench
