#include "scheduler/planner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/status.h"
#include "scheduler/budget.h"

namespace pebble {

absl::string_view PlanKindName(PlanKind kind) {
  switch (kind) {
    case PlanKind::kOneShot: return "one-shot";
    case PlanKind::kMultiShot: return "multi-shot";
    case PlanKind::kOffload: return "offload";
  }
  return "?";
}

PlannerRegistry& PlannerRegistry::Global() {
  static PlannerRegistry* registry = [] {
    auto* r = new PlannerRegistry();
    RegisterBuiltinPlanners(*r);
    return r;
  }();
  return *registry;
}

void PlannerRegistry::Register(PolicyInfo info) {
  PEBBLE_CHECK(Find(info.name) == nullptr, "duplicate policy name");
  PEBBLE_CHECK(static_cast<bool>(info.factory), "policy without factory");
  policies_.push_back(std::move(info));
}

const PolicyInfo* PlannerRegistry::Find(absl::string_view name) const {
  for (const PolicyInfo& p : policies_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::vector<const PolicyInfo*> PlannerRegistry::List() const {
  std::vector<const PolicyInfo*> list;
  for (const PolicyInfo& p : policies_) list.push_back(&p);
  std::sort(list.begin(), list.end(),
            [](const PolicyInfo* a, const PolicyInfo* b) { return a->name < b->name; });
  return list;
}

absl::StatusOr<std::unique_ptr<Planner>> MakePlanner(absl::string_view name) {
  const PolicyInfo* info = PlannerRegistry::Global().Find(name);
  if (info == nullptr) {
    std::vector<std::string> names;
    for (const PolicyInfo* p : PlannerRegistry::Global().List()) {
      names.push_back(p->name);
    }
    return absl::NotFoundError(absl::StrCat("unknown policy '", name,
                                            "' (known: ", absl::StrJoin(names, ", "),
                                            "; see 'pebble policies')"));
  }
  return info->factory();
}

absl::StatusOr<PlanResult> FinishPlan(const Graph& graph, Schedule schedule,
                                      const PlannerOptions& options) {
  SimulatorOptions sim;
  sim.host_bandwidth_bytes_per_s = options.host_bandwidth_bytes_per_s;
  ASSIGN_OR_RETURN(PlanReport report, Simulate(graph, schedule, sim));
  PlanResult result;
  result.schedule = std::move(schedule);
  result.report = std::move(report);
  result.feasible = true;
  if (options.budget_bytes != PlannerOptions::kMinBudget &&
      result.report.peak_bytes > options.budget_bytes) {
    result.feasible = false;
    result.message = absl::StrCat("peak ", FormatBytes(result.report.peak_bytes),
                                  " (", result.report.peak_bytes,
                                  " bytes) exceeds the budget of ",
                                  FormatBytes(options.budget_bytes), " (",
                                  options.budget_bytes, " bytes)");
  }
  if (options.host_budget_bytes.has_value() &&
      result.report.host_peak_bytes > *options.host_budget_bytes) {
    result.feasible = false;
    if (!result.message.empty()) result.message += "; ";
    absl::StrAppend(&result.message, "host peak ",
                    FormatBytes(result.report.host_peak_bytes),
                    " exceeds the host budget of ",
                    FormatBytes(*options.host_budget_bytes));
  }
  return result;
}

}  // namespace pebble
