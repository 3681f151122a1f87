// The `exact-order` policy: a minimum-peak execution order of any DAG
// (scheduler/orders.h, ExactOrder).
//
// Note [exact search]: a state is the set S of needed nodes computed so far
// (always a downset). Under free at last use the resident bytes mem(S) are a
// function of S (orders.h), so the orders form paths in the lattice of
// downsets from {} to all, a step S -> S + {v} (v ready: its inputs in S)
// costing mem(S) + bytes(v) + workspace(v), and the peak of an order is the
// largest cost on its path: a bottleneck shortest path, which Dijkstra's
// label-setting solves because labels never fall along a path. The number of
// downsets grows exponentially with the graph's width, hence the limits;
// three reductions keep common graphs small (orders.h lists them): an upper
// bound U from the heuristics, a static lower bound L that labels are
// clamped to (so the first complete set popped at L ends the search, and
// larger sets go first among equal labels), and free moves.
//
// Note [free moves]: let v be ready in S with d_S(v) = bytes(v) - (bytes of
// v's inputs whose last unread reader is v) <= 0 and cost mem(S) + bytes(v)
// + workspace(v) <= label(S). For any completion X1, X2, ... of S, computing
// v first does not raise any later step: mem(T + {v}) = mem(T) + d_T(v) and
// d_T(v) <= d_S(v) <= 0 for every T containing S (more of v's inputs have all
// their other readers computed), while v's own step is within label(S),
// which every completion of S reaches anyway. So v is taken without
// branching. The smallest such v (topological rank) goes first, which makes
// the closure deterministic and lets the order be rebuilt by replaying it.
// The bound label(S) may be raised to any lower bound on the peak of the
// completions of S, such as the state bound below.
//
// Note [state bound]: a node u computed before v stays resident during v's
// compute when it is an input of v, an output (never freed) or read by a
// strict descendant of v (that reader comes after v). Ancestors of v are
// computed before v in every order, so the ones that qualify give a static
// part, static_peak(v) (with v's bytes and workspace); any other qualifying
// u (the set held(v)) counts once it is in S. Hence every completion of S
// peaks at least at max over v outside S of persistent + static_peak(v) +
// bytes(S & held(v)). At S = {} this is the static lower bound L (for a
// training graph it already holds every activation saved for the backward
// pass while the loss is computed); during the search, a child whose bound
// reaches U is dropped, and free moves may go up to it.
#include <chrono>
#include <cstdint>
#include <memory>
#include <queue>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/status.h"
#include "scheduler/orders.h"
#include "scheduler/policies.h"

namespace pebble {
namespace {

// The needed non-persistent nodes renumbered 0..m-1 in topological order,
// with their inputs and needed readers in local numbers (compressed rows).
struct LocalGraph {
  int m = 0;
  int words = 0;  // uint64_t words per bitset
  std::vector<NodeId> node;  // local -> graph id
  std::vector<int64_t> bytes;
  std::vector<int64_t> workspace;
  std::vector<uint8_t> output;
  std::vector<int32_t> in_offsets{0};
  std::vector<int32_t> inputs;
  std::vector<int32_t> out_offsets{0};
  std::vector<int32_t> readers;
  // Note [state bound]: static_peak[v] is what is resident while v is
  // computed in any order (persistent bytes aside); held[v] (a bitset) the
  // nodes that are not ancestors of v but are resident while v is computed
  // whenever they were computed before it.
  std::vector<int64_t> static_peak;
  std::vector<uint64_t> held;  // m bitsets of `words` words
  // The transpose of held, compressed rows: the v whose held(v) holds u, so
  // that a cursor keeps bytes(S & held(v)) as it adds u (Cursor::Add).
  std::vector<int32_t> held_by_offsets{0};
  std::vector<int32_t> held_by;
  // The least other reader of any input of v (m if none): computing v
  // changes the free moves of no other node below it but these and, when v
  // frees bytes, those its step cost kept out (Cursor::Close).
  std::vector<int32_t> first_sibling;
  int64_t persistent_bytes = 0;

