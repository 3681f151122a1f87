// Abstract pebbling graphs: the classic families of the pebble-game
// literature, plus seeded random DAGs for property tests. Every node is op
// "generic", nothing is persistent and nothing needs workspace, so the peak
// of a one-shot schedule with unit sizes is the black-pebbling number of the
// game without sliding (SPEC section 2).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/models/zoo_internal.h"
#include "graph/status.h"

namespace pebble::zoo {
namespace {

NodeSpec Unit(std::string id, std::vector<std::string> inputs) {
  NodeSpec spec;
  spec.id = std::move(id);
  spec.op = "generic";
  spec.bytes = 1;
  spec.cost = 1.0;
  spec.inputs = std::move(inputs);
  return spec;
}

// Node i of a path: "p<i>".
std::string PathId(int64_t i) { return absl::StrCat("p", i); }
// Node i of level l of a pyramid or tree (level 0 at the bottom): "L<l>_<i>".
std::string LevelId(int64_t level, int64_t i) {
  return absl::StrCat("L", level, "_", i);
}

// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators", OOPSLA 2014): a tiny generator with the same output on every
// platform, unlike the std:: distributions, whose algorithms are
// implementation-defined.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi] (the modulo bias is below 2^-40 for the small
  // ranges used here).
  int64_t Uniform(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    return lo + static_cast<int64_t>(Next() % span);
  }

 private:
  uint64_t state_;
};

}  // namespace

// path:n — p0 -> p1 -> ... -> p(n-1); output p(n-1). Needs 2 pebbles (1 when
// n = 1).
absl::StatusOr<Graph> BuildPath(const ModelArgs& args, const CostModel&) {
  ASSIGN_OR_RETURN(const int64_t n, args.Int("n", 1, 1'000'000));
  GraphBuilder b(args.graph_name());
  for (int64_t i = 0; i < n; ++i) {
    b.AddNode(Unit(PathId(i), i == 0 ? std::vector<std::string>{}
                                     : std::vector<std::string>{PathId(i - 1)}));
  }
  b.AddOutput(PathId(n - 1));
  return b.Build();
}

// pyramid:h — levels 0 (bottom, h+1 nodes) to h (the apex). Node L<l>_<i>
// reads L<l-1>_<i> and L<l-1>_<i+1>. (h+1)(h+2)/2 nodes, h(h+1) edges;
// black-pebbling number h+2 (SPEC section 2).
absl::StatusOr<Graph> BuildPyramid(const ModelArgs& args, const CostModel&) {
  ASSIGN_OR_RETURN(const int64_t h, args.Int("h", 0, 1400));
  GraphBuilder b(args.graph_name());
  for (int64_t level = 0; level <= h; ++level) {
    for (int64_t i = 0; i + level <= h; ++i) {
      std::vector<std::string> inputs;
      if (level > 0) {
        inputs = {LevelId(level - 1, i), LevelId(level - 1, i + 1)};
      }
      b.AddNode(Unit(LevelId(level, i), std::move(inputs)));
    }
  }
  b.AddOutput(LevelId(h, 0));
  return b.Build();
}

// tree:h — the complete binary in-tree of height h: 2^h leaves at level 0,
// node L<l>_<i> reads L<l-1>_<2i> and L<l-1>_<2i+1>, the root is L<h>_0.
// 2^(h+1)-1 nodes, 2^(h+1)-2 edges; black-pebbling number h+2.
absl::StatusOr<Graph> BuildTree(const ModelArgs& args, const CostModel&) {
  ASSIGN_OR_RETURN(const int64_t h, args.Int("h", 0, 19));
  GraphBuilder b(args.graph_name());
  for (int64_t level = 0; level <= h; ++level) {
    const int64_t width = int64_t{1} << (h - level);
    for (int64_t i = 0; i < width; ++i) {
      std::vector<std::string> inputs;
      if (level > 0) {
        inputs = {LevelId(level - 1, 2 * i), LevelId(level - 1, 2 * i + 1)};
      }
      b.AddNode(Unit(LevelId(level, i), std::move(inputs)));
    }
  }
  b.AddOutput(LevelId(h, 0));
  return b.Build();
}

// linear:n — Checkmate's gen_linear_graph(n) (Jain et al., MLSys 2020;
// github.com/parasj/checkmate, checkmate/core/graph_builder.py): nodes
// v0..v(2n), the path v(i) -> v(i+1), and for i < n a skip edge
// v(i) -> v(2n-i), the shape of a linear network's forward pass (v0..v(n-1)),
// loss (vn) and backward pass. 2n+1 nodes, 3n edges; output v(2n).
absl::StatusOr<Graph> BuildLinear(const ModelArgs& args, const CostModel&) {
  ASSIGN_OR_RETURN(const int64_t n, args.Int("n", 1, 500'000));
  const auto id = [](int64_t i) { return absl::StrCat("v", i); };
  GraphBuilder b(args.graph_name());
  for (int64_t i = 0; i <= 2 * n; ++i) {
    std::vector<std::string> inputs;
    if (i > 0) inputs.push_back(id(i - 1));
    // v(i) with i > n is the backward twin of forward node 2n-i.
    if (i > n) inputs.push_back(id(2 * n - i));
    b.AddNode(Unit(id(i), std::move(inputs)));
  }
  b.AddOutput(id(2 * n));
  return b.Build();
}

// random:n,seed,sizes — r0..r(n-1); r0 is the only source; every later node
// reads 1 to 3 distinct earlier nodes, drawn uniformly. sizes=random draws
// bytes in [1, 100] and cost in [1, 10] (whole numbers) per node; sizes=unit
// keeps both 1. Outputs: every sink, ascending. The same (n, seed, sizes)
// gives the same graph on every platform (SplitMix64, fixed draw order:
// per node the fan-in, the inputs, then bytes and cost).
absl::StatusOr<Graph> BuildRandomDag(const ModelArgs& args, const CostModel&) {
  ASSIGN_OR_RETURN(const int64_t n, args.Int("n", 1, 1'000'000));
  ASSIGN_OR_RETURN(const int64_t seed,
                   args.Int("seed", 0, std::numeric_limits<int64_t>::max()));
  ASSIGN_OR_RETURN(const std::string sizes,
                   args.Choice("sizes", {"unit", "random"}));
  const bool random_sizes = sizes == "random";
  const auto id = [](int64_t i) { return absl::StrCat("r", i); };

  SplitMix64 rng(static_cast<uint64_t>(seed));
  GraphBuilder b(args.graph_name());
  std::vector<bool> has_reader(n, false);
  for (int64_t i = 0; i < n; ++i) {
    NodeSpec spec = Unit(id(i), {});
    if (i > 0) {
      const int64_t fan_in = std::min<int64_t>(rng.Uniform(1, 3), i);
      std::vector<int64_t> chosen;
      while (static_cast<int64_t>(chosen.size()) < fan_in) {
        const int64_t u = rng.Uniform(0, i - 1);
        if (std::find(chosen.begin(), chosen.end(), u) == chosen.end()) {
          chosen.push_back(u);
        }
      }
      std::sort(chosen.begin(), chosen.end());
      for (int64_t u : chosen) {
        spec.inputs.push_back(id(u));
        has_reader[u] = true;
      }
    }
    if (random_sizes) {
      spec.bytes = rng.Uniform(1, 100);
      spec.cost = static_cast<double>(rng.Uniform(1, 10));
    }
    b.AddNode(std::move(spec));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!has_reader[i]) b.AddOutput(id(i));
  }
  return b.Build();
}

}  // namespace pebble::zoo
