// Tensors as the runtime sees them: a typed, shaped window on memory that a
// backend owns (device memory; host memory for the CPU backend). Row-major,
// dense, PyTorch's layouts (SPEC section 3). A view never owns its memory.
#ifndef PEBBLE_RUNTIME_TENSOR_H_
#define PEBBLE_RUNTIME_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "graph/graph.h"

namespace pebble {

struct TensorView {
  std::byte* data = nullptr;  // backend memory; may be null when bytes() == 0
  Shape shape;
  DType dtype = DType::kFloat32;

  int64_t num_elements() const { return NumElements(shape); }
  int64_t bytes() const { return num_elements() * DTypeSize(dtype); }
  int rank() const { return static_cast<int>(shape.size()); }
  // Reinterprets the memory; the caller has checked the dtype.
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data);
  }
  // "fp32(2,3,4)@0x7f..": for error messages and traces.
  std::string ToString() const;
};

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_TENSOR_H_
