// Cost profiles (scheduler/cost_profile.h): keys, JSON round trip, errors,
// and applying a profile to a graph.
#include "scheduler/cost_profile.h"

#include <algorithm>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "absl/strings/str_cat.h"
#include "graph/models/models.h"
#include "graph/optimizer.h"
#include "gtest/gtest.h"

namespace pebble {
namespace {

using ::testing::HasSubstr;

Graph Conv3d(int n, int batch = 1) {
  auto g = BuildModel("conv3d:n=" + std::to_string(n) + ",batch=" + std::to_string(batch));
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : Graph();
}

TEST(CostKeyTest, NamesOpOperandsOutputAndAttrs) {
  const Graph g = Conv3d(8);
  const NodeId conv1 = g.Find("conv1");
  ASSERT_NE(conv1, kNoNode);
  const auto key = CostKey(g, conv1);
  ASSERT_TRUE(key.has_value());
  EXPECT_EQ(*key,
            "conv3d|fp32(1,1,8,8,8);fp32(4,1,3,3,3);fp32(4)|fp32|"
            "{\"padding\":1,\"stride\":1}");
}

TEST(CostKeyTest, IgnoresNodeIdsSoEqualLayersShareAKey) {
  // relu1 (1,4,8,8,8) and relu2 (1,8,8,8,8) differ in shape; the keys of
  // relu1 in two separately built graphs are equal.
  const Graph a = Conv3d(8), b = Conv3d(8);
  EXPECT_EQ(CostKey(a, a.Find("relu1")), CostKey(b, b.Find("relu1")));
  EXPECT_NE(CostKey(a, a.Find("relu1")), CostKey(a, a.Find("relu2")));
  // Another size is another key.
  const Graph c = Conv3d(16);
  EXPECT_NE(CostKey(a, a.Find("relu1")), CostKey(c, c.Find("relu1")));
}

// Note [Update keys]: an update's key says which terms it computes, not
// its hyper-parameters' values, so a profile of one learning rate (or of
// one parameter group) serves the updates of another; momentum and weight
// decay on or off, and AdamW's decoupled decay, keep keys apart. A profile
// of the older form (every number in the key) is read in the new one.
TEST(CostKeyTest, AnUpdatesKeyNamesItsTermsNotItsNumbers) {
  const absl::StatusOr<Graph> plain = BuildModel("mnist-cnn:batch=2");
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto step = [&plain](const char* optimizer) {
    absl::StatusOr<OptimizerSpec> spec = ParseOptimizer(optimizer);
    EXPECT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<Graph> g = spec.ok() ? AddOptimizerStep(*plain, *spec) : spec.status();
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? *std::move(g) : Graph();
  };
  auto key_of = [&step](const char* optimizer, const char* node) {
    const Graph g = step(optimizer);
    return CostKey(g, g.Find(node));
  };
  const auto adam = key_of("adam", "update:conv1.weight");
  ASSERT_TRUE(adam.has_value());
  EXPECT_EQ(adam->substr(adam->rfind('|')),
            "|{\"decoupled_weight_decay\":false,\"momentum_on\":false,\"weight_decay_on\":false}");
  // Other numbers, the same key; other terms, another.
  EXPECT_EQ(adam, key_of("adam:lr=3e-4,beta1=0.8,beta2=0.95,eps=1e-6", "update:conv1.weight"));
  EXPECT_NE(adam, key_of("adamw", "update:conv1.weight"));
  EXPECT_NE(adam, key_of("adam:weight_decay=0.1", "update:conv1.weight"));
  EXPECT_EQ(key_of("adamw", "update:conv1.weight"),
            key_of("adamw:lr=1;conv*:lr=0.5,weight_decay=0.5", "update:conv1.weight"));
  EXPECT_EQ(key_of("sgd:lr=0.1", "update:fc1.bias"), key_of("sgd:lr=0.5", "update:fc1.bias"));
  EXPECT_NE(key_of("sgd:lr=0.1", "update:fc1.bias"),
            key_of("sgd:lr=0.1,momentum=0.9", "update:fc1.bias"));
  EXPECT_EQ(key_of("adam", "optimizer.step#1"), key_of("adam:lr=1", "optimizer.step#1"));

  // An older profile's keys: two learning rates of one update meet, the
  // larger time kept; other ops' keys stay as they are.
  const std::string old_prefix = adam->substr(0, adam->rfind('|') + 1);
  const nlohmann::json doc = {
      {"format", "pebble-cost-profile"},
      {"version", 1},
      {"entries",
       {{old_prefix + R"({"beta1":0.9,"beta2":0.999,"decoupled_weight_decay":false,"eps":1e-08,)"
                      R"("lr":0.001,"weight_decay":0.0})", 2.0e-6},
        {old_prefix + R"({"beta1":0.9,"beta2":0.999,"decoupled_weight_decay":false,"eps":1e-08,)"
                      R"("lr":0.0003,"weight_decay":0.0})", 3.0e-6},
        {"relu|fp32(4)|fp32|{\"lr\":1}", 1.0e-6}}}};
  absl::StatusOr<CostProfile> read = CostProfileFromJson(doc);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->entries.size(), 2u);
  EXPECT_EQ(read->entries.at(*adam), 3.0e-6);
  EXPECT_EQ(read->entries.at("relu|fp32(4)|fp32|{\"lr\":1}"), 1.0e-6);
  // And it applies to a step of other settings.
  absl::StatusOr<Graph> profiled = ApplyCostProfile(step("adam:lr=0.01"), *read);
  ASSERT_TRUE(profiled.ok()) << profiled.status();
  EXPECT_EQ(profiled->cost(profiled->Find("update:conv1.weight")), 3.0e-6);
}

TEST(CostKeyTest, NoKeyWithoutShapes) {
  auto g = BuildModel("path:n=4");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_FALSE(CostKey(*g, 1).has_value());
}

TEST(CostProfileTest, JsonRoundTrip) {
  CostProfile p;
  p.backend = "cuda";
  p.device = "test device";
  p.bandwidth_h2d_bytes_per_s = 2.5e10;
  p.bandwidth_d2h_bytes_per_s = 2.0e10;
  p.entries["relu|fp32(4)|fp32|{}"] = 1.5e-6;
  p.entries["add|fp32(4);fp32(4)|fp32|{}"] = 2.5e-6;
  const nlohmann::json doc = CostProfileToJson(p);
  EXPECT_EQ(doc["format"], "pebble-cost-profile");
  EXPECT_EQ(doc["version"], 1);
  auto back = CostProfileFromJson(doc);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->backend, "cuda");
  EXPECT_EQ(back->device, "test device");
  EXPECT_EQ(back->bandwidth_h2d_bytes_per_s, 2.5e10);
  EXPECT_EQ(back->entries, p.entries);
  EXPECT_EQ(back->PlannerBandwidth(), 2.0e10);  // the slower direction
  EXPECT_FALSE(doc.contains("workspace_bytes"));  // none measured: none written
  p.workspace_bytes["add|fp32(4);fp32(4)|fp32|{}"] = 4096;
  auto with = CostProfileFromJson(CostProfileToJson(p));
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ(with->workspace_bytes, p.workspace_bytes);
}

