// Shared machinery of the offload policies (scheduler/offload.h).
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "scheduler/budget.h"
#include "scheduler/offload.h"
#include "scheduler/simulator.h"

namespace pebble {

namespace {

// Sources in docs/offload.md: PCI-SIG base specifications 4.0 and 5.0 (x16,
// 128b/130b encoding: 31.5 and 63 GB/s raw per direction; about 80% of it
// is reached by pinned cudaMemcpyAsync), NVIDIA Grace Hopper Superchip
// architecture whitepaper (NVLink-C2C, 900 GB/s total, 450 GB/s a
// direction).
constexpr LinkPreset kPresets[] = {
    {"pcie4", 25e9, "PCIe 4.0 x16, usable bytes/s per direction (31.5 GB/s raw)"},
    {"pcie5", 55e9, "PCIe 5.0 x16, usable bytes/s per direction (63 GB/s raw)"},
    {"nvlink-c2c", 450e9, "NVLink-C2C (Grace Hopper), 450 GB/s per direction"},
};

}  // namespace

absl::Span<const LinkPreset> LinkPresets() { return kPresets; }

absl::StatusOr<double> ParseBandwidth(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  for (const LinkPreset& p : kPresets) {
    if (lower == p.name) return p.bytes_per_s;
  }
  absl::StatusOr<int64_t> bytes = ParseSize(text);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid bandwidth ", Quote(text),
        ": expected bytes per second (25e9, 55GB) or a link preset (pcie4, pcie5, nvlink-c2c)"));
  }
  const double bytes_per_s = static_cast<double>(*bytes);
  if (bytes_per_s < kMinBandwidthBytesPerS || bytes_per_s > kMaxBandwidthBytesPerS) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid bandwidth ", Quote(text), ": must lie between ", kMinBandwidthBytesPerS,
        " and ", kMaxBandwidthBytesPerS,
        " bytes per second, or be a link preset (pcie4, pcie5, nvlink-c2c)"));
  }
  return bytes_per_s;
}

bool IsHeavyOp(absl::string_view op) {
  return op == "conv2d" || op == "conv3d" || op == "linear" || op == "matmul";
}

// ---------------------------------------------------------------------------
// ComputeSequence

ComputeSequence::ComputeSequence(const Graph& graph, std::vector<NodeId> computes)
    : graph_(&graph), computes_(std::move(computes)) {
  const int n = graph.num_nodes();
  const int T = size();
  std::vector<int> current(n, -1);
  std::vector<std::vector<int>> readers(T);
  for (int p = 0; p < T; ++p) {
    const NodeId v = computes_[p];
    for (NodeId u : graph.unique_inputs(v)) {
      if (graph.persistent(u)) continue;
      PEBBLE_CHECK(current[u] >= 0, "compute sequence reads a node never computed");
      readers[current[u]].push_back(p);
    }
    current[v] = p;
  }
  final_output_.assign(T, 0);
  for (NodeId o : graph.outputs()) {
    if (!graph.persistent(o) && current[o] >= 0) final_output_[current[o]] = 1;
  }
  reader_offsets_.assign(1, 0);
  last_.resize(T);
  start_.resize(T);
  double t = 0;
  for (int i = 0; i < T; ++i) {
    readers_.insert(readers_.end(), readers[i].begin(), readers[i].end());
    reader_offsets_.push_back(static_cast<int32_t>(readers_.size()));
    last_[i] = final_output_[i] ? T - 1 : (readers[i].empty() ? i : readers[i].back());
    start_[i] = t;
    t += graph.cost(computes_[i]);
  }
}

ComputeSequence ComputeSequence::FromSchedule(const Graph& graph, const Schedule& schedule) {
  std::vector<NodeId> computes;
  for (const Step& s : schedule.steps) {
    if (s.action == Action::kCompute) computes.push_back(s.node);
  }
  return ComputeSequence(graph, std::move(computes));
}

