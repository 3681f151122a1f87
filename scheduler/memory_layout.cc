#include "scheduler/memory_layout.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <queue>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/status.h"
#include "scheduler/budget.h"
#include "scheduler/simulator.h"

namespace pebble {
namespace {

std::vector<TensorInstance> InstancesOf(const Graph& graph,
                                        const Schedule& schedule);

int64_t RoundUp(int64_t bytes, int64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

// Steps the instances' lifetimes range over: at least one, so that the
// persistent nodes of an empty schedule have a step to live in.
int NumSlots(const Schedule& schedule) {
  return std::max<int>(1, static_cast<int>(schedule.steps.size()));
}

// max over steps of the sum of `size(i)` over the instances alive then.
int64_t PeakOf(const std::vector<TensorInstance>& instances, int slots,
               const std::function<int64_t(const TensorInstance&)>& size) {
  std::vector<int64_t> diff(slots + 1, 0);
  for (const TensorInstance& inst : instances) {
    diff[inst.first_step] += size(inst);
    diff[inst.last_step + 1] -= size(inst);
  }
  int64_t level = 0;
  int64_t peak = 0;
  for (int t = 0; t < slots; ++t) {
    level += diff[t];
    peak = std::max(peak, level);
  }
  return peak;
}

// Note [overlap index]: the placed instances whose lifetime meets a new one
// [s, e] are those alive at step s plus those that start in (s, e], two
// disjoint sets, each found in O(log K + answers) with a segment tree over
// the steps: `cover_` keeps every lifetime in its O(log K) canonical nodes
// (the nodes on the path from the root to leaf s hold exactly the lifetimes
// that contain s, each once), `starts_` keeps every instance in all the
// ancestors of the leaf of its first step (the canonical nodes of (s, e]
// hold exactly the instances that start there, each once). No duplicates,
// no scan of what does not overlap, whatever the lifetimes' lengths.
//
// Every instance goes into the tree once, before any is placed, in
// compressed rows (one array of entries, one of offsets per tree node); a
// query returns the placed ones only. A vector per tree node took 48 bytes
// a node before its entries (the whole layout of a 2-million-step schedule
// took 242 bytes a step, 127 with the rows); the rows take 16 bytes a node
// and 4 an entry. A query also passes over the instances not yet placed,
// which adds no more than the pairs it would meet once they are.
class OverlapIndex {
 public:
  OverlapIndex(const std::vector<TensorInstance>& instances, int slots)
      : size_(1), placed_(instances.size(), 0) {
    while (size_ < slots) size_ *= 2;
    // Two passes over the same walk: count the entries of each node (into
    // offsets[node + 1], summed into the end of each node's row), then fill
    // each row from its end, which leaves offsets[node + 1] at the row's
    // start: shifted by one, the offsets are the rows' starts.
    cover_.offsets.assign(2 * size_ + 1, 0);
    starts_.offsets.assign(2 * size_ + 1, 0);
    auto walk = [&](auto&& put) {
      for (int32_t i = 0; i < static_cast<int32_t>(instances.size()); ++i) {
        const TensorInstance& inst = instances[i];
        for (int lo = inst.first_step + size_, hi = inst.last_step + size_ + 1; lo < hi;
             lo >>= 1, hi >>= 1) {
          if (lo & 1) put(cover_, lo++, i);
          if (hi & 1) put(cover_, --hi, i);
        }
        for (int node = inst.first_step + size_; node >= 1; node >>= 1) put(starts_, node, i);
      }
    };
    walk([](Rows& rows, int node, int32_t) { ++rows.offsets[node + 1]; });
    for (Rows* rows : {&cover_, &starts_}) {
      for (size_t k = 1; k < rows->offsets.size(); ++k) rows->offsets[k] += rows->offsets[k - 1];
      rows->entries.resize(static_cast<size_t>(rows->offsets.back()));
    }
    walk([](Rows& rows, int node, int32_t i) { rows.entries[--rows.offsets[node + 1]] = i; });
    for (Rows* rows : {&cover_, &starts_}) {
      const int64_t total = static_cast<int64_t>(rows->entries.size());
      rows->offsets.erase(rows->offsets.begin());
      rows->offsets.push_back(total);
    }
  }

  void Add(int32_t i) { placed_[i] = 1; }

  // Placed instances overlapping `inst` in time, appended to `out`.
  void Overlapping(const TensorInstance& inst, std::vector<int32_t>& out) const {
    for (int node = inst.first_step + size_; node >= 1; node >>= 1) Append(cover_, node, out);
    for (int lo = inst.first_step + 1 + size_, hi = inst.last_step + size_ + 1; lo < hi;
         lo >>= 1, hi >>= 1) {
      if (lo & 1) Append(starts_, lo++, out);
      if (hi & 1) Append(starts_, --hi, out);
    }
  }

 private:
  struct Rows {
    std::vector<int64_t> offsets;  // node k's entries: [offsets[k], offsets[k + 1])
    std::vector<int32_t> entries;
  };

  void Append(const Rows& rows, int node, std::vector<int32_t>& out) const {
    for (int64_t k = rows.offsets[node]; k < rows.offsets[node + 1]; ++k) {
      if (placed_[rows.entries[k]]) out.push_back(rows.entries[k]);
    }
  }

  int size_;  // leaves: a power of two >= the number of steps
  std::vector<uint8_t> placed_;
  Rows cover_;
  Rows starts_;
};

// Places the instances in `order` (offline: every lifetime is known), each
// at the best-fitting gap among the already placed instances it overlaps in
// time: the smallest gap that holds it, the lowest on a tie, else on top of
// them all. Returns the arena. O(N log K + P + sum over instances of
// k log k), P the pairs of instances alive together, k the placed instances
// it overlaps.
int64_t PlaceOffline(std::vector<TensorInstance>& instances,
                     const std::vector<int32_t>& order, int slots,
                     int64_t alignment) {
  OverlapIndex index(instances, slots);
  std::vector<int32_t> overlapping;
  std::vector<std::pair<int64_t, int64_t>> busy;  // [offset, end), rounded
  int64_t arena = 0;
  for (int32_t i : order) {
    TensorInstance& inst = instances[i];
    const int64_t size = RoundUp(inst.bytes, alignment);
    if (size == 0) {
      inst.offset = 0;
      continue;
    }
    overlapping.clear();
    index.Overlapping(inst, overlapping);
    busy.clear();
    for (int32_t j : overlapping) {
      busy.push_back({instances[j].offset,
                      instances[j].offset + RoundUp(instances[j].bytes, alignment)});
    }
    std::sort(busy.begin(), busy.end());
    int64_t cursor = 0;  // end of the busy prefix
    int64_t chosen = -1;
    int64_t chosen_gap = INT64_MAX;
    for (const auto& [begin, end] : busy) {
      const int64_t gap = begin - cursor;
      if (gap >= size && gap < chosen_gap) {
        chosen = cursor;
        chosen_gap = gap;
      }
      cursor = std::max(cursor, end);
    }
    inst.offset = chosen >= 0 ? chosen : cursor;
    arena = std::max(arena, inst.offset + size);
    index.Add(i);
  }
  return arena;
}

// An allocator run in schedule order (online: a free ends a block, a compute
// or prefetch takes the smallest free block that holds it, the lowest on a
// tie, else grows the arena from its top; neighbouring free blocks merge),
// what a caching allocator would do with the same steps, and XLA's heap
// simulator's baseline. O(N log N) whatever the overlaps, so it is the one
// strategy that always runs. Returns the arena.
int64_t PlaceOnline(std::vector<TensorInstance>& instances, int slots,
                    int64_t alignment) {
  std::vector<std::vector<int32_t>> starting(slots);
  std::vector<std::vector<int32_t>> ending(slots);
  for (int32_t i = 0; i < static_cast<int32_t>(instances.size()); ++i) {
    if (RoundUp(instances[i].bytes, alignment) == 0) {
      instances[i].offset = 0;
      continue;
    }
    starting[instances[i].first_step].push_back(i);
    ending[instances[i].last_step].push_back(i);
  }
  std::set<std::pair<int64_t, int64_t>> by_offset;  // free (offset, size)
  std::set<std::pair<int64_t, int64_t>> by_size;    // free (size, offset)
  int64_t top = 0;  // everything at or above is free
  int64_t arena = 0;
  auto release = [&](int64_t offset, int64_t size) {
    auto next = by_offset.lower_bound({offset, 0});
    if (next != by_offset.end() && next->first == offset + size) {
      size += next->second;
      by_size.erase({next->second, next->first});
      next = by_offset.erase(next);
    }
    if (next != by_offset.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        offset = prev->first;
        size += prev->second;
        by_size.erase({prev->second, prev->first});
        by_offset.erase(prev);
      }
    }
    if (offset + size == top) {
      top = offset;  // the block reaches the top: lower the top instead
    } else {
      by_offset.insert({offset, size});
      by_size.insert({size, offset});
    }
  };
  for (int t = 0; t < slots; ++t) {
    for (int32_t i : starting[t]) {
      const int64_t size = RoundUp(instances[i].bytes, alignment);
      auto fit = by_size.lower_bound({size, 0});
      if (fit != by_size.end()) {
        const auto [block, offset] = *fit;
        by_size.erase(fit);
        by_offset.erase({offset, block});
        instances[i].offset = offset;
        if (block > size) {
          by_offset.insert({offset + size, block - size});
          by_size.insert({block - size, offset + size});
        }
      } else {  // no free block ends at the top (release() lowers it)
        instances[i].offset = top;
        top += size;
      }
      arena = std::max(arena, top);
    }
    for (int32_t i : ending[t]) {
      release(instances[i].offset, RoundUp(instances[i].bytes, alignment));
    }
  }
  return arena;
}

// The number of pairs of instances alive at a common step: the work of the
// offline strategies. Each pair is counted once, by the one that starts
// later (or, on the same step, by the later index): the instances alive at
// its first step that started before it.
int64_t OverlapPairs(const std::vector<TensorInstance>& instances, int slots) {
  std::vector<int64_t> started(slots + 1, 0);  // starts at steps < t
  std::vector<int64_t> ended(slots + 1, 0);    // ends at steps < t
  for (const TensorInstance& inst : instances) {
    ++started[inst.first_step + 1];
    ++ended[inst.last_step + 1];
  }
  for (int t = 0; t < slots; ++t) {
    started[t + 1] += started[t];
    ended[t + 1] += ended[t];
  }
  std::vector<int64_t> same_start(slots, 0);
  int64_t pairs = 0;
  for (const TensorInstance& inst : instances) {
    const int t = inst.first_step;
    pairs += started[t] - ended[t] + same_start[t]++;
  }
  return pairs;
}

int64_t Lifetime(const TensorInstance& inst) {
  return int64_t{inst.last_step} - inst.first_step + 1;
}

// Pisarchyk and Lee's breadth order: steps by decreasing memory (rounded
// sizes), each step's unplaced instances largest first. An instance is
// thus ranked by the best-ranked step of its lifetime: a range minimum over
// the step ranks (sparse table).
std::vector<int32_t> BreadthOrder(const std::vector<TensorInstance>& instances,
                                  int slots, int64_t alignment) {
  std::vector<int64_t> diff(slots + 1, 0);
  for (const TensorInstance& inst : instances) {
    const int64_t size = RoundUp(inst.bytes, alignment);
    diff[inst.first_step] += size;
    diff[inst.last_step + 1] -= size;
  }
  std::vector<int64_t> breadth(slots);
  int64_t level = 0;
  for (int t = 0; t < slots; ++t) breadth[t] = level += diff[t];
  std::vector<int32_t> steps(slots);
  for (int t = 0; t < slots; ++t) steps[t] = t;
  std::stable_sort(steps.begin(), steps.end(),
                   [&](int32_t a, int32_t b) { return breadth[a] > breadth[b]; });
  std::vector<std::vector<int32_t>> table(1, std::vector<int32_t>(slots));
  for (int r = 0; r < slots; ++r) table[0][steps[r]] = r;
  for (int k = 1; (1 << k) <= slots; ++k) {
    table.emplace_back(slots - (1 << k) + 1);
    for (int t = 0; t + (1 << k) <= slots; ++t) {
      table[k][t] = std::min(table[k - 1][t], table[k - 1][t + (1 << (k - 1))]);
    }
  }
  auto min_rank = [&](int lo, int hi) {
    int k = 0;
    while ((2 << k) <= hi - lo + 1) ++k;
    return std::min(table[k][lo], table[k][hi - (1 << k) + 1]);
  };
  std::vector<int32_t> rank(instances.size());
  for (size_t i = 0; i < instances.size(); ++i) {
    rank[i] = min_rank(instances[i].first_step, instances[i].last_step);
  }
  std::vector<int32_t> order(instances.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (rank[a] != rank[b]) return rank[a] < rank[b];
    if (instances[a].bytes != instances[b].bytes) {
      return instances[a].bytes > instances[b].bytes;
    }
    return Lifetime(instances[a]) > Lifetime(instances[b]);
  });
  return order;
}

}  // namespace