// The ranks' link of `pebble calibrate --ranks`: written where measured,
// read back, and its three keys come together.
TEST(CostProfileTest, NetworkLinkRoundTripsAndComesWhole) {
  CostProfile p;
  p.backend = "cpu";
  EXPECT_FALSE(CostProfileToJson(p).contains("network_bandwidth_bytes_per_s"));
  p.network_bandwidth_bytes_per_s = 1.25e9;
  p.network_latency_s = 2e-5;
  p.network_ranks = 4;
  nlohmann::json doc = CostProfileToJson(p);
  auto back = CostProfileFromJson(doc);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->network_bandwidth_bytes_per_s, 1.25e9);
  EXPECT_EQ(back->network_latency_s, 2e-5);
  EXPECT_EQ(back->network_ranks, 4);
  doc.erase("network_ranks");
  EXPECT_THAT(CostProfileFromJson(doc).status().message(),
              ::testing::HasSubstr("together, or none of them"));
  doc["network_ranks"] = 1;
  EXPECT_THAT(CostProfileFromJson(doc).status().message(),
              ::testing::HasSubstr("'network_ranks' must be a whole number of ranks, 2"));
  doc["network_ranks"] = 2;
  doc["network_latency_s"] = -1;
  EXPECT_FALSE(CostProfileFromJson(doc).ok());
}

TEST(CostProfileTest, WorkspaceBytesMustBeWholeNonNegativeNumbers) {
  CostProfile p;
  p.entries["relu|fp32(4)|fp32|{}"] = 1e-6;
  for (const nlohmann::json& bad : {nlohmann::json(-1), nlohmann::json(1.5),
                                    nlohmann::json("64")}) {
    nlohmann::json doc = CostProfileToJson(p);
    doc["workspace_bytes"] = {{"relu|fp32(4)|fp32|{}", bad}};
    auto r = CostProfileFromJson(doc);
    ASSERT_FALSE(r.ok()) << bad.dump();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("workspace_bytes"));
  }
  nlohmann::json doc = CostProfileToJson(p);
  doc["workspace_bytes"] = nlohmann::json::array();
  EXPECT_FALSE(CostProfileFromJson(doc).ok());
}

TEST(CostProfileTest, PlannerBandwidthNeedsAMeasurement) {
  CostProfile p;
  EXPECT_FALSE(p.PlannerBandwidth().has_value());
  p.bandwidth_d2h_bytes_per_s = 3e9;
  EXPECT_EQ(p.PlannerBandwidth(), 3e9);
}

