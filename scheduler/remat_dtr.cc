// The `dtr` policy: Dynamic Tensor Rematerialization (Kirisame, Lyubomirsky,
// Haan, Brennan, He, Roesch, Chen and Tatlock, ICLR 2021) run ahead of time
// as a planner.
//
// Note [DTR as a planner]. We replay the graph's own order (the program a
// framework would run) against the budget. Before each operation its
// inputs are made resident: an evicted input is rematerialised by running
// its own operation again, recursively (an explicit stack, so deep chains
// are safe). Inputs already resident are pinned for the operation. When
// the operation would take the device past the budget (resident bytes plus
// its output and workspace), we evict, one at a time, the resident tensor
// with the least
//     h(t) = c(t) / (bytes(t) x staleness(t))
// among those that are not persistent, not pinned and not empty. c(t) is
// h_DTR-eq's cost (the paper's section 4): t's own cost plus the cost of its
// evicted neighbourhood, approximated with union-find classes of evicted
// tensors (evicting t merges it with its evicted inputs and readers; a
// rematerialisation subtracts its cost from its class, never splits it).
// staleness(t) = steps since t was last computed or read, plus one.
// Candidates: on graphs of at most kExactNodes nodes (every zoo model),
// every evictable resident tensor; on larger ones max(kMinDraws,
// sqrt(pool)) of them drawn with a seeded SplitMix64 (PlannerOptions::seed),
// which is DTR's own search-space reduction (the paper's appendix: sampling
// sqrt(n) tensors costs little overhead). An eviction then costs
// O(sqrt(n) x degree), not O(n x degree).
// Costs are clamped below by CostEpsilon() (1e-9 of the mean cost) so a
// zero-cost tensor is the first to go but zero-cost ones still rank by size
// and age; ties: larger bytes, then the smaller id. A tensor that no later
// operation reads, that is not an output and that no evicted, still-needed
// tensor reads is freed at once (SPEC's free at last use; DTR's banishing);
// an evicted tensor holds its inputs until it is rematerialised. Evicting
// a tensor revives its banished inputs as evicted tensors (their costs are
// added to h), and theirs, up to the run's revival depth (DTR's rule is
// one level; Note [Deeper revivals]); a tensor whose banished history
// reaches deeper is locked (never evicted). At the end, evicted outputs are
// rematerialised. If nothing more can be evicted the operation runs over
// budget (the plan is then infeasible); a run that recomputes more than
// 64 x (nodes) + 10^4 times, or scans more than 3 x 10^8 candidates, is
// abandoned (thrashing), and so is a run past the time limit.
//
// Budget: the byte budget as given; --budget min sweeps budgets of 95%,
// 90%, ..., 5% of the baseline peak (down to the floor: the persistent
// bytes plus the larger of the largest single operation, its inputs,
// output and workspace, and the bytes of the outputs, which are all
// resident at the end), then bisects between the
// smallest budget met and the largest failed below it (DTR is not monotone
// in the budget, so this is a search, not a guarantee), and keeps the
// lowest simulated peak. When DTR cannot meet a byte budget we return its
// lowest-peak plan, infeasible; a budget below the floor is not run (no
// schedule meets it, and a run would thrash until its recompute limit).
// Time limit: checked every 256 computes and 64 evictions; a cut run is
// dropped and the plan is the best of the runs done (the baseline first).
// Effort: the --budget min search (and the fallback when a budget is
// missed) stops starting runs once kSearchComputesPerDepth compute steps
// per run of a budget have been simulated over all runs, a deterministic
// bound: on graphs of a few thousand nodes every planned run happens; on
// 10^5 nodes a handful do.
// Not optimal: eviction is greedy and online; on a chain it holds no
// checkpoints deliberately, so at tight budgets it recomputes much more
// than Revolve: on `linear:n=100` with 8 unit pebbles its overhead is 2.08
// where revolve's is 0.92.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/status.h"
#include "scheduler/policies.h"
#include "scheduler/remat.h"

namespace pebble {
namespace {

// SplitMix64 (Steele, Lea and Flood 2014): the candidate sampler's
// generator, the same sequence on every platform.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // In [0, n); n > 0. The modulo bias (n / 2^64) is irrelevant here.
  int Below(int n) { return static_cast<int>(Next() % static_cast<uint64_t>(n)); }