  explicit LocalGraph(const Graph& graph) {
    std::vector<int32_t> local(graph.num_nodes(), -1);
    for (NodeId v : graph.topological_order()) {
      if (!graph.needed()[v] || graph.persistent(v)) continue;
      local[v] = m++;
      node.push_back(v);
      bytes.push_back(graph.bytes(v));
      workspace.push_back(graph.workspace(v));
      output.push_back(graph.is_output(v) ? 1 : 0);
    }
    words = (m + 63) / 64;
    for (int i = 0; i < m; ++i) {
      for (NodeId u : graph.unique_inputs(node[i])) {
        if (local[u] >= 0) inputs.push_back(local[u]);
      }
      in_offsets.push_back(static_cast<int32_t>(inputs.size()));
      for (NodeId r : graph.readers(node[i])) {
        if (local[r] >= 0) readers.push_back(local[r]);
      }
      out_offsets.push_back(static_cast<int32_t>(readers.size()));
    }
    // Ancestors and strict descendants as bitsets (local ids are a
    // topological order).
    std::vector<uint64_t> anc(static_cast<size_t>(m) * words, 0);
    std::vector<uint64_t> desc(static_cast<size_t>(m) * words, 0);
    auto row = [&](std::vector<uint64_t>& sets, int i) { return &sets[size_t{1} * i * words]; };
    auto has = [&](const uint64_t* set, int i) { return (set[i >> 6] >> (i & 63)) & 1; };
    for (int i = 0; i < m; ++i) {
      for (int32_t k = in_offsets[i]; k < in_offsets[i + 1]; ++k) {
        const int32_t u = inputs[k];
        for (int w = 0; w < words; ++w) row(anc, i)[w] |= row(anc, u)[w];
        row(anc, i)[u >> 6] |= uint64_t{1} << (u & 63);
      }
    }
    for (int i = m - 1; i >= 0; --i) {
      for (int32_t k = out_offsets[i]; k < out_offsets[i + 1]; ++k) {
        const int32_t r = readers[k];
        for (int w = 0; w < words; ++w) row(desc, i)[w] |= row(desc, r)[w];
        row(desc, i)[r >> 6] |= uint64_t{1} << (r & 63);
      }
    }
    // u (computed before v) is resident during v's compute when it is an
    // input of v, an output, or read by a strict descendant of v.
    auto resident_during = [&](int u, int v) {
      if (output[u]) return true;
      for (int32_t k = out_offsets[u]; k < out_offsets[u + 1]; ++k) {
        if (readers[k] == v || has(row(desc, v), readers[k])) return true;
      }
      return false;
    };
    static_peak.assign(m, 0);
    held.assign(static_cast<size_t>(m) * words, 0);
    for (int v = 0; v < m; ++v) {
      static_peak[v] = bytes[v] + workspace[v];
      for (int u = 0; u < m; ++u) {
        if (u == v || has(row(desc, v), u) || !resident_during(u, v)) continue;
        if (has(row(anc, v), u)) {
          static_peak[v] += bytes[u];
        } else {
          row(held, v)[u >> 6] |= uint64_t{1} << (u & 63);
        }
      }
    }
    for (int u = 0; u < m; ++u) {
      for (int v = 0; v < m; ++v) {
        if (has(row(held, v), u)) held_by.push_back(v);
      }
      held_by_offsets.push_back(static_cast<int32_t>(held_by.size()));
    }
    first_sibling.assign(m, m);
    for (int v = 0; v < m; ++v) {
      for (int32_t k = in_offsets[v]; k < in_offsets[v + 1]; ++k) {
        const int32_t u = inputs[k];
        for (int32_t j = out_offsets[u]; j < out_offsets[u + 1]; ++j) {
          if (readers[j] != v) first_sibling[v] = std::min(first_sibling[v], readers[j]);
        }
      }
    }
    persistent_bytes = graph.persistent_bytes();
  }
};

// The search state being edited: the set S, per node the inputs not in S
// (for nodes outside S) and the readers not in S (for nodes in S), per node
// v the bytes of S & held(v) (Note [state bound]), and mem(S). Load()
// rebuilds it from a bitset; Add() computes one node.
class Cursor {
 public:
  explicit Cursor(const LocalGraph& g)
      : g_(g), set_(g.words, 0), missing_(g.m, 0), unread_(g.m, 0), held_bytes_(g.m, 0) {}

