// Static memory layout (scheduler/memory_layout.h): lifetimes traced by
// hand, offsets that never overlap, and the arena against the peak.
#include "scheduler/memory_layout.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/models/models.h"
#include "gtest/gtest.h"
#include "scheduler/orders.h"
#include "scheduler/planner.h"
#include "scheduler/simulator.h"
#include "tests/test_util.h"

namespace pebble {
namespace {

using ::pebble::testing::MakeGraph;
using ::pebble::testing::MakeSchedule;
using ::pebble::testing::Node;
using ::pebble::testing::Persistent;
using ::pebble::testing::RandomDag;
using ::testing::HasSubstr;

constexpr Action kC = Action::kCompute;
constexpr Action kF = Action::kFree;
constexpr Action kO = Action::kOffload;
constexpr Action kP = Action::kPrefetch;

LayoutOptions Aligned(int64_t alignment) {
  LayoutOptions options;
  options.alignment = alignment;
  return options;
}

// (node id, workspace, first step, last step, bytes) of every instance.
using Lifetime = std::tuple<std::string, bool, int, int, int64_t>;
std::vector<Lifetime> Lifetimes(const Graph& g, const std::vector<TensorInstance>& list) {
  std::vector<Lifetime> out;
  for (const TensorInstance& i : list) {
    out.push_back({g.id(i.node), i.workspace, i.first_step, i.last_step, i.bytes});
  }
  return out;
}

// x (persistent, 10) -> a (100) -> b (100) -> c (50), as in simulator_test.
Graph Chain() {
  return MakeGraph({Persistent("x", 10), Node("a", 100, {"x"}), Node("b", 100, {"a"}),
                    Node("c", 50, {"b"})},
                   {"c"});
}

TEST(MemoryLayoutTest, ChainIsPackedToItsPeak) {
  Graph g = Chain();
  Schedule s = *FreeAtLastUse(g, DefaultOrder(g));
  // Steps: 0 compute a, 1 compute b, 2 free a, 3 compute c, 4 free b.
  auto instances = TensorInstances(g, s);
  ASSERT_TRUE(instances.ok()) << instances.status();
  EXPECT_THAT(Lifetimes(g, *instances),
              ::testing::ElementsAre(Lifetime{"x", false, 0, 4, 10},
                                     Lifetime{"a", false, 0, 1, 100},
                                     Lifetime{"b", false, 1, 3, 100},
                                     Lifetime{"c", false, 3, 4, 50}));
  auto layout = PlanMemoryLayout(g, s, Aligned(1));
  ASSERT_TRUE(layout.ok()) << layout.status();
  // Step 1 holds x, a and b: 210. Largest first: b at 0, a at 100, c on top
  // of b (a is gone by then) at 100, x above a at 200.
  EXPECT_EQ(layout->peak_bytes, 210);
  EXPECT_EQ(layout->aligned_peak_bytes, 210);
  EXPECT_EQ(layout->arena_bytes, 210);
  EXPECT_DOUBLE_EQ(layout->fragmentation, 0);
  EXPECT_EQ(layout->strategy, "greedy-by-size");
  EXPECT_TRUE(VerifyLayout(g, s, *layout).ok()) << VerifyLayout(g, s, *layout);
  EXPECT_THAT(layout->ToString(), HasSubstr("4 instances"));
  const nlohmann::json j = layout->ToJson(g);
  EXPECT_EQ(j["arena_bytes"], 210);
  EXPECT_EQ(j["instances"].size(), 4u);
  EXPECT_EQ(j["instances"][1]["node"], "a");
}

TEST(MemoryLayoutTest, AlignmentRoundsEveryInstance) {
  Graph g = Chain();
  Schedule s = *FreeAtLastUse(g, DefaultOrder(g));
  auto layout = PlanMemoryLayout(g, s);  // 64-byte alignment
  ASSERT_TRUE(layout.ok()) << layout.status();
  // Rounded: x 64, a 128, b 128, c 64; step 1 holds 64 + 128 + 128.
  EXPECT_EQ(layout->alignment, 64);
  EXPECT_EQ(layout->peak_bytes, 210);
  EXPECT_EQ(layout->aligned_peak_bytes, 320);
  EXPECT_EQ(layout->arena_bytes, 320);
  EXPECT_NEAR(layout->fragmentation, 320.0 / 210 - 1, 1e-12);
  for (const TensorInstance& i : layout->instances) EXPECT_EQ(i.offset % 64, 0);
  EXPECT_TRUE(VerifyLayout(g, s, *layout).ok());
}

// Offload, prefetch, recomputation and workspace each make their own
// instances.
TEST(MemoryLayoutTest, EveryAllocationIsAnInstance) {
  Graph g = MakeGraph({Node("a", 100), Node("b", 10, {"a"}), Node("c", 10, {"b"}),
                       Node("d", 10, {"a", "c"}, 1.0, /*workspace=*/30)},
                      {"d"});
  // 0 compute a, 1 offload a, 2 compute b, 3 free a, 4 compute c, 5 free b,
  // 6 prefetch a, 7 compute d, 8 free c, 9 compute b (again), 10 free a.
  Schedule s = MakeSchedule(g, {{kC, "a"}, {kO, "a"}, {kC, "b"}, {kF, "a"}, {kC, "c"},
                                {kF, "b"}, {kP, "a"}, {kC, "d"}, {kF, "c"}, {kC, "b"},
                                {kF, "a"}});
  auto instances = TensorInstances(g, s);
  ASSERT_TRUE(instances.ok()) << instances.status();
  EXPECT_THAT(Lifetimes(g, *instances),
              ::testing::ElementsAre(Lifetime{"a", false, 0, 2, 100},    // freed at 3
                                     Lifetime{"b", false, 2, 4, 10},     // freed at 5
                                     Lifetime{"c", false, 4, 7, 10},     // freed at 8
                                     Lifetime{"a", false, 6, 9, 100},    // prefetched
                                     Lifetime{"d", false, 7, 10, 10},    // to the end
                                     Lifetime{"d", true, 7, 7, 30},      // workspace
                                     Lifetime{"b", false, 9, 10, 10}));  // recomputed
  auto layout = PlanMemoryLayout(g, s, Aligned(1));
  ASSERT_TRUE(layout.ok()) << layout.status();
  // Step 7 (compute d): c 10 + a 100 + d 10 + workspace 30 = 150.
  EXPECT_EQ(layout->peak_bytes, 150);
  EXPECT_EQ(layout->arena_bytes, 150);
  EXPECT_TRUE(VerifyLayout(g, s, *layout).ok()) << VerifyLayout(g, s, *layout);
}

TEST(MemoryLayoutTest, EmptyScheduleHoldsThePersistentNodes) {
  Graph g = MakeGraph({Persistent("w", 7), Persistent("v", 0)}, {"w"});
  auto layout = PlanMemoryLayout(g, Schedule{});
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->instances.size(), 2u);
  EXPECT_EQ(layout->peak_bytes, 7);
  EXPECT_EQ(layout->arena_bytes, 64);
  EXPECT_TRUE(VerifyLayout(g, Schedule{}, *layout).ok());
}

TEST(MemoryLayoutTest, RejectsBadInput) {
  Graph g = Chain();
  auto invalid = PlanMemoryLayout(g, MakeSchedule(g, {{kC, "b"}}));
  ASSERT_FALSE(invalid.ok());
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(invalid.status().message()), HasSubstr("input 'a' is not resident"));
  Schedule s = *FreeAtLastUse(g, DefaultOrder(g));
  auto odd = PlanMemoryLayout(g, s, Aligned(48));
  ASSERT_FALSE(odd.ok());
  EXPECT_THAT(std::string(odd.status().message()), HasSubstr("power of two"));
}

