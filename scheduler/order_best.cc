// The `best-order` policy: every applicable one-shot order policy, the lowest
// peak kept (scheduler/orders.h). The default one-shot policy: it is never
// worse than `baseline` (which it includes) and optimal whenever `tree` or
// `exact-order` could run.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/status.h"
#include "scheduler/orders.h"
#include "scheduler/policies.h"
#include "scheduler/schedule.h"

namespace pebble {
namespace {

// Note [exact-order's searches remembered]. exact-order's search is
// deterministic: on a graph it finds the same order, or passes its state
// limit (a second or two of search: "the graph is too wide"), on every plan
// of that graph, whatever the budget or the policy composed with
// best-order. One process plans one graph many times: pebble.torch a
// captured step for each budget and policy, `compare` a row each, and a
// placement search (Note [Updates last]) through every composed policy for
// each of its probes (chen-greedy at min on mnist-cnn sharded over 3 ranks,
// clipped, every placement auto: 755 searches of 5 graphs, 17.6 s of its
// 18). So the process keeps the outcome of the last graphs' searches by
// fingerprint: the order found, which best-order takes at once (checked to
// be an order of the graph, and its candidate says "remembered"), or that
// the search passed the state limit, which best-order then skips (its
// candidate says so). A search stopped by the time limit, which depends on
// the time left, is not kept.
class ExactOrderMemo {
 public:
  using Key = std::tuple<uint64_t, int, int64_t>;  // fingerprint, nodes, state limit
  struct Outcome {
    bool too_wide = false;
    std::vector<NodeId> order;  // where not too wide
  };
  static Key KeyOf(const Graph& graph, int64_t max_states) {
    return {GraphFingerprint(graph), graph.num_nodes(), max_states};
  }
  static ExactOrderMemo& Global() {
    static ExactOrderMemo* memo = new ExactOrderMemo;
    return *memo;
  }
  std::optional<Outcome> Find(const Key& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [kept, outcome] : kept_) {
      if (kept == key) return outcome;
    }
    return std::nullopt;
  }
  void Keep(const Key& key, Outcome outcome) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (kept_.size() == kKept) kept_.pop_front();
    kept_.emplace_back(key, std::move(outcome));
  }

 private:
  static constexpr size_t kKept = 64;
  mutable std::mutex mutex_;
  std::deque<std::pair<Key, Outcome>> kept_;
};

// Whether `order` computes exactly the nodes of `graph`'s DefaultOrder
// (`nodes`), each once, after its inputs, and OrderPeak takes it (in-place
// updates after the reads of what they overwrite): a remembered order is
// the graph's own, should fingerprints collide.
bool IsOrderOf(const Graph& graph, std::vector<NodeId> nodes, const std::vector<NodeId>& order) {
  std::vector<NodeId> sorted = order;
  std::sort(nodes.begin(), nodes.end());
  std::sort(sorted.begin(), sorted.end());
  if (sorted != nodes) return false;
  std::vector<uint8_t> done(graph.num_nodes(), 0);
  for (NodeId v : order) {
    for (NodeId u : graph.unique_inputs(v)) {
      if (!graph.persistent(u) && !done[u]) return false;
    }
    done[v] = 1;
  }
  return OrderPeak(graph, order).ok();
}

// exact-order within `limits`, or its remembered outcome on the same graph
// and state limit (Note [exact-order's searches remembered]): the order
// (`remembered` then set), or at once a refusal where the search passed the
// limit. A graph past exact-order's node limit, which it refuses at once,
// is not fingerprinted (best-order runs in every composed policy, on graphs
// of any size).
absl::StatusOr<std::vector<NodeId>> ExactOrderRemembered(const Graph& graph,
                                                         const ExactOrderLimits& limits,
                                                         bool& remembered) {
  remembered = false;
  std::vector<NodeId> nodes = DefaultOrder(graph);
  if (static_cast<int64_t>(nodes.size()) > limits.max_nodes) {
    return ExactOrder(graph, limits);
  }
  ExactOrderMemo& memo = ExactOrderMemo::Global();
  const ExactOrderMemo::Key key = ExactOrderMemo::KeyOf(graph, limits.max_states);
  if (std::optional<ExactOrderMemo::Outcome> kept = memo.Find(key)) {
    if (kept->too_wide) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "exact-order: the search passed its limit of ", limits.max_states, " states on this "
          "graph before (the graph is too wide); not searched again"));
    }
    if (IsOrderOf(graph, std::move(nodes), kept->order)) {
      remembered = true;
      return kept->order;
    }
  }
  ExactOrderStats stats;
  absl::StatusOr<std::vector<NodeId>> order = ExactOrder(graph, limits, &stats);
  if (order.ok()) {
    memo.Keep(key, {false, *order});
  } else if (stats.states >= limits.max_states) {
    memo.Keep(key, {true, {}});
  }
  return order;
}

class BestOrderPlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    PlanMemo* memo = options.best_order_memo.get();
    if (memo == nullptr) return Search(graph, options);
    if (const PlanResult* kept = memo->Find(graph, options)) return *kept;
    ASSIGN_OR_RETURN(PlanResult plan, Search(graph, options));
    memo->Keep(graph, options, plan);
    return plan;
  }

 private:
  absl::StatusOr<PlanResult> Search(const Graph& graph, const PlannerOptions& options) const {
    const auto started = std::chrono::steady_clock::now();
    auto elapsed = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                           started)
          .count();
    };
    // The baseline order always runs; past the limit the other candidates
    // are skipped (each is one linear-ish pass, exact-order has its own
    // limit).
    const Deadline deadline(options.time_limit_s);
    nlohmann::json candidates = nlohmann::json::array();
    std::vector<NodeId> best;
    int64_t best_peak = 0;
    std::string winner;
    bool optimal = false;
    // Candidates in a fixed order; a later one wins only with a strictly
    // lower peak, so ties keep the simplest order (the graph's own first).
    // `make` builds the candidate's order, only when there is time for it.
    auto consider = [&](const std::string& name,
                        const std::function<absl::StatusOr<std::vector<NodeId>>()>& make,
                        bool exact) -> absl::Status {
      nlohmann::json entry = {{"policy", name}};
      if (!winner.empty() && deadline.Expired()) {
        entry["skipped"] = "time limit";
        candidates.push_back(std::move(entry));
        return absl::OkStatus();
      }
      absl::StatusOr<std::vector<NodeId>> order = make();
      if (!order.ok()) {
        entry["skipped"] = std::string(order.status().message());
        candidates.push_back(std::move(entry));
        return absl::OkStatus();
      }
      ASSIGN_OR_RETURN(const int64_t peak, OrderPeak(graph, *order));
      entry["peak_bytes"] = peak;
      candidates.push_back(std::move(entry));
      if (winner.empty() || peak < best_peak) {
        best = *std::move(order);
        best_peak = peak;
        winner = name;
      }
      optimal = optimal || exact;
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(consider("baseline", [&] { return DefaultOrder(graph); }, false));
    RETURN_IF_ERROR(consider("dfs", [&] { return DfsOrder(graph); }, false));
    RETURN_IF_ERROR(consider("greedy", [&] { return GreedyOrder(graph); }, false));
    RETURN_IF_ERROR(consider("tree", [&] { return TreeOrder(graph); }, true));
    if (!optimal) {
      // A quarter of exact-order's own state limit (about 1-3 s and 40 MB
      // at most), so that the default policy stays interactive; exact-order
      // alone searches further.
      ExactOrderLimits limits;
      limits.max_states = ExactOrderLimits().max_states / 4;
      limits.time_limit_s = std::max(0.0, options.time_limit_s - elapsed());
      limits.progress = ExactOrderProgress(options, "best-order");
      bool remembered = false;
      RETURN_IF_ERROR(consider(
          "exact-order", [&] { return ExactOrderRemembered(graph, limits, remembered); }, true));
      if (remembered) candidates.back()["remembered"] = true;
    } else {
      candidates.push_back(
          {{"policy", "exact-order"}, {"skipped", "tree is already optimal"}});
    }
    ASSIGN_OR_RETURN(PlanResult result, PlanFromOrder(graph, best, options));
    PEBBLE_CHECK(result.report.peak_bytes == best_peak,
                 "best-order: simulated peak differs from the order's");
    result.details["winner"] = winner;
    result.details["optimal"] = optimal;
    result.details["candidates"] = std::move(candidates);
    result.details["plan_s"] = elapsed();
    if (deadline.hit()) {
      NoteTimeLimit(result, options.time_limit_s, "the lowest peak of the orders built");
    }
    return result;
  }
};

}  // namespace

void RegisterBestOrderPlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "best-order",
      .description = "the lowest peak of baseline, dfs, greedy, tree (in-trees) "
                     "and exact-order (small graphs, within the time limit), "
                     "freed at last use; optimal when tree or exact-order "
                     "ran (details say which)",
      .kind = PlanKind::kOneShot,
      .exact = false,
      .factory = [] { return std::make_unique<BestOrderPlanner>(); },
  });
}

}  // namespace pebble