  void Load(const uint64_t* bits, int64_t mem) {
    std::copy(bits, bits + g_.words, set_.begin());
    mem_ = mem;
    std::fill(held_bytes_.begin(), held_bytes_.end(), 0);
    for (int u = 0; u < g_.m; ++u) {
      if (Has(u)) AddHeld(u);
    }
    for (int i = 0; i < g_.m; ++i) {
      int32_t missing = 0;
      for (int32_t k = g_.in_offsets[i]; k < g_.in_offsets[i + 1]; ++k) {
        missing += Has(g_.inputs[k]) ? 0 : 1;
      }
      missing_[i] = missing;
      int32_t unread = 0;
      for (int32_t k = g_.out_offsets[i]; k < g_.out_offsets[i + 1]; ++k) {
        unread += Has(g_.readers[k]) ? 0 : 1;
      }
      unread_[i] = unread;
    }
  }

  bool Has(int i) const { return (set_[i >> 6] >> (i & 63)) & 1; }
  bool Ready(int i) const { return !Has(i) && missing_[i] == 0; }
  int64_t mem() const { return mem_; }
  const std::vector<uint64_t>& set() const { return set_; }
  int64_t StepCost(int i) const { return mem_ + g_.bytes[i] + g_.workspace[i]; }

  // d_S(i): the change of mem(S) when i is computed.
  int64_t Delta(int i) const {
    int64_t d = g_.bytes[i];
    for (int32_t k = g_.in_offsets[i]; k < g_.in_offsets[i + 1]; ++k) {
      const int32_t u = g_.inputs[k];
      if (!g_.output[u] && unread_[u] == 1) d -= g_.bytes[u];
    }
    return d;
  }

  void Add(int i) {
    set_[i >> 6] |= uint64_t{1} << (i & 63);
    mem_ += Delta(i);
    AddHeld(i);
    for (int32_t k = g_.in_offsets[i]; k < g_.in_offsets[i + 1]; ++k) {
      --unread_[g_.inputs[k]];
    }
    for (int32_t k = g_.out_offsets[i]; k < g_.out_offsets[i + 1]; ++k) {
      --missing_[g_.readers[k]];
    }
  }

  // A lower bound on the peak of every completion of S (Note [state
  // bound]); 0 when S is complete.
  int64_t Bound() const {
    int64_t bound = 0;
    for (int v = 0; v < g_.m; ++v) {
      if (Has(v)) continue;
      bound = std::max(bound, g_.persistent_bytes + g_.static_peak[v] + held_bytes_[v]);
    }
    return bound;
  }

  // Note [free moves] with steps up to `threshold`; appends the nodes taken
  // and returns the largest step cost among them (0 if none). The smallest
  // free move goes first: after each, the scan goes on from the least node
  // that may have become one. Below the node i just taken none became ready
  // (its readers come after it); a node's d_S fell only where it shares an
  // input with i (LocalGraph::first_sibling); and every step cost fell only
  // where i freed bytes, which admits the nodes only their step cost kept
  // out (the least of them below the scan: cost_blocked).
  int64_t Close(int64_t threshold, std::vector<int32_t>* taken) {
    int64_t largest = 0;
    int cost_blocked = g_.m;
    for (int i = 0; i < g_.m;) {
      if (!Ready(i) || Delta(i) > 0) {
        ++i;
        continue;
      }
      if (StepCost(i) > threshold) {
        cost_blocked = std::min(cost_blocked, i);
        ++i;
        continue;
      }
      const bool frees = Delta(i) < 0;
      largest = std::max(largest, StepCost(i));
      Add(i);
      if (taken != nullptr) taken->push_back(i);
      int next = std::min(i + 1, g_.first_sibling[i]);
      if (frees) next = std::min(next, cost_blocked);
      if (next <= cost_blocked) cost_blocked = g_.m;  // scanned again
      i = next;
    }
    return largest;
  }

 private:
  // u joins S: it counts for every v whose held(v) holds it.
  void AddHeld(int u) {
    for (int32_t k = g_.held_by_offsets[u]; k < g_.held_by_offsets[u + 1]; ++k) {
      held_bytes_[g_.held_by[k]] += g_.bytes[u];
    }
  }