TEST(MemoryLayoutTest, VerifyCatchesBrokenLayouts) {
  Graph g = Chain();
  Schedule s = *FreeAtLastUse(g, DefaultOrder(g));
  const MemoryLayout good = *PlanMemoryLayout(g, s);
  ASSERT_TRUE(VerifyLayout(g, s, good).ok());

  MemoryLayout overlap = good;  // a and b are both alive at step 1
  overlap.instances[2].offset = overlap.instances[1].offset;
  EXPECT_THAT(std::string(VerifyLayout(g, s, overlap).message()), HasSubstr("overlaps"));

  MemoryLayout misaligned = good;
  misaligned.instances[0].offset += 8;
  EXPECT_THAT(std::string(VerifyLayout(g, s, misaligned).message()),
              HasSubstr("not aligned"));

  MemoryLayout small = good;
  small.arena_bytes -= 64;
  EXPECT_THAT(std::string(VerifyLayout(g, s, small).message()), HasSubstr("past the arena"));

  MemoryLayout missing = good;
  missing.instances.pop_back();
  EXPECT_THAT(std::string(VerifyLayout(g, s, missing).message()), HasSubstr("instances"));

  MemoryLayout wrong_peak = good;
  wrong_peak.peak_bytes = 1;
  EXPECT_FALSE(VerifyLayout(g, s, wrong_peak).ok());
}

