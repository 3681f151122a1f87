// NumPy .npy files (format versions 1.0-3.0), the exchange format of tensors
// with PyTorch (SPEC section 5: --inputs DIR, --dump DIR). Only C-order
// (row-major) little-endian arrays of the dtypes pebble uses are taken.
// Format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
#ifndef PEBBLE_RUNTIME_NPY_H_
#define PEBBLE_RUNTIME_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace pebble {

struct NpyArray {
  Shape shape;
  DType dtype = DType::kFloat32;
  std::vector<uint8_t> data;  // NumElements(shape) * DTypeSize(dtype) bytes
};

// Reads an .npy file. Errors name the path: not a regular file, not an .npy
// file, Fortran order, big-endian, an unsupported dtype, a shape whose bytes
// overflow, a payload shorter or longer than the shape. Allocates no more
// than the file's size, whatever its header claims.
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

// Writes `array` as an .npy file (version 1.0). bf16 has no NumPy dtype and
// is refused: convert such a tensor to fp32 first.
absl::Status WriteNpy(const std::string& path, const NpyArray& array);

// The NumPy descr string of a dtype ("<f4", "<f2", "<i8", "|u1"), or an
// error for bf16, which NumPy does not have.
absl::StatusOr<std::string> NpyDescr(DType dtype);

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_NPY_H_