std::string MemoryLayout::ToString() const {
  return absl::StrFormat("arena %s for a peak of %s (%+.1f%%, %s), %d instances",
                         FormatBytes(arena_bytes), FormatBytes(peak_bytes),
                         100.0 * fragmentation, strategy,
                         static_cast<int>(instances.size()));
}

nlohmann::json MemoryLayout::ToJson(const Graph& graph) const {
  nlohmann::json list = nlohmann::json::array();
  for (const TensorInstance& inst : instances) {
    list.push_back({{"node", graph.id(inst.node)},
                    {"workspace", inst.workspace},
                    {"first_step", inst.first_step},
                    {"last_step", inst.last_step},
                    {"offset", inst.offset},
                    {"bytes", inst.bytes}});
  }
  return {{"arena_bytes", arena_bytes},
          {"peak_bytes", peak_bytes},
          {"aligned_peak_bytes", aligned_peak_bytes},
          {"fragmentation", fragmentation},
          {"alignment", alignment},
          {"strategy", strategy},
          {"instances", std::move(list)}};
}

namespace {

// TensorInstances() of a schedule already validated.
std::vector<TensorInstance> InstancesOf(const Graph& graph,
                                        const Schedule& schedule) {
  const int slots = NumSlots(schedule);
  std::vector<TensorInstance> instances;
  // Per storage root (the node itself without aliases): its current
  // instance, and how many nodes of D hold it (the simulator's count).
  std::vector<int32_t> open(graph.num_nodes(), -1);
  std::vector<int32_t> holders(graph.num_nodes(), 0);
  // A persistent tensor starts resident unless its home is the host; one
  // with a home may be freed (and prefetched again) like any other.
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (!graph.persistent(v) || graph.home(v) == Tier::kHost) continue;
    holders[v] = 1;
    if (graph.home(v).has_value()) open[v] = static_cast<int32_t>(instances.size());
    instances.push_back({v, false, 0, slots - 1, 0, graph.bytes(v)});
  }
  for (int k = 0; k < static_cast<int>(schedule.steps.size()); ++k) {
    const Step& step = schedule.steps[k];
    const NodeId v = step.node;
    const NodeId root = graph.storage(v);
    switch (step.action) {
      case Action::kCompute:
      case Action::kPrefetch:
        // Only a base starts a storage; an alias joins its base's.
        if (holders[root]++ == 0) {
          open[root] = static_cast<int32_t>(instances.size());
          instances.push_back({root, false, k, slots - 1, 0, graph.bytes(root)});
        }
        if (step.action == Action::kCompute && graph.workspace(v) > 0) {
          instances.push_back({v, true, k, k, 0, graph.workspace(v)});
        }
        break;
      case Action::kFree:
        PEBBLE_CHECK(holders[root] > 0, "free of a node without an instance");
        if (--holders[root] == 0) {
          PEBBLE_CHECK(open[root] >= 0, "free of a storage without an instance");
          instances[open[root]].last_step = k - 1;
          open[root] = -1;
        }
        break;
      case Action::kOffload:
      case Action::kHostCompute:  // host copies only: no device memory
      case Action::kAllReduce:    // in place: no device memory
        break;
    }
  }
  return instances;
}