 private:
  uint64_t state_;
};

struct DtrRun {
  Schedule schedule;
  bool completed = false;  // every output resident at the end
  bool over_budget = false;
  int64_t evictions = 0;
  int64_t rematerializations = 0;
  int64_t computes = 0;  // compute steps simulated, completed or not
};

class DtrSimulation {
 public:
  // `deadline` may be null (no limit).
  // `revival_depth`: how deep a banished history an eviction may revive
  // (RevivedWith); 1 is the paper's rule.
  DtrSimulation(const Graph& graph, int64_t budget, uint64_t seed, const Deadline* deadline,
                int revival_depth)
      : g_(graph),
        budget_(budget),
        n_(graph.num_nodes()),
        revival_depth_(revival_depth),
        rng_(seed),
        deadline_(deadline) {
    eps_ = CostEpsilon(graph);
    resident_.assign(n_, 0);
    evicted_.assign(n_, 0);
    pinned_.assign(n_, 0);
    holds_.assign(n_, 0);
    held_.assign(n_, 0);
    remaining_.assign(n_, 0);
    last_access_.assign(n_, 0);
    pool_index_.assign(n_, -1);
    parent_.resize(n_);
    class_cost_.assign(n_, 0.0);
    for (NodeId v = 0; v < n_; ++v) {
      parent_[v] = v;
      if (graph.persistent(v)) {
        resident_[v] = 1;
        device_ += graph.bytes(v);
      }
    }
    order_ = DefaultOrder(graph);
    for (NodeId v : order_) {
      for (NodeId u : graph.unique_inputs(v)) ++remaining_[u];
    }
    max_computes_ = 64 * static_cast<int64_t>(n_) + 10000;
  }

  DtrRun Run() {
    DtrRun run = RunSteps();
    run.computes = computes_;
    return run;
  }

 private:
  DtrRun RunSteps() {
    for (NodeId v : order_) {
      if (!Materialize(v, /*program=*/true)) return std::move(run_);
    }
    // Outputs evicted on the way come back, the resident ones pinned. An
    // output that an earlier one's rematerialisation made resident again
    // (its input) is pinned as it is met: unpinned, a later output's room
    // evicted it, and the schedule ended without it (an invalid schedule,
    // found by a sweep of random graphs).
    std::vector<uint8_t> kept(n_, 0);
    for (NodeId o : g_.outputs()) {
      if (resident_[o] && !kept[o]) {
        kept[o] = 1;
        ++pinned_[o];
      }
    }
    for (NodeId o : g_.outputs()) {
      if (kept[o]) continue;
      if (!resident_[o] && !Materialize(o, /*program=*/false)) return std::move(run_);
      kept[o] = 1;
      ++pinned_[o];
    }
    run_.completed = true;
    return std::move(run_);
  }

  double Cost(NodeId v) const { return std::max(g_.cost(v), eps_); }

  NodeId Find(NodeId v) {
    while (parent_[v] != v) {
      parent_[v] = parent_[parent_[v]];
      v = parent_[v];
    }
    return v;
  }
  void Union(NodeId a, NodeId b) {
    a = Find(a);
    b = Find(b);
    if (a == b) return;
    if (b < a) std::swap(a, b);  // deterministic root: the smaller id
    parent_[b] = a;
    class_cost_[a] += class_cost_[b];
  }

  void PoolAdd(NodeId v) {
    pool_index_[v] = static_cast<int>(pool_.size());
    pool_.push_back(v);
  }
  void PoolRemove(NodeId v) {
    const int i = pool_index_[v];
    const NodeId last = pool_.back();
    pool_[i] = last;
    pool_index_[last] = i;
    pool_.pop_back();
    pool_index_[v] = -1;
  }

  void Free(NodeId v) {
    run_.schedule.steps.push_back({Action::kFree, v});
    resident_[v] = 0;
    device_ -= g_.bytes(v);
    PoolRemove(v);
  }

  // Still needed: a later operation reads it, it is an output, or an
  // evicted tensor that is still needed reads it (its rematerialisation
  // will).
  bool Needed(NodeId v) const {
    return remaining_[v] > 0 || g_.is_output(v) || holds_[v] > 0;
  }
  // A resident tensor that is no longer needed.
  bool Garbage(NodeId v) const {
    return resident_[v] && !g_.persistent(v) && !Needed(v) && pinned_[v] == 0;
  }