namespace {

// The uses of instance i around position p: a = the last use before p (its
// production counts), b = the first use after p, -1 when none. `p` itself
// must not be a use for the pair to be a gap.
struct Gap {
  int a = -1;
  int b = -1;
};
Gap GapAround(const ComputeSequence& seq, int i, int p) {
  Gap g;
  if (p <= i) return g;
  auto r = seq.readers(i);
  auto it = std::lower_bound(r.begin(), r.end(), p);
  if (it != r.end() && *it == p) return g;  // p reads it: not a gap
  g.a = it == r.begin() ? i : *(it - 1);
  g.b = it == r.end() ? -1 : *it;
  return g;
}

}  // namespace

absl::Status CheckSwaps(const ComputeSequence& seq, absl::Span<const SwapInterval> swaps) {
  const Graph& g = seq.graph();
  std::vector<SwapInterval> sorted(swaps.begin(), swaps.end());
  std::sort(sorted.begin(), sorted.end(), [](const SwapInterval& x, const SwapInterval& y) {
    return std::tie(x.instance, x.evict_after) < std::tie(y.instance, y.evict_after);
  });
  for (size_t k = 0; k < sorted.size(); ++k) {
    const SwapInterval& s = sorted[k];
    if (s.instance < 0 || s.instance >= seq.size()) {
      return absl::InvalidArgumentError(absl::StrCat("swap of instance ", s.instance,
                                                     " out of range"));
    }
    const std::string& id = g.id(seq.node(s.instance));
    if (s.evict_after < s.instance || s.evict_after + 2 > s.prefetch_before ||
        s.prefetch_before >= seq.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "swap of '", id, "' (position ", s.instance, "): evict after ", s.evict_after,
          " and prefetch before ", s.prefetch_before, " are out of order"));
    }
    const Gap gap = GapAround(seq, s.instance, s.evict_after + 1);
    if (gap.a < 0 || gap.a > s.evict_after || gap.b < 0 || gap.b < s.prefetch_before) {
      return absl::InvalidArgumentError(absl::StrCat(
          "swap of '", id, "' (position ", s.instance, "): positions ", s.evict_after, "..",
          s.prefetch_before, " are not inside a gap between two uses"));
    }
    if (k > 0 && sorted[k - 1].instance == s.instance &&
        sorted[k - 1].prefetch_before > s.evict_after) {
      return absl::InvalidArgumentError(
          absl::StrCat("swaps of '", id, "' (position ", s.instance, ") overlap"));
    }
  }
  return absl::OkStatus();
}

namespace {

// Emission with the step index of every compute, offload and swap step, for
// the placement rounds.
struct Emitted {
  Schedule schedule;
  std::vector<int> compute_step;   // per position
  std::vector<int> offload_step;   // per swap: the node's offload step
  std::vector<int> prefetch_step;  // per swap
};

Emitted EmitDetailed(const ComputeSequence& seq, absl::Span<const SwapInterval> swaps) {
  PEBBLE_CHECK(CheckSwaps(seq, swaps).ok(), "invalid swap intervals");
  const Graph& g = seq.graph();
  const int T = seq.size();
  const int S = static_cast<int>(swaps.size());
  std::vector<std::vector<int>> prefetch_at(T), evict_at(T);
  std::vector<uint8_t> swapped(T, 0);
  for (int s = 0; s < S; ++s) {
    prefetch_at[swaps[s].prefetch_before].push_back(s);
    evict_at[swaps[s].evict_after].push_back(s);
    swapped[swaps[s].instance] = 1;
  }
  auto next_use = [&](int s) {
    return GapAround(seq, swaps[s].instance, swaps[s].evict_after + 1).b;
  };
  for (auto& list : prefetch_at) {
    std::sort(list.begin(), list.end(), [&](int x, int y) {
      const int bx = next_use(x), by = next_use(y);
      if (bx != by) return bx < by;
      return swaps[x].instance < swaps[y].instance;
    });
  }
  Emitted out;
  out.compute_step.resize(T);
  out.offload_step.assign(S, -1);
  out.prefetch_step.assign(S, -1);
  std::vector<int> node_offload(g.num_nodes(), -1);
  std::vector<int> current(g.num_nodes(), -1);
  std::vector<Step>& steps = out.schedule.steps;
  steps.reserve(2 * static_cast<size_t>(T) + 3 * static_cast<size_t>(S));
  for (int p = 0; p < T; ++p) {
    for (int s : prefetch_at[p]) {
      out.prefetch_step[s] = static_cast<int>(steps.size());
      steps.push_back({Action::kPrefetch, seq.node(swaps[s].instance)});
    }
    const NodeId v = seq.node(p);
    out.compute_step[p] = static_cast<int>(steps.size());
    steps.push_back({Action::kCompute, v});
    if (swapped[p] && node_offload[v] < 0) {
      node_offload[v] = static_cast<int>(steps.size());
      steps.push_back({Action::kOffload, v});
    }
    for (NodeId u : g.unique_inputs(v)) {
      if (g.persistent(u)) continue;
      const int q = current[u];
      if (seq.last(q) == p && !seq.final_output(q)) steps.push_back({Action::kFree, u});
    }
    current[v] = p;
    if (seq.last(p) == p && !seq.final_output(p)) steps.push_back({Action::kFree, v});
    for (int s : evict_at[p]) steps.push_back({Action::kFree, seq.node(swaps[s].instance)});
  }
  for (int s = 0; s < S; ++s) out.offload_step[s] = node_offload[seq.node(swaps[s].instance)];
  return out;
}

}  // namespace