  const LocalGraph& g_;
  std::vector<uint64_t> set_;
  std::vector<int32_t> missing_;
  std::vector<int32_t> unread_;
  std::vector<int64_t> held_bytes_;  // bytes(S & held(v)), per v
  int64_t mem_ = 0;
};

// One move of the search: compute `v` (none if v < 0) from the cursor's
// state with path label `label`, then the free moves. Returns the new label
// (the largest step so far, at least the static lower bound) and sets
// *bound to the state bound after v. Free moves may go up to max(label,
// bound): every complete order through this state reaches that anyway.
int64_t Move(Cursor& cursor, int32_t v, int64_t label, int64_t* bound,
             std::vector<int32_t>* taken) {
  if (v >= 0) {
    label = std::max(label, cursor.StepCost(v));
    cursor.Add(v);
    if (taken != nullptr) taken->push_back(v);
  }
  *bound = cursor.Bound();
  return std::max(label, cursor.Close(std::max(label, *bound), taken));
}

// Every stored state, in columns, with an open-addressing index on the
// bitsets.
class StateTable {
 public:
  explicit StateTable(int words) : words_(words), slots_(1 << 12, -1) {}

  int32_t size() const { return static_cast<int32_t>(label_.size()); }
  const uint64_t* bits(int32_t s) const { return &bits_[int64_t{s} * words_]; }

  // The state holding `set`, or -1.
  int32_t Find(const std::vector<uint64_t>& set) const {
    const uint64_t h = Hash(set.data());
    for (size_t k = h & (slots_.size() - 1);; k = (k + 1) & (slots_.size() - 1)) {
      const int32_t s = slots_[k];
      if (s < 0) return -1;
      if (hash_[s] == h && std::equal(set.begin(), set.end(), bits(s))) return s;
    }
  }

  int32_t Insert(const std::vector<uint64_t>& set, int64_t label, int64_t mem,
                 int32_t parent, int32_t move, int32_t depth) {
    const int32_t s = size();
    bits_.insert(bits_.end(), set.begin(), set.end());
    hash_.push_back(Hash(set.data()));
    label_.push_back(label);
    mem_.push_back(mem);
    parent_.push_back(parent);
    move_.push_back(move);
    depth_.push_back(depth);
    expanded_.push_back(0);
    if (2 * static_cast<size_t>(size()) > slots_.size()) {
      Rehash(2 * slots_.size());
    } else {
      Place(s);
    }
    return s;
  }

  std::vector<int64_t> label_;
  std::vector<int64_t> mem_;
  std::vector<int32_t> parent_;
  std::vector<int32_t> move_;
  std::vector<int32_t> depth_;
  std::vector<uint8_t> expanded_;

 private:
  uint64_t Hash(const uint64_t* w) const {
    uint64_t h = 0x9e3779b97f4a7c15ULL;
    for (int k = 0; k < words_; ++k) {
      h ^= w[k] + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
      h *= 0xbf58476d1ce4e5b9ULL;
      h ^= h >> 31;
    }
    return h;
  }
  void Place(int32_t s) {
    for (size_t k = hash_[s] & (slots_.size() - 1);;
         k = (k + 1) & (slots_.size() - 1)) {
      if (slots_[k] < 0) {
        slots_[k] = s;
        return;
      }
    }
  }
  void Rehash(size_t capacity) {
    slots_.assign(capacity, -1);
    for (int32_t s = 0; s < size(); ++s) Place(s);
  }

