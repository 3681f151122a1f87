// The operator table: every family's registration, sorted by name once.
#include <algorithm>
#include <string>
#include <vector>

#include "graph/ops.h"
#include "graph/ops/op_util.h"
#include "graph/status.h"

namespace pebble {
namespace {

const std::vector<OpDef>& Table() {
  static const std::vector<OpDef>* const table = [] {
    auto* defs = new std::vector<OpDef>;
    ops_internal::RegisterElementwiseOps(*defs);
    ops_internal::RegisterConvPoolOps(*defs);
    ops_internal::RegisterLinalgOps(*defs);
    ops_internal::RegisterNormOps(*defs);
    ops_internal::RegisterShapeOps(*defs);
    ops_internal::RegisterLossOps(*defs);
    ops_internal::RegisterOptimizerOps(*defs);
    ops_internal::RegisterMaskOps(*defs);
    std::sort(defs->begin(), defs->end(),
              [](const OpDef& a, const OpDef& b) { return a.name < b.name; });
    for (size_t i = 0; i < defs->size(); ++i) {
      const OpDef& d = (*defs)[i];
      PEBBLE_CHECK(d.infer != nullptr && d.flops != nullptr,
                   "op without inference or FLOP formula");
      PEBBLE_CHECK(d.max_inputs < 0 || d.max_inputs >= d.min_inputs,
                   "op with max_inputs < min_inputs");
      PEBBLE_CHECK(i == 0 || (*defs)[i - 1].name != d.name,
                   "op registered twice");
    }
    return defs;
  }();
  return *table;
}

}  // namespace

const OpDef* FindOp(absl::string_view name) {
  const std::vector<OpDef>& table = Table();
  auto it = std::lower_bound(
      table.begin(), table.end(), name,
      [](const OpDef& d, absl::string_view n) { return d.name < n; });
  if (it == table.end() || it->name != name) return nullptr;
  return &*it;
}

std::vector<std::string> OpNames() {
  std::vector<std::string> names;
  for (const OpDef& d : Table()) names.push_back(d.name);
  return names;
}

}  // namespace pebble