  // A banished input (freed for good, neither resident nor evicted) of t:
  // evicting t revives it as an evicted tensor, so that t can come back by
  // recomputing it from its own inputs, and so with a banished input of
  // that input, and so on: RevivedWith(t) collects them, at most
  // revival_depth_ deep and, past the first level, kMaxRevived in all. t is locked when its
  // banished history reaches further: its history would have to be
  // recomputed without bound (DTR's rule for tensors with banished parents,
  // one level deep in the paper; Note [Deeper revivals]).
  bool Banished(NodeId u) const { return !resident_[u] && !evicted_[u]; }
  // The banished tensors that evicting t revives (t's banished inputs at
  // depth 1, theirs at depth 2, ...; each once) into `revived`; false where
  // they reach past the bounds (t is then locked).
  bool RevivedWith(NodeId t, std::vector<NodeId>& revived) const {
    revived.clear();
    auto visit = [&](NodeId x, int depth) {
      for (NodeId u : g_.unique_inputs(x)) {
        if (!Banished(u)) continue;  // persistent nodes are resident
        if (std::find(revived.begin(), revived.end(), u) != revived.end()) continue;
        // (the paper's one level has no bound on how many)
        if (depth > revival_depth_ ||
            (depth > 1 && static_cast<int>(revived.size()) >= kMaxRevived)) {
          return false;
        }
        revived.push_back(u);
      }
      return true;
    };
    if (!visit(t, 1)) return false;
    size_t level = 0;  // revived[level, end) were found at depth - 1
    for (int depth = 2; level < revived.size(); ++depth) {
      const size_t end = revived.size();
      for (size_t i = level; i < end; ++i) {
        if (!visit(revived[i], depth)) return false;
      }
      level = end;
    }
    return true;
  }
  // An evicted tensor that is still needed holds its inputs (DTR banishes a
  // tensor only when no evicted tensor depends on it).
  void Hold(NodeId v) {
    held_[v] = 1;
    for (NodeId u : g_.unique_inputs(v)) {
      if (!g_.persistent(u)) ++holds_[u];
    }
  }
  // Drops v's holds; inputs that are no longer needed go: resident ones are
  // freed, evicted ones drop their own holds in turn (a worklist).
  void Release(NodeId v) {
    release_.clear();
    release_.push_back(v);
    while (!release_.empty()) {
      const NodeId x = release_.back();
      release_.pop_back();
      if (!held_[x]) continue;
      held_[x] = 0;
      for (NodeId u : g_.unique_inputs(x)) {
        if (g_.persistent(u)) continue;
        --holds_[u];
        if (Garbage(u)) {
          Free(u);
        } else if (evicted_[u] && held_[u] && !Needed(u)) {
          Forget(u);
          release_.push_back(u);
        }
      }
    }
  }
  // An evicted tensor nothing needs any more leaves the evicted
  // neighbourhoods.
  void Forget(NodeId v) {
    evicted_[v] = 0;
    class_cost_[Find(v)] -= Cost(v);
  }

  // h of t, whose eviction revives `revived` (RevivedWith's): each costs a
  // recomputation with t's.
  double Score(NodeId t, const std::vector<NodeId>& revived) {
    double c = Cost(t);
    neighbours_.clear();
    for (NodeId u : g_.unique_inputs(t)) {
      if (evicted_[u]) neighbours_.push_back(Find(u));
    }
    for (NodeId u : revived) c += Cost(u);
    for (NodeId r : g_.readers(t)) {
      if (evicted_[r]) neighbours_.push_back(Find(r));
    }
    std::sort(neighbours_.begin(), neighbours_.end());
    neighbours_.erase(std::unique(neighbours_.begin(), neighbours_.end()), neighbours_.end());
    for (NodeId root : neighbours_) c += std::max(class_cost_[root], 0.0);
    scanned_ += 1 + static_cast<int64_t>(neighbours_.size());
    const double staleness = static_cast<double>(clock_ - last_access_[t] + 1);
    return c / (static_cast<double>(g_.bytes(t)) * staleness);
  }