Schedule EmitSwapSchedule(const ComputeSequence& seq, absl::Span<const SwapInterval> swaps) {
  return EmitDetailed(seq, swaps).schedule;
}

std::vector<int64_t> DuringBytes(const ComputeSequence& seq,
                                 absl::Span<const SwapInterval> swaps) {
  const Graph& g = seq.graph();
  const int T = seq.size();
  std::vector<int64_t> diff(T + 1, 0);
  for (int i = 0; i < T; ++i) {
    const int64_t b = g.bytes(seq.node(i));
    diff[i] += b;
    diff[seq.last(i) + 1] -= b;
  }
  for (const SwapInterval& s : swaps) {
    const int64_t b = g.bytes(seq.node(s.instance));
    diff[s.evict_after + 1] -= b;
    diff[s.prefetch_before] += b;
  }
  std::vector<int64_t> during(T);
  int64_t live = g.persistent_bytes();
  for (int p = 0; p < T; ++p) {
    live += diff[p];
    during[p] = live + g.workspace(seq.node(p));
  }
  return during;
}

int64_t HostBytes(const ComputeSequence& seq, absl::Span<const SwapInterval> swaps) {
  std::vector<NodeId> nodes;
  for (const SwapInterval& s : swaps) nodes.push_back(seq.node(s.instance));
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  int64_t total = 0;
  for (NodeId v : nodes) total += seq.graph().bytes(v);
  return total;
}

