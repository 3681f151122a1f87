#include "runtime/tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pebble {

std::string TensorView::ToString() const {
  return absl::StrCat(DTypeName(dtype), ShapeToString(shape), "@",
                      absl::StrFormat("%p", static_cast<const void*>(data)));
}

}  // namespace pebble