// Property test: every order policy's plan on random DAGs, both alignments.
// The arena never overlaps, is never below the (aligned) peak, and with
// alignment 1 stays close to the peak.
TEST(MemoryLayoutPropertyTest, RandomPlansGetValidTightLayouts) {
  double worst = 0;
  double total = 0;
  int layouts = 0;
  int at_peak = 0;
  for (uint64_t seed = 0; seed < 120; ++seed) {
    Graph g = RandomDag(5 + static_cast<int>(seed % 60), seed);
    for (const char* policy : {"baseline", "greedy", "dfs"}) {
      auto planner = MakePlanner(policy);
      ASSERT_TRUE(planner.ok());
      auto plan = (*planner)->Plan(g, {});
      ASSERT_TRUE(plan.ok()) << plan.status();
      for (int64_t alignment : {int64_t{1}, int64_t{64}}) {
        auto layout = PlanMemoryLayout(g, plan->schedule, Aligned(alignment));
        ASSERT_TRUE(layout.ok()) << layout.status();
        const absl::Status verified = VerifyLayout(g, plan->schedule, *layout);
        EXPECT_TRUE(verified.ok()) << verified << " seed " << seed << " " << policy;
        EXPECT_EQ(layout->peak_bytes, plan->report.peak_bytes);
        EXPECT_GE(layout->arena_bytes, layout->aligned_peak_bytes);
        EXPECT_GE(layout->aligned_peak_bytes, layout->peak_bytes);
        if (alignment == 1) {
          const double frag = layout->fragmentation;
          worst = std::max(worst, frag);
          total += frag;
          ++layouts;
          at_peak += layout->arena_bytes == layout->peak_bytes ? 1 : 0;
          EXPECT_LE(frag, 0.25) << "seed " << seed << " " << policy;
        }
      }
    }
  }
  RecordProperty("mean_fragmentation", absl::StrCat(total / layouts));
  RecordProperty("worst_fragmentation", absl::StrCat(worst));
  RecordProperty("arena_at_peak", absl::StrCat(at_peak, "/", layouts));
  // Measured: 0.7% mean, 8.9% worst, 236 of 360 at the peak (4.6% and 19%
  // before the order search).
  EXPECT_LE(total / layouts, 0.02);
  // The order search gets a fair share of these small layouts to the peak.
  EXPECT_GE(at_peak * 2, layouts) << at_peak << " of " << layouts;
}

// Where the strategies leave a small layout above its bound, the search over
// placement orders finds a smaller arena (and says so), always valid, and
// the same one every time.
TEST(MemoryLayoutPropertyTest, OrderSearchImprovesSmallLayoutsDeterministically) {
  int searched = 0;
  for (uint64_t seed = 0; seed < 60; ++seed) {
    Graph g = RandomDag(10 + static_cast<int>(seed % 30), seed);
    auto plan = (*MakePlanner("baseline"))->Plan(g, {});
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto layout = PlanMemoryLayout(g, plan->schedule, Aligned(1));
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_TRUE(VerifyLayout(g, plan->schedule, *layout).ok()) << "seed " << seed;
    if (layout->strategy != "greedy-by-search") continue;
    ++searched;
    auto again = PlanMemoryLayout(g, plan->schedule, Aligned(1));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->arena_bytes, layout->arena_bytes) << "seed " << seed;
  }
  EXPECT_GT(searched, 0);
}

TEST(MemoryLayoutPropertyTest, TrainingGraphs) {
  for (const char* model : {"conv3d:n=16", "mnist-cnn:batch=8", "tanh-chain"}) {
    auto g = BuildModel(model);
    ASSERT_TRUE(g.ok()) << model << ": " << g.status();
    auto order = GreedyOrder(*g);
    ASSERT_TRUE(order.ok());
    Schedule s = *FreeAtLastUse(*g, *order);
    auto layout = PlanMemoryLayout(*g, s);
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_TRUE(VerifyLayout(*g, s, *layout).ok()) << model;
    EXPECT_LE(layout->fragmentation, 0.25) << model << ": " << layout->ToString();
    RecordProperty(model, layout->ToString());
  }
}

// 100,000 nodes whose tensors live long (about 30,000 at once): only the
// online strategy runs; it takes a fraction of a second.
TEST(MemoryLayoutPropertyTest, LargeSchedules) {
  Graph g = RandomDag(100'000, 5);
  Schedule s = *FreeAtLastUse(g, *GreedyOrder(g));
  auto layout = PlanMemoryLayout(g, s);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_TRUE(VerifyLayout(g, s, *layout).ok());
  EXPECT_EQ(layout->strategy, "best-fit-in-order");
  RecordProperty("layout", layout->ToString());
}

}  // namespace
}  // namespace pebble