// Note [Greedy swaps]. Memory is accounted in schedule order, so a swap
// helps only where the peak is. Each round finds the compute p where the
// resident bytes peak (the earliest on a tie) and lists the instances live
// across p that p does not read and that are not evicted at p; each can be
// evicted in the gap (a, b) around p, either by a new interval or by
// widening one it already has in that gap. A new interval starts from the
// hidden placement (the earliest eviction after the offload's nominal end,
// the latest prefetch that still ends before b starts; Note [Swap
// intervals]) and is widened to cover p. Its estimated exposed time is
// what the nominal timeline cannot hide: max(0, offload end - end(e)) +
// max(0, d - (start(b) - end(q - 1))), d = bytes / bandwidth (copy-stream
// contention is ignored; the placement rounds and the simulator see it).
// kHiddenGapsOnly (XLA's host-offload rule) admits only gaps whose compute
// covers the round trip, start(b) - end(a) >= 2 d, and takes the largest
// bytes first; kLeastExposure admits every gap and takes the least
// estimated exposure per byte first (ties: larger bytes, then the earlier
// instance). A node is offloaded once, so a new node must fit the host
// budget. The search stops when the peak meets the target or nothing at
// the peak can be evicted; the peak never rises (swaps only remove bytes).
// Not optimal: one tensor at a time, ranked by local estimates; a large
// tensor evicted early may make smaller ones useless (a knapsack at every
// peak).
std::vector<SwapInterval> GreedySwaps(const ComputeSequence& seq, const SwapSearchOptions& options,
                                      std::vector<SwapInterval> initial) {
  const Graph& g = seq.graph();
  const int T = seq.size();
  std::vector<SwapInterval> swaps = std::move(initial);
  if (T == 0) return swaps;
  const double bw = options.bandwidth_bytes_per_s;
  std::vector<uint8_t> offloaded(g.num_nodes(), 0);
  int64_t host = 0;
  for (const SwapInterval& s : swaps) {
    const NodeId v = seq.node(s.instance);
    if (!offloaded[v]) {
      offloaded[v] = 1;
      host += g.bytes(v);
    }
  }
  // Nominal end times are non-decreasing in the position.
  auto first_end_at_least = [&](int lo, int hi, double t) {  // in [lo, hi], or hi
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (seq.end(mid) >= t) hi = mid; else lo = mid + 1;
    }
    return lo;
  };
  auto last_end_at_most = [&](int lo, int hi, double t) {  // in [lo, hi], or lo
    while (lo < hi) {
      const int mid = lo + (hi - lo + 1) / 2;
      if (seq.end(mid) <= t) lo = mid; else hi = mid - 1;
    }
    return lo;
  };
  auto exposure = [&](int i, int e, int q, int b, double d) {
    const double off_end = seq.end(i) + d;
    return std::max(0.0, off_end - seq.end(e)) +
           std::max(0.0, d - (seq.start(b) - seq.end(q - 1)));
  };
  std::vector<std::vector<int>> swaps_of(T);  // instance -> indices in swaps
  for (int s = 0; s < static_cast<int>(swaps.size()); ++s) {
    swaps_of[swaps[s].instance].push_back(s);
  }
  const int max_rounds = 8 * T + 64;
  for (int round = 0; round < max_rounds; ++round) {
    if (options.deadline != nullptr && options.deadline->Expired()) break;
    const std::vector<int64_t> during = DuringBytes(seq, swaps);
    int p = 0;
    for (int k = 1; k < T; ++k) {
      if (during[k] > during[p]) p = k;
    }
    const int64_t peak = std::max(g.persistent_bytes(), during[p]);
    if (options.target_bytes != kMinBudgetBytes && peak <= options.target_bytes) break;
    if (during[p] <= g.persistent_bytes()) break;
    struct Candidate {
      int instance = -1;
      int existing = -1;  // index in swaps, or -1 for a new interval
      int e = 0, q = 0;
      int64_t bytes = 0;
      double est = 0;  // added estimated exposure
    };
    Candidate best;
    auto better = [&](const Candidate& c) {
      if (best.instance < 0) return true;
      // Relative: costs may be in any unit (1e-13 s a node, or FLOPs).
      const double tiny = 1e-9 * std::max(std::abs(c.est), std::abs(best.est));
      if (options.rule == SwapRule::kHiddenGapsOnly) {
        if (c.bytes != best.bytes) return c.bytes > best.bytes;
        if (std::abs(c.est - best.est) > tiny) return c.est < best.est;
        return c.instance < best.instance;
      }
      const double rc = c.est / static_cast<double>(std::max<int64_t>(c.bytes, 1));
      const double rb = best.est / static_cast<double>(std::max<int64_t>(best.bytes, 1));
      if (std::abs(rc - rb) > 1e-9 * std::max(rc, rb)) return rc < rb;
      if (c.bytes != best.bytes) return c.bytes > best.bytes;
      return c.instance < best.instance;
    };
    for (int i = 0; i < p; ++i) {
      if (seq.last(i) < p) continue;
      const NodeId v = g.persistent(seq.node(i)) ? kNoNode : seq.node(i);
      if (v == kNoNode || g.bytes(v) == 0) continue;
      const Gap gap = GapAround(seq, i, p);
      if (gap.a < 0 || gap.b < 0) continue;
      const double d = static_cast<double>(g.bytes(v)) / bw;
      if (options.rule == SwapRule::kHiddenGapsOnly &&
          seq.start(gap.b) - seq.end(gap.a) < 2 * d) {
        continue;
      }
      Candidate c;
      c.instance = i;
      c.bytes = g.bytes(v);
      bool evicted = false;
      for (int s : swaps_of[i]) {
        const SwapInterval& w = swaps[s];
        if (w.instance != i || w.evict_after < gap.a || w.prefetch_before > gap.b) continue;
        if (w.evict_after < p && p < w.prefetch_before) evicted = true;
        c.existing = s;
      }
      if (evicted) continue;
      if (c.existing >= 0) {
        const SwapInterval& w = swaps[c.existing];
        c.e = std::min(w.evict_after, p - 1);
        c.q = std::max(w.prefetch_before, p + 1);
        c.est = exposure(i, c.e, c.q, gap.b, d) -
                exposure(i, w.evict_after, w.prefetch_before, gap.b, d);
      } else {
        if (!offloaded[v] && options.host_budget_bytes.has_value() &&
            host + g.bytes(v) > *options.host_budget_bytes) {
          continue;
        }
        // Hidden placement, then widened to cover p.
        const double off_end = seq.end(i) + d;
        int e = first_end_at_least(gap.a, gap.b - 2, off_end);
        int q = last_end_at_most(gap.a, gap.b - 1, seq.start(gap.b) - d) + 1;
        if (q < e + 2) {  // no hidden interval: keep the eviction hidden
          q = std::min(gap.b, e + 2);
          e = q - 2;
        }
        c.e = std::min(e, p - 1);
        c.q = std::max(q, p + 1);
        c.est = exposure(i, c.e, c.q, gap.b, d);
      }
      if (better(c)) best = c;
    }
    if (best.instance < 0) break;
    if (best.existing >= 0) {
      swaps[best.existing].evict_after = best.e;
      swaps[best.existing].prefetch_before = best.q;
    } else {
      swaps_of[best.instance].push_back(static_cast<int>(swaps.size()));
      swaps.push_back({best.instance, best.e, best.q});
      const NodeId v = seq.node(best.instance);
      if (!offloaded[v]) {
        offloaded[v] = 1;
        host += g.bytes(v);
      }
    }
  }
  return swaps;
}