// A small layout that the strategies leave above its lower bound: a local
// search over placement orders, from `order` (the best strategy's), each
// move swapping two instances and kept when the arena does not grow.
// Seeded, so the same schedule always gets the same layout. Only for at
// most kSearchInstances instances, with at most kSearchWork / instances
// placements (each costs about the instances times their overlaps), and it
// stops after kSearchStale moves without a smaller arena. Calls `better`
// with each smaller arena found.
void SearchPlacementOrder(
    const std::vector<TensorInstance>& instances, std::vector<int32_t> order, int slots,
    int64_t alignment, int64_t lower_bound,
    const std::function<void(std::vector<TensorInstance>, int64_t)>& better) {
  constexpr size_t kSearchInstances = 256;
  constexpr size_t kSearchWork = 100'000;
  constexpr int kSearchStale = 1000;
  if (order.size() < 2 || order.size() > kSearchInstances) return;
  const size_t placements = kSearchWork / order.size();
  std::vector<TensorInstance> placed = instances;
  int64_t best = PlaceOffline(placed, order, slots, alignment);
  std::mt19937_64 random(0x9e3779b97f4a7c15ULL);
  std::uniform_int_distribution<size_t> pick(0, order.size() - 1);
  int stale = 0;
  for (size_t k = 0; k < placements && stale < kSearchStale && best > lower_bound; ++k) {
    const size_t a = pick(random), b = pick(random);
    if (a == b) continue;
    std::swap(order[a], order[b]);
    placed = instances;
    const int64_t arena = PlaceOffline(placed, order, slots, alignment);
    ++stale;
    if (arena < best) {
      best = arena;
      stale = 0;
      better(placed, arena);
    } else if (arena > best) {
      std::swap(order[a], order[b]);  // undo; an equal arena is a sideways move
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<TensorInstance>> TensorInstances(
    const Graph& graph, const Schedule& schedule) {
  if (graph.has_auto_homes()) return TensorInstances(ResolveHomes(graph, schedule), schedule);
  RETURN_IF_ERROR(Simulate(graph, schedule).status());
  return InstancesOf(graph, schedule);
}

absl::StatusOr<MemoryLayout> PlanMemoryLayout(const Graph& graph,
                                              const Schedule& schedule,
                                              const LayoutOptions& options) {
  if (graph.has_auto_homes()) {
    return PlanMemoryLayout(ResolveHomes(graph, schedule), schedule, options);
  }
  const int64_t alignment = options.alignment;
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout alignment must be a power of two, not ", alignment));
  }
  ASSIGN_OR_RETURN(PlanReport report, Simulate(graph, schedule));
  std::vector<TensorInstance> instances = InstancesOf(graph, schedule);
  const int slots = NumSlots(schedule);
  const int32_t count = static_cast<int32_t>(instances.size());

  auto sorted = [&](const std::function<bool(const TensorInstance&,
                                             const TensorInstance&)>& before) {
    std::vector<int32_t> order(count);
    for (int32_t i = 0; i < count; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return before(instances[a], instances[b]);
    });
    return order;
  };
  MemoryLayout layout;
  layout.alignment = alignment;
  layout.peak_bytes = report.peak_bytes;
  layout.aligned_peak_bytes = PeakOf(instances, slots, [&](const TensorInstance& i) {
    return RoundUp(i.bytes, alignment);
  });
  bool have = false;
  auto keep = [&](const char* name, std::vector<TensorInstance> placed, int64_t arena) {
    if (!have || arena < layout.arena_bytes) {
      have = true;
      layout.arena_bytes = arena;
      layout.strategy = name;
      layout.instances = std::move(placed);
    }
  };
  // The offline strategies, while their work (about the overlapping pairs)
  // stays under kMaxOfflinePairs: a graph whose tensors all live long (a
  // 100,000-node random DAG holds some 30,000 at once) gets the online one
  // alone.
  constexpr int64_t kMaxOfflinePairs = 20'000'000;
  if (OverlapPairs(instances, slots) <= kMaxOfflinePairs) {
    struct Strategy {
      const char* name;
      std::vector<int32_t> order;
    };
    const Strategy strategies[] = {
        {"greedy-by-size",
         sorted([](const TensorInstance& a, const TensorInstance& b) {
           if (a.bytes != b.bytes) return a.bytes > b.bytes;
           if (Lifetime(a) != Lifetime(b)) return Lifetime(a) > Lifetime(b);
           return a.first_step < b.first_step;
         })},
        {"greedy-by-breadth", BreadthOrder(instances, slots, alignment)},
        {"greedy-by-area",
         sorted([](const TensorInstance& a, const TensorInstance& b) {
           // bytes * lifetime, compared without overflow in long double.
           const long double area_a = static_cast<long double>(a.bytes) * Lifetime(a);
           const long double area_b = static_cast<long double>(b.bytes) * Lifetime(b);
           if (area_a != area_b) return area_a > area_b;
           return a.bytes > b.bytes;
         })},
    };
    std::vector<int32_t> best_order;
    for (const Strategy& s : strategies) {
      std::vector<TensorInstance> placed = instances;
      const int64_t arena = PlaceOffline(placed, s.order, slots, alignment);
      if (!have || arena < layout.arena_bytes) best_order = s.order;
      keep(s.name, std::move(placed), arena);
      if (layout.arena_bytes == layout.aligned_peak_bytes) break;  // optimal
    }
    if (layout.arena_bytes > layout.aligned_peak_bytes) {
      SearchPlacementOrder(instances, best_order, slots, alignment, layout.aligned_peak_bytes,
                           [&](std::vector<TensorInstance> placed, int64_t arena) {
                             keep("greedy-by-search", std::move(placed), arena);
                           });
    }
  }
  if (!have || layout.arena_bytes > layout.aligned_peak_bytes) {
    std::vector<TensorInstance> placed = instances;
    const int64_t arena = PlaceOnline(placed, slots, alignment);
    keep("best-fit-in-order", std::move(placed), arena);
  }
  layout.fragmentation =
      layout.peak_bytes > 0
          ? static_cast<double>(layout.arena_bytes) / layout.peak_bytes - 1
          : 0;
  PEBBLE_CHECK(layout.arena_bytes >= layout.aligned_peak_bytes &&
                   layout.aligned_peak_bytes >= layout.peak_bytes,
               "layout below its lower bound");
  return layout;
}

absl::Status VerifyLayout(const Graph& graph, const Schedule& schedule,
                          const MemoryLayout& layout) {
  if (graph.has_auto_homes()) return VerifyLayout(ResolveHomes(graph, schedule), schedule, layout);
  ASSIGN_OR_RETURN(PlanReport report, Simulate(graph, schedule));
  const std::vector<TensorInstance> expected = InstancesOf(graph, schedule);
  const int64_t alignment = layout.alignment;
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("layout: alignment ", alignment, " is not a power of two"));
  }
  auto describe = [&](size_t i) {
    const TensorInstance& inst = layout.instances[i];
    return absl::StrCat(inst.workspace ? "workspace of '" : "'",
                        graph.id(inst.node), "' [steps ", inst.first_step, "-",
                        inst.last_step, ", bytes ", inst.offset, "-",
                        inst.offset + inst.bytes, ")");
  };
  if (layout.instances.size() != expected.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("layout: ", layout.instances.size(),
                     " instances, the schedule has ", expected.size()));
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    const TensorInstance& a = layout.instances[i];
    const TensorInstance& b = expected[i];
    if (a.node != b.node || a.workspace != b.workspace ||
        a.first_step != b.first_step || a.last_step != b.last_step ||
        a.bytes != b.bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("layout: instance ", i, " ", describe(i),
                       " does not match the schedule"));
    }
    if (a.offset < 0 || a.offset % alignment != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "layout: ", describe(i), " is not aligned to ", alignment, " bytes"));
    }
    if (a.offset + RoundUp(a.bytes, alignment) > layout.arena_bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("layout: ", describe(i), " ends past the arena of ",
                       layout.arena_bytes, " bytes"));
    }
  }
  // Sweep over the steps: the instances alive form disjoint intervals, kept
  // in an ordered set, so a new one need only be checked against its two
  // neighbours.
  std::vector<int32_t> by_start;
  for (size_t i = 0; i < layout.instances.size(); ++i) {
    if (layout.instances[i].bytes > 0) by_start.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(by_start.begin(), by_start.end(), [&](int32_t a, int32_t b) {
    return layout.instances[a].first_step < layout.instances[b].first_step;
  });
  using Ending = std::pair<int, int32_t>;  // (last_step, instance)
  std::priority_queue<Ending, std::vector<Ending>, std::greater<Ending>> ending;
  std::set<std::pair<int64_t, int32_t>> alive;  // (offset, instance)
  for (int32_t i : by_start) {
    const TensorInstance& inst = layout.instances[i];
    while (!ending.empty() && ending.top().first < inst.first_step) {
      alive.erase({layout.instances[ending.top().second].offset, ending.top().second});
      ending.pop();
    }
    const int64_t end = inst.offset + RoundUp(inst.bytes, alignment);
    auto after = alive.lower_bound({inst.offset, -1});
    if (after != alive.end() && after->first < end) {
      return absl::FailedPreconditionError(
          absl::StrCat("layout: ", describe(i), " overlaps ", describe(after->second)));
    }
    if (after != alive.begin()) {
      auto before = std::prev(after);
      const TensorInstance& b = layout.instances[before->second];
      if (b.offset + RoundUp(b.bytes, alignment) > inst.offset) {
        return absl::FailedPreconditionError(absl::StrCat(
            "layout: ", describe(i), " overlaps ", describe(before->second)));
      }
    }
    alive.insert({inst.offset, i});
    ending.push({inst.last_step, i});
  }
  const int slots = NumSlots(schedule);
  const int64_t raw_peak =
      PeakOf(expected, slots, [](const TensorInstance& i) { return i.bytes; });
  const int64_t aligned_peak = PeakOf(expected, slots, [&](const TensorInstance& i) {
    return RoundUp(i.bytes, alignment);
  });
  if (raw_peak != report.peak_bytes || layout.peak_bytes != report.peak_bytes ||
      layout.aligned_peak_bytes != aligned_peak) {
    return absl::FailedPreconditionError(absl::StrCat(
        "layout: peak ", layout.peak_bytes, " / aligned peak ",
        layout.aligned_peak_bytes, " differ from the schedule's ", report.peak_bytes,
        " / ", aligned_peak, " (instances sum to ", raw_peak, ")"));
  }
  if (layout.arena_bytes < aligned_peak) {
    return absl::FailedPreconditionError(
        absl::StrCat("layout: arena of ", layout.arena_bytes,
                     " bytes is below the aligned peak of ", aligned_peak));
  }
  return absl::OkStatus();
}

}  // namespace pebble