  bool TimeUp() const { return deadline_ != nullptr && deadline_->Expired(); }

  // The eviction choice: the least h among the candidates (see the Note),
  // kNoNode when none is evictable. A sample that finds nothing evictable
  // falls back to the full scan, so "nothing left" is always exact.
  NodeId ChooseVictim() {
    NodeId best = kNoNode;
    double best_h = 0;
    auto offer = [&](NodeId t) {
      if (pinned_[t] != 0 || g_.bytes(t) == 0 || !RevivedWith(t, revived_)) return;  // locked
      const double h = Score(t, revived_);
      if (best == kNoNode || h < best_h ||
          (h == best_h && (g_.bytes(t) > g_.bytes(best) ||
                           (g_.bytes(t) == g_.bytes(best) && t < best)))) {
        best = t;
        best_h = h;
      }
    };
    const int size = static_cast<int>(pool_.size());
    if (g_.num_nodes() > kExactNodes && size > kMinDraws) {
      const int draws =
          std::max(kMinDraws, static_cast<int>(std::sqrt(static_cast<double>(size))));
      for (int k = 0; k < draws; ++k) {
        offer(pool_[rng_.Below(size)]);
      }
      if (best != kNoNode) return best;
    }
    for (NodeId t : pool_) offer(t);
    return best;
  }

  // Evicts until `need` more bytes fit; false when nothing is left to evict
  // (or the time limit passed: the run is then abandoned by the caller).
  bool MakeRoom(int64_t need) {
    while (device_ + need > budget_) {
      if ((run_.evictions & 63) == 63 && TimeUp()) return false;
      const NodeId best = ChooseVictim();
      if (best == kNoNode) return false;
      Free(best);
      ++run_.evictions;
      // Its banished history comes back as evicted tensors, held by `best`
      // (and each by the one that reads it).
      if (Needed(best)) {
        RevivedWith(best, revived_);
        for (NodeId u : revived_) {
          evicted_[u] = 1;
          parent_[u] = u;
          class_cost_[u] = Cost(u);
        }
        for (NodeId u : revived_) Hold(u);
      }
      evicted_[best] = 1;
      if (Needed(best)) Hold(best);
      parent_[best] = best;
      class_cost_[best] = Cost(best);
      for (NodeId u : g_.unique_inputs(best)) {
        if (evicted_[u]) Union(best, u);
      }
      for (NodeId r : g_.readers(best)) {
        if (evicted_[r]) Union(best, r);
      }
    }
    return true;
  }

  // Makes v resident: its inputs first (recursively), then its compute.
  // `program`: v is the next operation of the order (its reads count down
  // `remaining_`). False when the run is abandoned.
  bool Materialize(NodeId root, bool program) {
    stack_.clear();
    Push(root);
    while (!stack_.empty()) {
      Frame& f = stack_.back();
      const auto inputs = g_.unique_inputs(f.node);
      if (f.next < static_cast<int>(inputs.size())) {
        const NodeId u = inputs[f.next];
        if (g_.persistent(u)) {
          ++f.next;
        } else if (resident_[u]) {
          ++pinned_[u];
          ++f.next;
        } else {
          Push(u);  // rematerialise u, then come back to this input
        }
        continue;
      }
      const NodeId v = f.node;
      stack_.pop_back();
      if (++computes_ > max_computes_ || scanned_ > kMaxScanned) return false;
      if ((computes_ & 255) == 0 && TimeUp()) return false;
      if (!MakeRoom(g_.bytes(v) + g_.workspace(v))) run_.over_budget = true;
      ++clock_;
      run_.schedule.steps.push_back({Action::kCompute, v});
      resident_[v] = 1;
      device_ += g_.bytes(v);
      PoolAdd(v);
      last_access_[v] = clock_;
      if (evicted_[v]) {
        ++run_.rematerializations;
        Forget(v);
      }
      const bool is_program = program && stack_.empty();
      for (NodeId u : inputs) {
        if (g_.persistent(u)) continue;
        --pinned_[u];
        last_access_[u] = clock_;
        if (is_program) --remaining_[u];
      }
      if (held_[v]) Release(v);  // v is back: its inputs are free to go
      for (NodeId u : inputs) {
        if (Garbage(u)) Free(u);
      }
      if (is_program && Garbage(v)) Free(v);
    }
    return true;
  }