// Note [Placement rounds]. The greedy search places transfers on the
// nominal timeline, which ignores copy-stream contention and the stalls the
// transfers themselves cause. A round simulates the schedule and, for every
// interval in order of eviction, (1) when the measured offload of the node
// ends after the compute at the eviction (the free would stall the compute
// stream), moves the eviction to the first later compute that ends after
// it; (2) when the measured prefetch ends after the compute before the next
// use (that use waits), moves the prefetch earlier by the lateness, onto
// the measured timeline. Each move goes only as far as the resident bytes
// stay within `cap_bytes` at every compute it covers, and keeps e + 2 <= q.
// The best simulated makespan of all rounds is returned: a move can also
// make things worse (it delays other transfers on the copy stream).
std::vector<SwapInterval> RefinePlacement(const ComputeSequence& seq,
                                          std::vector<SwapInterval> swaps, int64_t cap_bytes,
                                          double bandwidth_bytes_per_s, int rounds,
                                          const Deadline* deadline) {
  if (swaps.empty()) return swaps;
  const Graph& g = seq.graph();
  SimulatorOptions sim;
  sim.host_bandwidth_bytes_per_s = bandwidth_bytes_per_s;
  std::vector<SwapInterval> best = swaps;
  double best_makespan = std::numeric_limits<double>::infinity();
  for (int round = 0; round <= rounds; ++round) {
    const Emitted em = EmitDetailed(seq, swaps);
    absl::StatusOr<PlanReport> rep = Simulate(g, em.schedule, sim);
    PEBBLE_CHECK(rep.ok(), "swap emission produced an invalid schedule");
    if (rep->makespan < best_makespan) {
      best_makespan = rep->makespan;
      best = swaps;
    }
    if (round == rounds || (deadline != nullptr && deadline->Expired())) break;
    const std::vector<StepRecord>& tl = rep->timeline;
    std::vector<int64_t> during = DuringBytes(seq, swaps);
    std::vector<int> order(swaps.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int>(k);
    std::sort(order.begin(), order.end(), [&](int x, int y) {
      return std::tie(swaps[x].evict_after, swaps[x].instance) <
             std::tie(swaps[y].evict_after, swaps[y].instance);
    });
    auto compute_end = [&](int p) { return tl[em.compute_step[p]].end; };
    bool changed = false;
    for (int s : order) {
      SwapInterval& w = swaps[s];
      const int64_t b = g.bytes(seq.node(w.instance));
      const double tiny = 1e-12 * rep->makespan;  // relative: any cost unit
      // (1) Late offload: evict later.
      const double off_end = tl[em.offload_step[s]].end;
      if (off_end > compute_end(w.evict_after) + tiny) {
        int e = w.evict_after;
        while (e + 1 <= w.prefetch_before - 2 && during[e + 1] + b <= cap_bytes &&
               compute_end(e) < off_end - tiny) {
          ++e;
          during[e] += b;
        }
        if (e != w.evict_after) {
          w.evict_after = e;
          changed = true;
        }
      }
      // (2) Late prefetch: prefetch earlier.
      const Gap gap = GapAround(seq, w.instance, w.evict_after + 1);
      const StepRecord& pf = tl[em.prefetch_step[s]];
      const double late = pf.end - compute_end(gap.b - 1);
      if (late > tiny) {
        const double want_start = pf.start - late;
        int q = w.prefetch_before;
        while (q - 1 >= w.evict_after + 2 && during[q - 1] + b <= cap_bytes &&
               compute_end(q - 1) > want_start + tiny) {
          --q;
          during[q] += b;
        }
        if (q != w.prefetch_before) {
          w.prefetch_before = q;
          changed = true;
        }
      }
    }
    if (!changed) break;
  }
  return best;
}

nlohmann::json ClassifyTensors(const Graph& graph, const Schedule& schedule, int max_ids) {
  const int n = graph.num_nodes();
  std::vector<int> computes(n, 0);
  std::vector<uint8_t> prefetched(n, 0);
  for (const Step& s : schedule.steps) {
    if (s.action == Action::kCompute) ++computes[s.node];
    if (s.action == Action::kPrefetch) prefetched[s.node] = 1;
  }
  const char* kClasses[] = {"kept", "swapped", "recomputed", "swapped_and_recomputed"};
  int64_t count[4] = {0, 0, 0, 0};
  int64_t bytes[4] = {0, 0, 0, 0};
  std::map<std::string, std::array<int64_t, 4>> by_op;  // sorted: deterministic
  nlohmann::json swapped_ids = nlohmann::json::array();
  nlohmann::json recomputed_ids = nlohmann::json::array();
  for (NodeId v = 0; v < n; ++v) {
    if (!graph.needed()[v] || graph.persistent(v)) continue;
    const int c = (prefetched[v] ? 1 : 0) + (computes[v] > 1 ? 2 : 0);
    ++count[c];
    bytes[c] += graph.bytes(v);
    auto [it, inserted] = by_op.try_emplace(graph.op(v), std::array<int64_t, 4>{0, 0, 0, 0});
    ++it->second[c];
    if ((c & 1) && static_cast<int>(swapped_ids.size()) < max_ids) {
      swapped_ids.push_back(graph.id(v));
    }
    if ((c & 2) && static_cast<int>(recomputed_ids.size()) < max_ids) {
      recomputed_ids.push_back(graph.id(v));
    }
  }
  nlohmann::json j = nlohmann::json::object();
  nlohmann::json counts = nlohmann::json::object(), sizes = nlohmann::json::object();
  for (int c = 0; c < 4; ++c) {
    counts[kClasses[c]] = count[c];
    sizes[kClasses[c]] = bytes[c];
  }
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [op, cs] : by_op) {
    nlohmann::json o = nlohmann::json::object();
    for (int c = 0; c < 4; ++c) {
      if (cs[c] > 0) o[kClasses[c]] = cs[c];
    }
    ops[op] = std::move(o);
  }
  j["counts"] = std::move(counts);
  j["bytes"] = std::move(sizes);
  j["by_op"] = std::move(ops);
  j["swapped"] = std::move(swapped_ids);
  j["recomputed"] = std::move(recomputed_ids);
  return j;
}