  int words_;
  std::vector<uint64_t> bits_;
  std::vector<uint64_t> hash_;
  std::vector<int32_t> slots_;
};

struct QueueEntry {
  int64_t label;  // smaller first
  int32_t depth;  // larger first
  int64_t mem;    // smaller first
  int32_t state;  // smaller first
};
struct QueueAfter {
  bool operator()(const QueueEntry& a, const QueueEntry& b) const {
    if (a.label != b.label) return a.label > b.label;
    if (a.depth != b.depth) return a.depth < b.depth;
    if (a.mem != b.mem) return a.mem > b.mem;
    return a.state > b.state;
  }
};

// The nodes that state `s`'s recorded move and free moves added to its
// parent, replayed (Note [free moves]).
std::vector<int32_t> Replay(const LocalGraph& g, const StateTable& table,
                            int32_t s, int64_t lower_bound) {
  Cursor cursor(g);
  std::vector<int32_t> taken;
  const int32_t p = table.parent_[s];
  int64_t bound = 0;
  if (p < 0) {
    std::vector<uint64_t> empty(g.words, 0);
    cursor.Load(empty.data(), g.persistent_bytes);
    Move(cursor, -1, lower_bound, &bound, &taken);
  } else {
    cursor.Load(table.bits(p), table.mem_[p]);
    Move(cursor, table.move_[s], table.label_[p], &bound, &taken);
  }
  PEBBLE_CHECK(std::equal(cursor.set().begin(), cursor.set().end(), table.bits(s)),
               "exact-order: replay does not reach the stored state");
  return taken;
}

class ExactPlanner final : public Planner {
 public:
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    ExactOrderLimits limits;
    limits.time_limit_s = options.time_limit_s;
    limits.progress = ExactOrderProgress(options, "exact-order");
    ExactOrderStats stats;
    ASSIGN_OR_RETURN(std::vector<NodeId> order, ExactOrder(graph, limits, &stats));
    ASSIGN_OR_RETURN(PlanResult result, PlanFromOrder(graph, order, options));
    PEBBLE_CHECK(result.report.peak_bytes == stats.peak_bytes,
                 "exact-order: simulated peak differs from the search's");
    result.details["optimal"] = true;
    result.details["lower_bound_bytes"] = stats.lower_bound;
    result.details["heuristic_peak_bytes"] = stats.upper_bound;
    result.details["states"] = stats.states;
    result.details["expanded"] = stats.expanded;
    result.details["search_s"] = stats.seconds;
    if (result.message.empty()) result.message = "optimal order";
    return result;
  }
};

}  // namespace

std::function<void(int64_t, int64_t, int64_t)> ExactOrderProgress(const PlannerOptions& options,
                                                                  const char* name) {
  if (!options.progress) return nullptr;
  return [&options, name](int64_t expanded, int64_t best, int64_t bound) {
    ReportProgress(options, absl::StrCat(name, ": searching orders, ", expanded, " states"),
                   static_cast<double>(best), static_cast<double>(bound));
  };
}

