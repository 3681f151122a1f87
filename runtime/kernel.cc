#include "runtime/kernel.h"

#include <algorithm>

#include "graph/status.h"

namespace pebble {

void KernelTable::Register(std::string op, KernelFn kernel) {
  PEBBLE_CHECK(kernel != nullptr);
  auto it = std::lower_bound(
      kernels_.begin(), kernels_.end(), op,
      [](const auto& entry, const std::string& key) { return entry.first < key; });
  PEBBLE_CHECK(it == kernels_.end() || it->first != op);  // duplicate kernel
  kernels_.insert(it, {std::move(op), kernel});
}

KernelFn KernelTable::Find(absl::string_view op) const {
  auto it = std::lower_bound(
      kernels_.begin(), kernels_.end(), op,
      [](const auto& entry, absl::string_view key) { return entry.first < key; });
  if (it == kernels_.end() || it->first != op) return nullptr;
  return it->second;
}

std::vector<std::string> KernelTable::Ops() const {
  std::vector<std::string> ops;
  ops.reserve(kernels_.size());
  for (const auto& [op, kernel] : kernels_) ops.push_back(op);
  return ops;
}

}  // namespace pebble
