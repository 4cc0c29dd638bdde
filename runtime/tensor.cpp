#include "runtime/tensor.hpp"

#include <sstream>

#include "runtime/error.hpp"

namespace actbench {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    if (__builtin_mul_overflow(n, d, &n))
      throw InvalidArgument("tensor of shape " + shape_str(s) + " has more elements than 64 bits can count");
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << ']';
  return o.str();
}

Storage::Storage(CachingAllocator* alloc, size_t bytes) : alloc_(alloc), block_(alloc->allocate(bytes)), bytes_(bytes) {}
Storage::~Storage() { alloc_->free(block_); }
void* Storage::data() const { return CachingAllocator::block_ptr(block_); }

Tensor::Tensor(CachingAllocator& alloc, Shape shape, DType dtype) : shape_(std::move(shape)), dtype_(dtype), defined_(true) {
  for (int64_t d : shape_)
    if (d < 0) throw InvalidArgument("negative tensor dimension in " + shape_str(shape_));
  int64_t bytes_signed = 0;
  if (__builtin_mul_overflow(numel(), static_cast<int64_t>(element_size()), &bytes_signed))
    throw InvalidArgument("tensor of shape " + shape_str(shape_) + " has more bytes than 64 bits can count");
  size_t n = bytes();
  if (n > 0) storage_ = std::make_shared<Storage>(&alloc, n);
}

void* Tensor::data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_bytes_;
}

Tensor Tensor::view(Shape shape) const {
  if (shape_numel(shape) != numel())
    throw InvalidArgument("view " + shape_str(shape) + " of tensor " + shape_str(shape_) + ": element count differs");
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  if (ndim() < 1 || begin < 0 || end < begin || end > dim(0))
    throw InvalidArgument("rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " + shape_str(shape_));
  Tensor t = *this;
  int64_t row = numel() / (dim(0) ? dim(0) : 1);
  t.shape_[0] = end - begin;
  t.offset_bytes_ += static_cast<size_t>(begin * row) * element_size();
  return t;
}

}  // namespace actbench