absl::StatusOr<std::vector<NodeId>> ExactOrder(const Graph& graph,
                                               const ExactOrderLimits& limits,
                                               ExactOrderStats* stats) {
  const auto started = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
        .count();
  };
  ExactOrderStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  *stats = ExactOrderStats();

  const int64_t to_compute = static_cast<int64_t>(DefaultOrder(graph).size());
  if (to_compute > limits.max_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "exact-order: the graph has ", to_compute, " nodes to compute, more "
        "than its limit of ", limits.max_nodes, "; use best-order or greedy"));
  }
  const LocalGraph g(graph);  // O(m^2) bits: only below the limit

  // Upper bound: the best heuristic order (Note [exact search]).
  std::vector<NodeId> best = DefaultOrder(graph);
  ASSIGN_OR_RETURN(int64_t upper, OrderPeak(graph, best));
  for (GreedyDirection d : {GreedyDirection::kForward, GreedyDirection::kReverse}) {
    ASSIGN_OR_RETURN(std::vector<NodeId> order, GreedyOrder(graph, d));
    ASSIGN_OR_RETURN(const int64_t peak, OrderPeak(graph, order));
    if (peak < upper) {
      upper = peak;
      best = std::move(order);
    }
  }
  {
    ASSIGN_OR_RETURN(std::vector<NodeId> order, DfsOrder(graph));
    ASSIGN_OR_RETURN(const int64_t peak, OrderPeak(graph, order));
    if (peak < upper) {
      upper = peak;
      best = std::move(order);
    }
  }

  // Static lower bound: Note [state bound] at S = {}, and the outputs at the
  // end (the last compute peaks at least at the final memory).
  int64_t lower = g.persistent_bytes;
  int64_t final_bytes = g.persistent_bytes;
  for (int i = 0; i < g.m; ++i) {
    lower = std::max(lower, g.persistent_bytes + g.static_peak[i]);
    if (g.output[i]) final_bytes += g.bytes[i];
  }
  if (g.m > 0) lower = std::max(lower, final_bytes);
  stats->lower_bound = lower;
  stats->upper_bound = upper;
  stats->peak_bytes = upper;
  if (upper <= lower) {
    stats->seconds = elapsed();
    return best;  // the heuristic meets the lower bound
  }

  StateTable table(g.words);
  std::priority_queue<QueueEntry, std::vector<QueueEntry>, QueueAfter> queue;
  Cursor cursor(g);
  {
    std::vector<uint64_t> empty(g.words, 0);
    cursor.Load(empty.data(), g.persistent_bytes);
    int64_t bound = 0;
    const int64_t label = Move(cursor, -1, lower, &bound, nullptr);
    if (bound >= upper || label >= upper) {
      stats->seconds = elapsed();
      return best;  // nothing can beat the heuristic
    }
    int32_t depth = 0;
    for (uint64_t w : cursor.set()) depth += __builtin_popcountll(w);
    const int32_t s = table.Insert(cursor.set(), label, cursor.mem(), -1, -1, depth);
    queue.push({label, depth, cursor.mem(), s});
  }
  int32_t goal = -1;
  double reported_s = elapsed();
  while (!queue.empty()) {
    const QueueEntry e = queue.top();
    queue.pop();
    const int32_t s = e.state;
    if (table.expanded_[s] || e.label != table.label_[s]) continue;  // stale
    if (table.depth_[s] == g.m) {
      goal = s;
      break;
    }
    table.expanded_[s] = 1;
    ++stats->expanded;
    if ((stats->expanded & 255) == 0 && limits.progress && elapsed() >= reported_s + 1.0) {
      reported_s = elapsed();
      limits.progress(stats->expanded, upper, e.label);
    }
    if ((stats->expanded & 255) == 0 && elapsed() > limits.time_limit_s) {
      stats->states = table.size();
      stats->seconds = elapsed();
      return absl::ResourceExhaustedError(absl::StrCat(
          "exact-order: no optimum within the time limit of ",
          limits.time_limit_s, " s (", table.size(),
          " states); use best-order or greedy"));
    }
    const int64_t label = table.label_[s];
    // The ready nodes of S from a cursor loaded once; each child works on a
    // copy of it.
    cursor.Load(table.bits(s), table.mem_[s]);
    std::vector<int32_t> ready;
    for (int i = 0; i < g.m; ++i) {
      if (cursor.Ready(i) && cursor.StepCost(i) < upper) ready.push_back(i);
    }
    for (int32_t v : ready) {
      Cursor child = cursor;
      int64_t bound = 0;
      const int64_t child_label = Move(child, v, label, &bound, nullptr);
      if (bound >= upper || child_label >= upper) continue;  // cannot beat U
      int32_t child_depth = 0;
      for (uint64_t w : child.set()) child_depth += __builtin_popcountll(w);
      int32_t c = table.Find(child.set());
      if (c < 0) {
        if (table.size() >= limits.max_states) {
          stats->states = table.size();
          stats->seconds = elapsed();
          return absl::ResourceExhaustedError(absl::StrCat(
              "exact-order: the search passed its limit of ", limits.max_states,
              " states (the graph is too wide); use best-order or greedy"));
        }
        c = table.Insert(child.set(), child_label, child.mem(), s, v, child_depth);
      } else if (!table.expanded_[c] && child_label < table.label_[c]) {
        table.label_[c] = child_label;
        table.parent_[c] = s;
        table.move_[c] = v;
      } else {
        continue;
      }
      queue.push({child_label, child_depth, child.mem(), c});
    }
  }
  stats->states = table.size();
  if (goal < 0) {
    // Nothing beats the heuristic order: it is optimal.
    stats->seconds = elapsed();
    return best;
  }
  std::vector<int32_t> path;
  for (int32_t s = goal; s >= 0; s = table.parent_[s]) path.push_back(s);
  std::vector<NodeId> order;
  order.reserve(g.m);
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    for (int32_t i : Replay(g, table, *it, lower)) order.push_back(g.node[i]);
  }
  ASSIGN_OR_RETURN(const int64_t peak, OrderPeak(graph, order));
  PEBBLE_CHECK(peak == table.label_[goal], "exact-order: path peak mismatch");
  stats->peak_bytes = peak;
  stats->seconds = elapsed();
  return order;
}

void RegisterExactOrderPlanner(PlannerRegistry& registry) {
  registry.Register(PolicyInfo{
      .name = "exact-order",
      .description = "the execution order of minimum peak over all orders "
                     "(search over computed sets; up to 200 nodes, bounded by "
                     "the time limit), freed at last use",
      .kind = PlanKind::kOneShot,
      .exact = true,
      .factory = [] { return std::make_unique<ExactPlanner>(); },
  });
}

}  // namespace pebble