  void Push(NodeId v) {
    // Inputs already resident are pinned as the frame reaches them; the
    // frame itself pins nothing until then.
    stack_.push_back({v, 0});
  }

  struct Frame {
    NodeId node;
    int next;
  };
  static constexpr int64_t kMaxScanned = 300'000'000;
  // Graphs up to this size scan every candidate; larger ones sample.
  static constexpr int kExactNodes = 4096;
  static constexpr int kMinDraws = 32;
  // The most tensors of a banished history that an eviction revives past
  // its first level.
  static constexpr int kMaxRevived = 16;

  const Graph& g_;
  const int64_t budget_;
  const int n_;
  const int revival_depth_;
  double eps_ = 1e-9;
  std::vector<NodeId> order_;
  std::vector<uint8_t> resident_, evicted_;
  std::vector<int> pinned_, remaining_, holds_;
  std::vector<uint8_t> held_;
  std::vector<NodeId> release_;
  std::vector<NodeId> revived_;  // RevivedWith's, for the candidate at hand
  std::vector<int64_t> last_access_;
  std::vector<NodeId> pool_;  // resident non-persistent nodes
  std::vector<int> pool_index_;
  std::vector<NodeId> parent_;
  std::vector<double> class_cost_;
  std::vector<NodeId> neighbours_;
  std::vector<Frame> stack_;
  int64_t device_ = 0;
  int64_t clock_ = 0;
  int64_t computes_ = 0;
  int64_t max_computes_ = 0;
  int64_t scanned_ = 0;
  SplitMix64 rng_;
  const Deadline* deadline_;
  DtrRun run_;
};

DtrRun RunDtr(const Graph& graph, int64_t budget, uint64_t seed, const Deadline* deadline,
              int revival_depth) {
  return DtrSimulation(graph, budget, seed, deadline, revival_depth).Run();
}

// The largest single operation: a lower bound on any schedule's peak.
int64_t LargestOperation(const Graph& graph) {
  int64_t most = 0;
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (!graph.needed()[v] || graph.persistent(v)) continue;
    int64_t bytes = graph.bytes(v) + graph.workspace(v);
    for (NodeId u : graph.unique_inputs(v)) {
      if (!graph.persistent(u)) bytes += graph.bytes(u);
    }
    most = std::max(most, bytes);
  }
  return graph.persistent_bytes() + most;
}

// A lower bound on any schedule's peak: the largest operation, or every
// output resident at the end, whichever is more.
int64_t PeakFloor(const Graph& graph) {
  int64_t outputs = graph.persistent_bytes();
  for (NodeId o : graph.outputs()) {
    if (!graph.persistent(o)) outputs += graph.bytes(o);
  }
  return std::max(LargestOperation(graph), outputs);
}

