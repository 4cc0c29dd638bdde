#pragma once
// Tensor: a shape, an element type and a reference-counted slice of an allocator block.
// Contiguous row-major always; views share storage (reshape, rows of dim 0).
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "runtime/allocator.hpp"
#include "runtime/dtype.hpp"

namespace actbench {

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

// One allocation; returns its block to the allocator when the last tensor lets go.
class Storage {
 public:
  Storage(CachingAllocator* alloc, size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const;
  size_t bytes() const { return bytes_; }
  Device device() const { return alloc_->device(); }

 private:
  CachingAllocator* alloc_;
  Block* block_;
  size_t bytes_;
};

class Tensor {
 public:
  Tensor() = default;
  // Allocates numel * dtype_size bytes from `alloc` (uninitialised).
  Tensor(CachingAllocator& alloc, Shape shape, DType dtype);

  bool defined() const { return defined_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(static_cast<size_t>(i < 0 ? i + ndim() : i)); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  size_t element_size() const { return dtype_size(dtype_); }
  size_t bytes() const { return static_cast<size_t>(numel()) * element_size(); }
  Device device() const { return storage_ ? storage_->device() : Device::host; }
  bool is_meta() const { return storage_ && storage_->device() == Device::meta; }

  void* data() const;
  template <class T> T* data_as() const { return static_cast<T*>(data()); }

  // Same storage, new shape with the same number of elements.
  Tensor view(Shape shape) const;
  // Rows [begin, end) of dim 0, sharing storage.
  Tensor rows(int64_t begin, int64_t end) const;
  // Number of tensors sharing this storage (for tests of ownership).
  long use_count() const { return storage_.use_count(); }
  const Storage* storage() const { return storage_.get(); }

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::fp32;
  size_t offset_bytes_ = 0;
  bool defined_ = false;
};

}  // namespace actbench