// ---------------------------------------------------------------------------
// MakespanSelector

bool MakespanSelector::Fits(const PlanReport& r) const {
  if (options_.budget_bytes != PlannerOptions::kMinBudget &&
      r.peak_bytes > options_.budget_bytes) {
    return false;
  }
  return !options_.host_budget_bytes.has_value() ||
         r.host_peak_bytes <= *options_.host_budget_bytes;
}

bool MakespanSelector::Better(const PlanReport& a, const PlanReport& b) const {
  // Makespans are sums of doubles in different orders: equal within 1e-9.
  const double tol = 1e-9 * std::max(std::abs(a.makespan), std::abs(b.makespan));
  const bool faster = a.makespan < b.makespan - tol;
  const bool same_time = std::abs(a.makespan - b.makespan) <= tol;
  const bool fa = Fits(a), fb = Fits(b);
  if (fa != fb) return fa;
  if (fa && options_.budget_bytes != PlannerOptions::kMinBudget) {
    if (!same_time) return faster;
    if (a.peak_bytes != b.peak_bytes) return a.peak_bytes < b.peak_bytes;
    return a.transfer_bytes < b.transfer_bytes;
  }
  if (a.peak_bytes != b.peak_bytes) return a.peak_bytes < b.peak_bytes;
  if (!same_time) return faster;
  if (!fa && a.host_peak_bytes != b.host_peak_bytes) return a.host_peak_bytes < b.host_peak_bytes;
  return a.transfer_bytes < b.transfer_bytes;
}