TEST(CostProfileTest, BadDocumentsAreNamedErrors) {
  nlohmann::json good = CostProfileToJson(CostProfile{});
  {
    nlohmann::json d = good;
    d["format"] = "pebble-graph";
    EXPECT_THAT(std::string(CostProfileFromJson(d).status().message()), HasSubstr("format"));
  }
  {
    nlohmann::json d = good;
    d["version"] = 2;
    EXPECT_THAT(std::string(CostProfileFromJson(d).status().message()), HasSubstr("version"));
  }
  {
    nlohmann::json d = good;
    d["entries"]["relu|x"] = -1.0;
    EXPECT_THAT(std::string(CostProfileFromJson(d).status().message()), HasSubstr("relu|x"));
  }
  {
    nlohmann::json d = good;
    d["bandwidth_h2d_bytes_per_s"] = "fast";
    EXPECT_THAT(std::string(CostProfileFromJson(d).status().message()),
                HasSubstr("bandwidth_h2d_bytes_per_s"));
  }
  {
    nlohmann::json d = good;
    d.erase("entries");
    EXPECT_FALSE(CostProfileFromJson(d).ok());
  }
  {
    nlohmann::json d = good;  // a backend pebble has none of
    d["backend"] = "tpu";
    EXPECT_THAT(std::string(CostProfileFromJson(d).status().message()),
                HasSubstr("\"cpu\" or \"cuda\"; got 'tpu'"));
  }
  EXPECT_EQ(ReadCostProfileFile("/nonexistent/profile.json").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(CostProfileTest, BandwidthsOutsideTheLinkRangeAndUnknownKeysAreRefused) {
  nlohmann::json good = CostProfileToJson(CostProfile{});
  for (double bad : {1e-300, 1.0, 1e16}) {
    nlohmann::json d = good;
    d["bandwidth_d2h_bytes_per_s"] = bad;
    EXPECT_THAT(std::string(CostProfileFromJson(d).status().message()),
                HasSubstr("bandwidth_d2h_bytes_per_s"))
        << bad;
  }
  nlohmann::json unmeasured = good;
  unmeasured["bandwidth_d2h_bytes_per_s"] = 0;
  EXPECT_TRUE(CostProfileFromJson(unmeasured).ok());
  nlohmann::json typo = good;
  typo["entires"] = nlohmann::json::object();
  EXPECT_THAT(std::string(CostProfileFromJson(typo).status().message()),
              HasSubstr("did you mean 'entries'"));
}

TEST(CostProfileTest, ReadsAFile) {
  CostProfile p;
  p.backend = "cpu";
  p.entries["relu|fp32(4)|fp32|{}"] = 1e-3;
  const std::string path = ::testing::TempDir() + "cost_profile_test_" +
                           std::to_string(getpid()) + ".json";
  {
    std::ofstream out(path);
    out << CostProfileToJson(p).dump(2);
  }
  auto back = ReadCostProfileFile(path);
  std::remove(path.c_str());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->entries, p.entries);
}

TEST(ApplyCostProfileTest, ReplacesMatchedCostsAndCountsThem) {
  const Graph g = Conv3d(8);
  CostProfile p;
  const NodeId conv1 = g.Find("conv1"), relu1 = g.Find("relu1");
  p.entries[*CostKey(g, conv1)] = 0.25;
  p.entries[*CostKey(g, relu1)] = 0.125;
  p.entries["unknown|fp32(1)|fp32|{}"] = 9.0;  // matches nothing
  CostProfileMatch match;
  auto out = ApplyCostProfile(g, p, &match);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(match.matched, 2);
  int computed = 0;
  for (NodeId v = 0; v < g.num_nodes(); ++v) computed += g.persistent(v) ? 0 : 1;
  EXPECT_EQ(match.matched + match.unmatched, computed);
  EXPECT_EQ(out->cost(out->Find("conv1")), 0.25);
  EXPECT_EQ(out->cost(out->Find("relu1")), 0.125);
  // Everything else is unchanged, structure included.
  ASSERT_EQ(out->num_nodes(), g.num_nodes());
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    const NodeId w = out->Find(g.id(v));
    ASSERT_NE(w, kNoNode);
    EXPECT_EQ(out->bytes(w), g.bytes(v));
    if (v != conv1 && v != relu1) {
      EXPECT_EQ(out->cost(w), g.cost(v)) << g.id(v);
    }
  }
  EXPECT_EQ(out->outputs().size(), g.outputs().size());
}

TEST(ApplyCostProfileTest, WorkspaceOnlyGrows) {
  const Graph g = Conv3d(8);
  const NodeId conv1 = g.Find("conv1"), relu1 = g.Find("relu1");
  CostProfile p;
  p.workspace_bytes[*CostKey(g, conv1)] = 4096;
  p.workspace_bytes[*CostKey(g, relu1)] = 0;
  CostProfileMatch match;
  auto out = ApplyCostProfile(g, p, &match);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(match.workspaces, 1);
  EXPECT_EQ(out->workspace(out->Find("conv1")), std::max<int64_t>(4096, g.workspace(conv1)));
  EXPECT_EQ(out->workspace(out->Find("relu1")), g.workspace(relu1));
}

}  // namespace
}  // namespace pebble