// Note [Deeper revivals]. The paper's rule locks a tensor whose banished
// input has a banished input of its own. A chain of cheap operations whose
// results the backward does not read (a clone, then an in-place add made
// functional, then a relu_) then locks the chain's end, each layer's
// output: on such a six-layer net dtr recomputed nothing at any budget
// (129,784 bytes at `min`, the unplanned step), and a two-layer transformer
// stopped at 16.8 MB where rotor reached 16.2. Reviving a history up to
// kDeepRevival deep reaches 52,216 bytes and 16.5 MB there, but as a greedy
// rule it evicts otherwise elsewhere, and is sometimes slower at a budget
// both meet (resnet50 at 60%: 9.1% of recomputation against 5.2%). So each
// budget is run both ways, and the plan selector keeps the better. The
// paper's rule alone is the policy dtr-paper, which hybrid also starts
// from: swaps on top of its plan may reach lower than on dtr's
// (transformer:layers=4,seq=256 at min: 31.0 MB against 31.8).
class DtrPlanner final : public Planner {
 public:
  static constexpr int kDeepRevival = 4;
  // `revival_depths`: the runs of each budget (dtr: 1 and kDeepRevival;
  // dtr-paper: 1).
  explicit DtrPlanner(std::vector<int> revival_depths)
      : revival_depths_(std::move(revival_depths)),
        search_computes_(kSearchComputesPerDepth *
                         static_cast<int64_t>(revival_depths_.size())) {}

  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    PlanSelector selector(graph, options);
    selector.Consider(BaselineSchedule(graph), {{"plan", "baseline"}});
    int64_t simulated = 0;  // compute steps over all runs
    // Runs DTR at `budget` with the paper's revivals and with deeper ones
    // (Note [Deeper revivals]); whether either met it.
    auto attempt = [&](int64_t budget) -> bool {
      bool met = false;
      Schedule shallow;
      for (int depth : revival_depths_) {
        if (selector.TimeUp()) break;
        DtrRun run = RunDtr(graph, budget, options.seed, &selector.deadline(), depth);
        simulated += run.computes;
        if (!run.completed || (depth > 1 && run.schedule == shallow)) continue;
        met = met || !run.over_budget;
        if (depth == 1) shallow = run.schedule;
        selector.Consider(std::move(run.schedule),
                          {{"plan", "dtr"},
                           {"dtr_budget_bytes", budget},
                           {"revival_depth", depth},
                           {"evictions", run.evictions},
                           {"rematerializations", run.rematerializations}});
      }
      return met;
    };
    // DTR is not monotone in the budget, so a coarse sweep (95%, 90%, ...,
    // 5% of the baseline peak) comes before the bisection between the
    // smallest budget met and the largest one failed below it.
    auto lowest = [&] {
      const int64_t floor_bytes = PeakFloor(graph);
      const int64_t top = selector.best_peak();  // the baseline meets it
      std::vector<std::pair<int64_t, bool>> swept;  // budget, met
      ReportProgress(options, "dtr: budgets from 95% to 5% of the baseline peak",
                     selector.best_cost());
      for (int pct = 95; pct >= 5; pct -= 5) {
        const int64_t b = top / 100 * pct;
        if (b < floor_bytes || simulated > search_computes_) break;
        swept.emplace_back(b, attempt(b));
      }
      int64_t hi = top;
      for (const auto& [b, met] : swept) {
        if (met) hi = std::min(hi, b);
      }
      int64_t lo = floor_bytes - 1;
      for (const auto& [b, met] : swept) {
        if (!met && b < hi) lo = std::max(lo, b);
      }
      ReportProgress(options, absl::StrCat("dtr: bisecting between ", FormatBytes(lo + 1),
                                           " and ", FormatBytes(hi)),
                     selector.best_cost());
      for (int probe = 0; probe < 24 && hi - lo > std::max<int64_t>(1, hi / 2000) &&
                          simulated <= search_computes_;
           ++probe) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (attempt(mid)) {
          hi = mid;
        } else {
          lo = mid;
        }
      }
    };
    if (options.budget_bytes == PlannerOptions::kMinBudget) {
      lowest();
    } else if (!selector.best_fits()) {
      if (options.budget_bytes < PeakFloor(graph) || !attempt(options.budget_bytes) ||
          !selector.best_fits()) {
        lowest();
      }
    }
    return selector.Finish();
  }

 private:
  // Compute steps simulated over all runs of a search, per run of a budget.
  static constexpr int64_t kSearchComputesPerDepth = 2'000'000;
  const std::vector<int> revival_depths_;
  const int64_t search_computes_;
};

}  // namespace

void RegisterDtrPlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "dtr",
      .description = "Dynamic Tensor Rematerialization (Kirisame et al. 2021) as a "
                     "planner: the graph's own order under the budget, evicting the "
                     "least cost/(bytes x staleness) tensor (h_DTR-eq) and recomputing "
                     "evicted inputs on demand",
      .kind = PlanKind::kMultiShot,
      .exact = false,
      .factory =
          [] {
            return std::make_unique<DtrPlanner>(std::vector<int>{1, DtrPlanner::kDeepRevival});
          },
  });
  registry.Register(PolicyInfo{
      .name = "dtr-paper",
      .description = "dtr with the paper's rule alone: an eviction revives one level of "
                     "freed inputs (dtr also tries four, and plans as dtr-paper too, and "
                     "keeps the better plan)",
      .kind = PlanKind::kMultiShot,
      .exact = false,
      .factory = [] { return std::make_unique<DtrPlanner>(std::vector<int>{1}); },
  });
}

}  // namespace pebble