const PlanReport& MakespanSelector::Consider(Schedule schedule, nlohmann::json details) {
  SimulatorOptions sim;
  sim.host_bandwidth_bytes_per_s = options_.host_bandwidth_bytes_per_s;
  absl::StatusOr<PlanReport> report = Simulate(graph_, schedule, sim);
  PEBBLE_CHECK(report.ok(), "an offload candidate is an invalid schedule");
  report->timeline.clear();
  ++considered_;
  if (!has_best_ || Better(*report, best_report_)) {
    has_best_ = true;
    best_report_ = *report;
    best_schedule_ = std::move(schedule);
    best_details_ = std::move(details);
  }
  last_report_ = *std::move(report);
  return last_report_;
}

absl::StatusOr<PlanResult> MakespanSelector::Finish() {
  PEBBLE_CHECK(has_best_, "MakespanSelector::Finish without candidates");
  ASSIGN_OR_RETURN(PlanResult result, FinishPlan(graph_, std::move(best_schedule_), options_));
  if (best_details_.is_object()) {
    for (auto it = best_details_.begin(); it != best_details_.end(); ++it) {
      result.details[it.key()] = it.value();
    }
  }
  result.details["candidates_simulated"] = considered_;
  result.details["tensors"] = ClassifyTensors(graph_, result.schedule);
  if (deadline_.hit()) {
    NoteTimeLimit(result, deadline_.limit_s(),
                  absl::StrCat("the best of ", considered_, " candidates found so far"));
  }
  has_best_ = false;
  return result;
}

}  // namespace pebble
