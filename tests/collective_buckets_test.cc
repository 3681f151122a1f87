// Planned buckets of collectives (scheduler/collective_buckets.h): where
// joining messages pays, where it does not, the limits a join keeps to,
// and the plans of the policies on sharded models.
#include "scheduler/collective_buckets.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "graph/graph_json.h"
#include "graph/models/models.h"
#include "gtest/gtest.h"
#include "scheduler/collectives.h"
#include "scheduler/planner.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"
#include "test_util.h"

namespace pebble {
namespace {

using ::pebble::testing::MakeSchedule;
using ::pebble::testing::PlanSharded;

constexpr Action kC = Action::kCompute, kF = Action::kFree;

// Two parameters' gathers (4 bytes each) read in turn by c1 and c2 (0.1 s
// each, or `compute_s`), on 4 ranks of a link of `bandwidth` bytes/s and
// `latency` s: a gather takes 3 latency + 0.75 * 4 / bandwidth.
Graph TwoGathers(double bandwidth, double latency, double compute_s) {
  const std::string link = absl::StrCat(R"("attrs": {"ranks": 4, "network_bandwidth_bytes_per_s": )",
                                        bandwidth, R"(, "network_latency_s": )", latency, "}");
  const double gather_s = AllGatherSeconds(4, 4, {bandwidth, latency});
  absl::StatusOr<Graph> g = ParseGraphJson(absl::StrCat(R"({"format": "pebble-graph",
    "version": 1, "nodes": [
      {"id": "p1", "bytes": 1, "persistent": true, "role": "parameter"},
      {"id": "p2", "bytes": 1, "persistent": true, "role": "parameter"},
      {"id": "gather:p1", "op": "all_gather", "bytes": 4, "cost": )", gather_s,
      R"(, "inputs": ["p1"], "collective": true, )", link, R"(},
      {"id": "gather:p2", "op": "all_gather", "bytes": 4, "cost": )", gather_s,
      R"(, "inputs": ["p2"], "collective": true, )", link, R"(},
      {"id": "c1", "bytes": 4, "cost": )", compute_s, R"(, "inputs": ["gather:p1"]},
      {"id": "c2", "bytes": 4, "cost": )", compute_s, R"(, "inputs": ["c1", "gather:p2"]}],
    "outputs": ["c2"]})"));
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : Graph();
}

// A schedule's steps as its file writes them: a failure prints them.
std::string Steps(const Graph& g, const Schedule& s) { return ScheduleToJson(g, s)["steps"].dump(); }

PlanResult Joined(const Graph& g, const Schedule& s, int64_t budget) {
  PlannerOptions options;
  options.budget_bytes = budget;
  absl::StatusOr<PlanResult> planned = FinishPlan(g, s, options);
  EXPECT_TRUE(planned.ok()) << planned.status();
  absl::StatusOr<PlanResult> joined = JoinCollectiveMessages(g, *std::move(planned), options);
  EXPECT_TRUE(joined.ok()) << joined.status();
  return joined.ok() ? *std::move(joined) : PlanResult();
}

// Latencies dominate: one message for both gathers saves 3 s, the second
// gather moves up to the first and the first's free down to the second's,
// so both live through c1 and c2: 4 bytes more, within a budget that allows
// them and not within the plan's own peak.
TEST(CollectiveBucketsTest, GathersJoinWhereTheLatencySavedPays) {
  const Graph g = TwoGathers(100, 1, 0.1);
  const Schedule apart = MakeSchedule(g, {{kC, "gather:p1"}, {kC, "c1"}, {kF, "gather:p1"},
                                          {kC, "gather:p2"}, {kC, "c2"}, {kF, "c1"},
                                          {kF, "gather:p2"}});
  const PlanResult loose = Joined(g, apart, INT64_MAX);
  Schedule expected = MakeSchedule(g, {{kC, "gather:p1"}, {kC, "gather:p2"}, {kC, "c1"},
                                       {kC, "c2"}, {kF, "c1"}, {kF, "gather:p1"},
                                       {kF, "gather:p2"}});
  expected.steps[1].joins_bucket = true;
  EXPECT_EQ(Steps(g, loose.schedule), Steps(g, expected));
  EXPECT_EQ(loose.report.collectives, 1);
  EXPECT_DOUBLE_EQ(loose.report.makespan, 3 + 0.75 * 8 / 100 + 0.2);
  EXPECT_EQ(loose.report.peak_bytes, 2 + 4 * 4);
  EXPECT_EQ(loose.details["collective_buckets"]["messages_joined"], 1);

  // The plan's own peak (2 + 3 * 4 at c2), at the least budget or one
  // below the joined peak: nothing joins.
  for (int64_t budget : {PlannerOptions::kMinBudget, int64_t{17}}) {
    SCOPED_TRACE(budget);
    const PlanResult tight = Joined(g, apart, budget);
    EXPECT_EQ(Steps(g, tight.schedule), Steps(g, apart));
    EXPECT_EQ(tight.report.peak_bytes, 2 + 3 * 4);
    EXPECT_EQ(tight.report.collectives, 2);
  }
  EXPECT_EQ(Steps(g, Joined(g, apart, 18).schedule), Steps(g, expected));
}

// Bytes dominate and the second gather runs beside c1: one message would
// hold c1 back until both are gathered, 3 s later. Nothing joins.
TEST(CollectiveBucketsTest, GathersStayApartWhereTheyOverlapTheCompute) {
  const Graph g = TwoGathers(1, 1e-3, 3);
  const Schedule apart = MakeSchedule(g, {{kC, "gather:p1"}, {kC, "c1"}, {kC, "gather:p2"},
                                          {kF, "gather:p1"}, {kC, "c2"}, {kF, "c1"},
                                          {kF, "gather:p2"}});
  const PlanResult r = Joined(g, apart, INT64_MAX);
  EXPECT_EQ(Steps(g, r.schedule), Steps(g, apart));
  EXPECT_EQ(r.report.collectives, 2);
  EXPECT_DOUBLE_EQ(r.report.makespan, 2 * 3.003 + 3);
  EXPECT_EQ(r.details["collective_buckets"]["messages_joined"], 0);
  EXPECT_EQ(r.details["collective_buckets"]["simulations"], 1);
}

// Two local gradients (8 bytes each) reduce-scattered: the first message
// waits for the second gradient, its gradient's free after the bucket;
// not where a staging buffer of fewer bytes than both would carry them,
// nor where their dtypes differ (here a capture's, in the gradients' attrs:
// MessageDtype).
TEST(CollectiveBucketsTest, ReduceScattersJoinTheLaterMessageWithinTheStagingBuffer) {
  auto graph = [](const std::string& extra_node, const std::string& second_dtype) {
    const std::string link =
        R"("attrs": {"ranks": 4, "network_bandwidth_bytes_per_s": 100, "network_latency_s": 1})";
    absl::StatusOr<Graph> g = ParseGraphJson(absl::StrCat(R"({"format": "pebble-graph",
      "version": 1, "nodes": [)", extra_node, R"(
        {"id": "x", "bytes": 1, "persistent": true},
        {"id": "l1", "bytes": 8, "cost": 0.1, "inputs": ["x"], "attrs": {"dtype": "float32"}},
        {"id": "l2", "bytes": 8, "cost": 0.1, "inputs": ["x"],
         "attrs": {"dtype": ")", second_dtype, R"("}},
        {"id": "r1", "op": "reduce_scatter", "bytes": 2, "cost": 3.06, "inputs": ["l1"],
         "collective": true, )", link, R"(},
        {"id": "r2", "op": "reduce_scatter", "bytes": 2, "cost": 3.06, "inputs": ["l2"],
         "collective": true, )", link, R"(}],
      "outputs": ["r1", "r2"]})"));
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? *std::move(g) : Graph();
  };
  auto apart = [](const Graph& g) {
    return MakeSchedule(g, {{kC, "l1"}, {kC, "r1"}, {kF, "l1"}, {kC, "l2"}, {kC, "r2"},
                            {kF, "l2"}});
  };
  const std::string staging16 =
      R"({"id": "staging", "op": "staging_buffer", "persistent": true, "bytes": 16},)";
  for (const std::string& extra : {std::string(), staging16}) {
    const Graph g = graph(extra, "float32");
    const PlanResult r = Joined(g, apart(g), INT64_MAX);
    Schedule expected = MakeSchedule(g, {{kC, "l1"}, {kC, "l2"}, {kC, "r1"}, {kC, "r2"},
                                         {kF, "l1"}, {kF, "l2"}});
    expected.steps[3].joins_bucket = true;
    EXPECT_EQ(Steps(g, r.schedule), Steps(g, expected));
    EXPECT_EQ(r.report.collectives, 1);
    EXPECT_DOUBLE_EQ(r.report.makespan, 0.2 + 3 + 0.75 * 16 / 100);
  }
  const std::string staging15 = absl::StrReplaceAll(staging16, {{"16", "15"}});
  const Graph half = graph("", "float16");
  EXPECT_EQ(MessageDtype(half, half.Find("r2")), "fp16");
  for (const Graph& g : {graph(staging15, "float32"), graph("", "float16")}) {
    const PlanResult r = Joined(g, apart(g), INT64_MAX);
    EXPECT_EQ(Steps(g, r.schedule), Steps(g, apart(g)));
    EXPECT_EQ(r.report.collectives, 2);
  }
}

// Two parameters' local gradients reduce-scattered, each shard read by its
// parameter's update, in place (0.1 s each), which the plan runs as soon as
// its shard is summed: the first message joins the second, and its update
// (with the free of its local gradient) waits for the bucket, 3 s sooner
// in all. Where the second gradient reads the first update (`l2_reads_u1`),
// the second message waits for what moves after it: nothing joins.
TEST(CollectiveBucketsTest, ReduceScattersJoinAcrossTheUpdatesThatReadThem) {
  auto graph = [](bool l2_reads_u1) {
    const std::string link =
        R"("attrs": {"ranks": 4, "network_bandwidth_bytes_per_s": 100, "network_latency_s": 1})";
    absl::StatusOr<Graph> g = ParseGraphJson(absl::StrCat(R"({"format": "pebble-graph",
      "version": 1, "nodes": [
        {"id": "x", "bytes": 1, "persistent": true},
        {"id": "p1", "bytes": 2, "persistent": true, "role": "parameter"},
        {"id": "p2", "bytes": 2, "persistent": true, "role": "parameter"},
        {"id": "l1", "bytes": 8, "cost": 0.1, "inputs": ["x"]},
        {"id": "r1", "op": "reduce_scatter", "bytes": 2, "cost": 3.06, "inputs": ["l1"],
         "collective": true, )", link, R"(},
        {"id": "u1", "bytes": 2, "cost": 0.1, "inputs": ["p1", "r1"], "alias_of": "p1",
         "in_place": true, "role": "update"},
        {"id": "l2", "bytes": 8, "cost": 0.1, "inputs": )",
        l2_reads_u1 ? R"(["x", "u1"])" : R"(["x"])", R"(},
        {"id": "r2", "op": "reduce_scatter", "bytes": 2, "cost": 3.06, "inputs": ["l2"],
         "collective": true, )", link, R"(},
        {"id": "u2", "bytes": 2, "cost": 0.1, "inputs": ["p2", "r2"], "alias_of": "p2",
         "in_place": true, "role": "update"}],
      "outputs": ["r1", "r2"]})"));
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? *std::move(g) : Graph();
  };
  auto apart = [](const Graph& g) {
    return MakeSchedule(g, {{kC, "l1"}, {kC, "r1"}, {kF, "l1"}, {kC, "u1"}, {kC, "l2"},
                            {kC, "r2"}, {kF, "l2"}, {kC, "u2"}});
  };
  const Graph g = graph(false);
  const PlanResult r = Joined(g, apart(g), INT64_MAX);
  Schedule expected = MakeSchedule(g, {{kC, "l1"}, {kC, "l2"}, {kC, "r1"}, {kC, "r2"},
                                       {kF, "l1"}, {kC, "u1"}, {kF, "l2"}, {kC, "u2"}});
  expected.steps[3].joins_bucket = true;
  EXPECT_EQ(Steps(g, r.schedule), Steps(g, expected));
  EXPECT_EQ(r.report.collectives, 1);
  EXPECT_DOUBLE_EQ(r.report.makespan, 0.2 + 3 + 0.75 * 16 / 100 + 0.2);
  EXPECT_EQ(r.details["collective_buckets"]["messages_joined"], 1);

  const Graph chained = graph(true);
  const PlanResult kept = Joined(chained, apart(chained), INT64_MAX);
  EXPECT_EQ(Steps(chained, kept.schedule), Steps(chained, apart(chained)));
  EXPECT_EQ(kept.report.collectives, 2);
}

// Where pebble.torch may send a bucket of gathers as one flat tensor: each
// member's next step after the bucket is its free, all in one run of frees.
// Returns the first bucket that is not so, or "".
std::string GathersNotFreedTogether(const Graph& g, const Schedule& s) {
  const std::vector<Step>& steps = s.steps;
  for (size_t k = 0; k < steps.size(); ++k) {
    if (steps[k].action != kC || g.op(steps[k].node) != "all_gather" || steps[k].joins_bucket ||
        k + 1 == steps.size() || !steps[k + 1].joins_bucket) {
      continue;
    }
    size_t end = k + 1;
    while (end < steps.size() && steps[end].joins_bucket) ++end;
    std::vector<size_t> frees;
    for (size_t m = k; m < end; ++m) {
      size_t next = end;
      while (next < steps.size() && steps[next].node != steps[m].node) ++next;
      if (next == steps.size() || steps[next].action != kF) return g.id(steps[k].node);
      frees.push_back(next);
    }
    for (size_t j = *std::min_element(frees.begin(), frees.end());
         j <= *std::max_element(frees.begin(), frees.end()); ++j) {
      if (steps[j].action != kF) return g.id(steps[k].node);
    }
  }
  return "";
}

// Every policy's plan of a sharded model, buckets auto against none: no
// slower and no higher in peak (the least budget: the plan's own peak is
// the limit), fewer messages in all, each bucket freed together and its
// reduce-scatters within the staging buffer, the schedule's file simulating
// to the report. FSDP's rule keeps its messages.
TEST(CollectiveBucketsTest, PoliciesJoinMessagesOfShardedModels) {
  const std::vector<const char*> all = {"baseline", "rotor", "dtr", "hybrid", "fsdp"};
  // (The transformer, its gathered weights read through views, takes
  // seconds a policy at the least peak: the baseline and fsdp alone.)
  for (const auto& [model, ranks, policies] :
       std::vector<std::tuple<std::string, int, std::vector<const char*>>>{
           {"transformer:layers=1,seq=8,dim=16,heads=2,vocab=20,optimizer=adam", 4,
            {"baseline", "fsdp"}},
           {"mnist-cnn:batch=4,optimizer=adam", 2, all},
           {"resnet18:batch=2,image=32,optimizer=adam", 2, all}}) {
    SCOPED_TRACE(model);
    absl::StatusOr<Graph> whole = BuildModel(model);
    ASSERT_TRUE(whole.ok()) << whole.status();
    absl::StatusOr<Graph> sharded = ShardGraph(*whole, ranks, NetworkLink{25e9, 5e-6});
    ASSERT_TRUE(sharded.ok()) << sharded.status();
    // A staging buffer of the largest local gradient's bytes (pebble.torch's).
    nlohmann::json doc = GraphToJson(*sharded);
    int64_t largest = 0;
    for (const nlohmann::json& node : doc["nodes"]) {
      if (absl::StartsWith(node["id"].get<std::string>(), "local_grad:")) {
        largest = std::max(largest, node["bytes"].get<int64_t>());
      }
    }
    doc["nodes"].push_back({{"id", "staging:float32"}, {"op", "staging_buffer"},
                            {"persistent", true}, {"bytes", 2 * largest}});
    absl::StatusOr<Graph> g = ParseGraphJson(doc.dump());
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(StagingCap(*g), 2 * largest);
    int64_t messages_alone = 0, messages_joined = 0;
    for (const char* policy : policies) {
      SCOPED_TRACE(policy);
      const PlanResult alone = PlanSharded(*g, ranks, policy, kMinBudgetBytes, 0);
      const PlanResult joined =
          PlanSharded(*g, ranks, policy, kMinBudgetBytes, PlannerOptions::kPlannedBuckets);
      const bool fsdp = std::string(policy) == "fsdp";
      EXPECT_EQ(joined.details["collectives"].contains("collective_buckets"), !fsdp);
      if (fsdp) {
        EXPECT_EQ(joined.schedule, alone.schedule);
        continue;
      }
      messages_alone += alone.report.collectives;
      messages_joined += joined.report.collectives;
      EXPECT_LE(joined.report.peak_bytes, alone.report.peak_bytes);
      if (std::string(policy) != "hybrid") {  // hybrid may pick another candidate
        EXPECT_LE(joined.report.collectives, alone.report.collectives);
        EXPECT_LE(joined.report.makespan, alone.report.makespan);
      }
      EXPECT_EQ(GathersNotFreedTogether(*g, joined.schedule), "");
      const std::vector<Step>& steps = joined.schedule.steps;
      for (size_t k = 0; k < steps.size(); ++k) {
        if (steps[k].action != kC || g->op(steps[k].node) != "reduce_scatter" ||
            steps[k].joins_bucket) {
          continue;
        }
        int64_t bytes = g->bytes(g->inputs(steps[k].node)[0]);
        for (size_t j = k + 1; j < steps.size() && steps[j].joins_bucket; ++j) {
          bytes += g->bytes(g->inputs(steps[j].node)[0]);
          EXPECT_LE(bytes, 2 * largest) << g->id(steps[k].node);
        }
      }
      absl::StatusOr<Schedule> back =
          ParseScheduleText(*g, ScheduleToJson(*g, joined.schedule).dump());
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, joined.schedule);
      SimulatorOptions sim;
      sim.ranks = ranks;
      absl::StatusOr<PlanReport> again = Simulate(*g, *back, sim);
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(again->peak_bytes, joined.report.peak_bytes);
      EXPECT_DOUBLE_EQ(again->makespan, joined.report.makespan);
      EXPECT_EQ(again->collectives, joined.report.collectives);

      // Within a budget above the least peak, the joins may use it, no more.
      const int64_t budget = alone.report.peak_bytes + alone.report.peak_bytes / 10;
      const PlanResult loose =
          PlanSharded(*g, ranks, policy, budget, PlannerOptions::kPlannedBuckets);
      EXPECT_TRUE(loose.feasible);
      EXPECT_LE(loose.report.peak_bytes, budget);
      EXPECT_EQ(GathersNotFreedTogether(*g, loose.schedule), "");
    }
    EXPECT_LT(messages_joined, messages_alone);
  }
}

// FSDP's unit rules send a unit's gathers, and its reduce-scatters, as one
// message a dtype (a flat parameter holds one): conv1's bias in float16
// goes apart from its float32 weight, under the rule and under the search.
TEST(CollectiveBucketsTest, AMessageHoldsOneDtype) {
  absl::StatusOr<Graph> whole = BuildModel("mnist-cnn:batch=2,optimizer=adam");
  ASSERT_TRUE(whole.ok()) << whole.status();
  absl::StatusOr<Graph> sharded = ShardGraph(*whole, 2, NetworkLink{1e9, 1e-3});
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  nlohmann::json doc = GraphToJson(*sharded);
  for (nlohmann::json& node : doc["nodes"]) {
    if (node["id"] == "gather:conv1.bias" || node["id"] == "grad:conv1.bias") {
      node["dtype"] = "float16";
      node["bytes"] = node["bytes"].get<int64_t>() / 2;
    }
  }
  absl::StatusOr<Graph> g = ParseGraphJson(doc.dump());
  ASSERT_TRUE(g.ok()) << g.status();
  for (const char* policy : {"fsdp-module", "dtr"}) {
    SCOPED_TRACE(policy);
    const PlanResult plan =
        PlanSharded(*g, 2, policy, kMinBudgetBytes, PlannerOptions::kPlannedBuckets);
    const std::vector<Step>& steps = plan.schedule.steps;
    int joined = 0;
    for (size_t k = 0; k < steps.size(); ++k) {
      if (steps[k].action != kC || !g->collective(steps[k].node)) continue;
      joined += steps[k].joins_bucket;
      const bool half = g->dtype(steps[k].node) == DType::kFloat16;
      if (steps[k].joins_bucket) {
        EXPECT_EQ(g->dtype(steps[k - 1].node), g->dtype(steps[k].node)) << g->id(steps[k].node);
      }
      if (half) {
        EXPECT_FALSE(steps[k].joins_bucket) << g->id(steps[k].node);
        EXPECT_FALSE(k + 1 < steps.size() && steps[k + 1].joins_bucket) << g->id(steps[k].node);
      }
    }
    EXPECT_GT(joined, 0);  // the other units, or messages, still join
  }
}

}  // namespace
}  // namespace pebble
