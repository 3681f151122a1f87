// The optimizer's step in the training graph (graph/optimizer.h), its
// planning by every policy, the updates last (scheduler/updates_last.h), and
// its execution on the CPU backend (runtime/executor.h; PyTorch's own
// numbers are tests/torch/optimizer_check.py's).
#include "graph/optimizer.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "graph/graph_json.h"
#include "graph/models/models.h"
#include "gtest/gtest.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/executor.h"
#include "scheduler/remat.h"
#include "scheduler/budget.h"
#include "scheduler/collectives.h"
#include "scheduler/plan_api.h"
#include "scheduler/planner.h"
#include "scheduler/simulator.h"
#include "scheduler/updates_last.h"

namespace pebble {
namespace {

using ::testing::HasSubstr;

// Each (text, message): ParseOptimizer(text) is refused, saying message.
template <size_t N>
void ExpectRefusals(const std::pair<const char*, const char*> (&bad)[N]) {
  for (const auto& [text, message] : bad) {
    absl::StatusOr<OptimizerSpec> refused = ParseOptimizer(text);
    ASSERT_FALSE(refused.ok()) << text;
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr(message)) << text;
  }
}

TEST(OptimizerTest, ParsesNamesSettingsAndRefusesBadOnes) {
  absl::StatusOr<OptimizerSpec> sgd = ParseOptimizer("sgd");
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  EXPECT_EQ(sgd->ToString(), "sgd:lr=0.01,momentum=0,weight_decay=0");
  absl::StatusOr<OptimizerSpec> adamw = ParseOptimizer("adamw: lr=3e-4, beta2=0.95,state=host");
  ASSERT_TRUE(adamw.ok()) << adamw.status();
  EXPECT_EQ(adamw->ToString(),
            "adamw:lr=0.0003,beta1=0.9,beta2=0.95,eps=1e-08,weight_decay=0.01,state=host");
  // eps 0 as torch.optim takes it (until 2026-12-04 refused as not above 0).
  absl::StatusOr<OptimizerSpec> no_eps = ParseOptimizer("adam:eps=0");
  ASSERT_TRUE(no_eps.ok()) << no_eps.status();
  EXPECT_EQ(no_eps->eps, 0.0);
  const std::pair<const char*, const char*> bad[] = {
      {"adma", "unknown optimizer 'adma' (expected sgd, adam or adamw; did you mean adam?)"},
      {"sgd:betas=1", "optimizer sgd: unknown parameter 'betas' (sgd takes lr, momentum"},
      {"adam:lr=fast", "optimizer adam: lr='fast' is not a decimal number"},
      {"adam:lr=inf", "is not a decimal number"},
      {"sgd:lr=0x10", "optimizer sgd: lr='0x10' is not a decimal number"},
      {"sgd:lr=1e-400", "lr='1e-400' is too small for a double (it would be 0)"},
      {"sgd:lr=0.1,weight_decay=1e-400", "weight_decay='1e-400' is too small for a double"},
      {"sgd:lr=1,momentum=0x0.8p0", "momentum='0x0.8p0' is not a decimal number"},
      {"sgd:lr=-1", "lr=-1 is out of range (0 or more)"},
      {"sgd:momentum=-1", "momentum=-1 is out of range (0 or more)"},
      {"adam:beta2=1", "beta2=1 is out of range (in [0, 1))"},
      {"adam:weight_decay=-1", "weight_decay=-1 is out of range (0 or more)"},
      {"adam:eps=-1e-8", "eps=-1e-08 is out of range (0 or more)"},
      {"sgd:lr=1,lr=2", "optimizer sgd: lr is given twice"},
      {"adam:state=disk", "unknown tier 'disk'"},
      {"sgd:state=host", "state=host, but SGD without momentum keeps no state"},
      {"sgd:lr=0.1,state=auto", "state=auto, but SGD without momentum keeps no state"},
  };
  ExpectRefusals(bad);
}

// Parameters with a gradient, their bytes summed.
int64_t GradedParameterBytes(const Graph& g) {
  int64_t bytes = 0;
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    if (g.role(v) == Role::kParameter && g.Find("grad:" + g.id(v)) != kNoNode) {
      bytes += g.bytes(v);
    }
  }
  return bytes;
}

TEST(OptimizerTest, AdamAddsTwoMomentsAStepCounterAndThreeUpdatesPerParameter) {
  absl::StatusOr<Graph> plain = BuildModel("mnist-cnn:batch=2");
  absl::StatusOr<Graph> adam = BuildModel("mnist-cnn:batch=2,optimizer=adam");
  ASSERT_TRUE(plain.ok() && adam.ok()) << adam.status();
  int params = 0, updates = 0, states = 0;
  for (NodeId v = 0; v < plain->num_nodes(); ++v) {
    params += plain->role(v) == Role::kParameter;
  }
  for (NodeId v = 0; v < adam->num_nodes(); ++v) {
    updates += adam->in_place(v);
    states += adam->role(v) == Role::kOptimizerState;
  }
  EXPECT_EQ(updates, 3 * params + 1);
  EXPECT_EQ(states, 2 * params + 1);
  EXPECT_EQ(adam->persistent_bytes(), plain->persistent_bytes() + 2 * GradedParameterBytes(*plain) + 4);
  // The outputs are the training graph's: loss and gradients.
  EXPECT_EQ(adam->outputs().size(), plain->outputs().size());
  const NodeId update = adam->Find("update:conv1.weight");
  ASSERT_NE(update, kNoNode);
  EXPECT_EQ(adam->storage(update), adam->Find("conv1.weight"));
  EXPECT_EQ(adam->op(update), "adam_update");
  EXPECT_TRUE(adam->needed()[update]);
  EXPECT_DOUBLE_EQ(adam->attrs(update)["lr"].get<double>(), 0.001);
}

TEST(OptimizerTest, SgdWithoutMomentumHasNoState) {
  absl::StatusOr<Graph> plain = BuildModel("conv3d:n=8");
  absl::StatusOr<Graph> sgd = BuildModel("conv3d:n=8,optimizer=sgd");
  ASSERT_TRUE(plain.ok() && sgd.ok()) << sgd.status();
  EXPECT_EQ(sgd->persistent_bytes(), plain->persistent_bytes());
  EXPECT_EQ(sgd->num_nodes(), plain->num_nodes() + 6);  // three weights, three biases
  OptimizerSpec momentum;
  momentum.momentum = 0.9;
  absl::StatusOr<Graph> with_momentum = AddOptimizerStep(*plain, momentum);
  ASSERT_TRUE(with_momentum.ok()) << with_momentum.status();
  EXPECT_EQ(with_momentum->persistent_bytes(),
            plain->persistent_bytes() + GradedParameterBytes(*plain));
  EXPECT_NE(with_momentum->Find("momentum_buffer:conv1.weight#1"), kNoNode);
}

// A parameter with a shape but no dtype (a dtype the format cannot name,
// as pebble.torch's float64 ones) gives its state and updates its bytes and
// no dtype: the plan needs bytes only.
TEST(OptimizerTest, AParameterWithoutADtypeGivesItsStateItsBytesAndNoDtype) {
  absl::StatusOr<Graph> plain = BuildModel("mnist-cnn:batch=2");
  ASSERT_TRUE(plain.ok()) << plain.status();
  nlohmann::json doc = nlohmann::json::parse(GraphToJsonText(*plain));
  for (nlohmann::json& node : doc["nodes"]) {
    if (node.value("id", "") != "fc1.weight") continue;
    node.erase("dtype");
    node["bytes"] = node["bytes"].get<int64_t>() * 2;  // 8 bytes a value
  }
  absl::StatusOr<Graph> untyped = GraphFromJson(doc);
  ASSERT_TRUE(untyped.ok()) << untyped.status();
  absl::StatusOr<Graph> g = AddOptimizerStep(*untyped, *ParseOptimizer("adam"));
  ASSERT_TRUE(g.ok()) << g.status();
  const int64_t bytes = g->bytes(g->Find("fc1.weight"));
  for (const char* id : {"exp_avg:fc1.weight", "exp_avg_sq:fc1.weight", "update:fc1.weight",
                         "exp_avg:fc1.weight#1"}) {
    const NodeId v = g->Find(id);
    ASSERT_NE(v, kNoNode) << id;
    EXPECT_EQ(g->bytes(v), bytes) << id;
    EXPECT_FALSE(g->dtype(v).has_value()) << id;
  }
  EXPECT_EQ(g->dtype(g->Find("exp_avg:fc2.weight")), DType::kFloat32);
}

TEST(OptimizerTest, RefusesGraphsWithoutGradientsAndUnknownModelValues) {
  absl::StatusOr<Graph> chain = BuildModel("path:n=4");
  ASSERT_TRUE(chain.ok()) << chain.status();
  absl::StatusOr<Graph> none = AddOptimizerStep(*chain, OptimizerSpec{});
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("no parameter with a gradient"));
  absl::StatusOr<Graph> bad = BuildModel("conv3d:n=8,optimizer=lamb");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("model 'conv3d': optimizer=lamb: unknown optimizer 'lamb'"));
}

// Every policy plans a step with Adam where it plans the step without: a
// valid plan whose updates run once each, after every other compute; the
// peak is the plan's without the optimizer plus the state's bytes (the
// updates hold nothing more: the gradients are kept to the end either way).
TEST(OptimizerTest, EveryPolicyPlansTheUpdatesLast) {
  // Small enough for the exhaustive policies (exact, exact-order).
  absl::StatusOr<Graph> plain = BuildModel("conv3d:n=8");
  absl::StatusOr<Graph> adam = BuildModel("conv3d:n=8,optimizer=adam");
  ASSERT_TRUE(plain.ok() && adam.ok());
  const int64_t state_bytes = adam->persistent_bytes() - plain->persistent_bytes();
  absl::StatusOr<Graph> rest = WithoutUpdates(*adam);
  ASSERT_TRUE(rest.ok()) << rest.status();
  for (const PolicyInfo* info : PlannerRegistry::Global().List()) {
    if (info->external) continue;
    for (const char* budget : {"100%", "min"}) {
      PlanRequest request;
      request.policy = info->name;
      request.budget = budget;
      request.options.time_limit_s = 2;
      absl::StatusOr<PlanOutcome> with = PlanGraph(*adam, request);
      absl::StatusOr<PlanOutcome> without = PlanGraph(*plain, request);
      if (!without.ok()) {  // the policy's own limits (tree: in-trees only)
        EXPECT_EQ(with.status().code(), without.status().code()) << info->name;
        continue;
      }
      ASSERT_TRUE(with.ok()) << info->name << " " << budget << ": " << with.status();
      const Schedule& s = with->result.schedule;
      std::set<NodeId> updated;
      bool update_seen = false;
      for (const Step& step : s.steps) {
        if (step.action != Action::kCompute) continue;
        if (adam->in_place(step.node)) {
          EXPECT_TRUE(updated.insert(step.node).second) << info->name << ": an update twice";
          update_seen = true;
        } else {
          EXPECT_FALSE(update_seen) << info->name << ": " << adam->id(step.node)
                                    << " computed after an update";
        }
      }
      int updates = 0;
      for (NodeId v = 0; v < adam->num_nodes(); ++v) updates += adam->in_place(v);
      EXPECT_EQ(static_cast<int>(updated.size()), updates) << info->name;
      // Deterministic policies give the plain graph's plan plus the state.
      if (std::string(budget) == "100%" && info->kind == PlanKind::kOneShot) {
        EXPECT_EQ(with->result.report.peak_bytes,
                  without->result.report.peak_bytes + state_bytes)
            << info->name;
      }
    }
  }
}

// `graph` planned by `policy` at its least peak (2 s of search at most).
absl::StatusOr<PlanOutcome> PlanAtMin(const Graph& graph, const char* policy) {
  PlanRequest request;
  request.policy = policy;
  request.budget = "min";
  request.options.time_limit_s = 2;
  return PlanGraph(graph, request);
}

std::vector<float> Floats(const NpyArray& a) {
  std::vector<float> x(a.data.size() / sizeof(float));
  std::memcpy(x.data(), a.data.data(), a.data.size());
  return x;
}

const HostTensor* Find(const Graph& g, const std::vector<HostTensor>& tensors,
                       absl::string_view id) {
  for (const HostTensor& t : tensors) {
    if (g.id(t.node) == id) return &t;
  }
  return nullptr;
}

// Each policy's plan of `g` at its least peak, run on `backend`: measured
// peak == predicted, and every updated tensor the baseline's (`base`) bits.
void ExpectPoliciesGiveTheBaselinesBits(const Graph& g, const ExecutionResult& base,
                                        std::initializer_list<const char*> policies,
                                        Backend& backend) {
  for (const char* policy : policies) {
    SCOPED_TRACE(policy);
    absl::StatusOr<PlanOutcome> plan = PlanAtMin(g, policy);
    ASSERT_TRUE(plan.ok()) << plan.status();
    absl::StatusOr<ExecutionResult> r = Execute(g, plan->result.schedule, backend);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->peak_bytes, r->predicted.peak_bytes);
    ASSERT_EQ(r->updated.size(), base.updated.size());
    for (size_t i = 0; i < r->updated.size(); ++i) {
      EXPECT_EQ(r->updated[i].node, base.updated[i].node);
      EXPECT_TRUE(r->updated[i].array.data == base.updated[i].array.data)
          << g.id(r->updated[i].node) << " differs from the baseline's";
    }
  }
}

// Note [Parameter groups]: "adamw:...;*.bias:weight_decay=0;fc*:lr=1e-4"
// gives each glob's parameters its settings, later groups winning a key;
// ToString writes them back; groups take the per-parameter settings only.
TEST(OptimizerTest, ParameterGroupsParseAndRefuseWhatTheyCannotSet) {
  absl::StatusOr<OptimizerSpec> spec =
      ParseOptimizer("adamw:lr=1e-3; *.bias : weight_decay=0 ;fc*:lr=1e-4,beta2=0.95");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->groups.size(), 2u);
  EXPECT_EQ(spec->groups[0].pattern, "*.bias");
  EXPECT_EQ(spec->ToString(),
            "adamw:lr=0.001,beta1=0.9,beta2=0.999,eps=1e-08,weight_decay=0.01;"
            "*.bias:weight_decay=0;fc*:lr=0.0001,beta2=0.95");
  EXPECT_EQ(ParseOptimizer(spec->ToString())->ToString(), spec->ToString());
  const OptimizerSpec conv = spec->SettingsFor("conv1.weight");
  EXPECT_EQ(conv.lr, 1e-3);
  EXPECT_EQ(conv.weight_decay, 0.01);
  const OptimizerSpec fc_bias = spec->SettingsFor("fc1.bias");  // in both groups
  EXPECT_EQ(fc_bias.lr, 1e-4);
  EXPECT_EQ(fc_bias.weight_decay, 0);
  EXPECT_EQ(fc_bias.beta2, 0.95);
  EXPECT_EQ(spec->SettingsFor("layer1.fc.weight").lr, 1e-3);  // a glob matches the whole id
  absl::StatusOr<OptimizerSpec> later = ParseOptimizer("sgd;*:lr=0.5;conv*:lr=0.25");
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->SettingsFor("conv1.weight").lr, 0.25);
  EXPECT_EQ(later->SettingsFor("fc1.weight").lr, 0.5);
  const std::pair<const char*, const char*> bad[] = {
      {"adamw;*.bias", "parameter group '*.bias': give a glob of parameter ids and its settings"},
      {"adamw;:lr=1", "parameter group ':lr=1': give a glob"},
      {"adamw;", "optimizer adamw: an empty parameter group after ';'"},
      {"adamw;*.bias:lr=1e-3=5", "lr='1e-3=5' is not a decimal number"},
      {"adam:lr=1e-3=5", "optimizer adam: lr='1e-3=5' is not a decimal number"},
      {"adamw;*.bias:", "a setting is empty"},
      {"adam:", "optimizer adam: no settings after ':' (give the name alone"},
      {"sgd: ", "optimizer sgd: no settings after ':'"},
      {"adam:lr=0.1,", "optimizer adam: a setting is empty"},
      {"adam:,lr=0.1", "optimizer adam: a setting is empty"},
      {"adamw;*.bias:state=host", "'state' is one setting for the whole step (a group sets lr, "
                                  "weight_decay, beta1, beta2, eps)"},
      {"adam;*.bias:momentum=0", "'momentum' is not a setting (a group sets lr, weight_decay, "
                                 "beta1"},
      {"sgd:state=host;*.bias:momentum=0", "state=host, but SGD without momentum keeps no state "
                                           "(give momentum=..., for the step or a parameter group)"},
      {"sgd;*.bias:momentum=-1",
       "parameter group '*.bias:momentum=-1': momentum=-1 is out of range"},
      {"adam;*.bias:max_grad_norm=1", "'max_grad_norm' is one setting for the whole step"},
      {"sgd;*.bias:beta1=0.5", "'beta1' is not a setting (a group sets lr, momentum, "
                               "weight_decay)"},
      {"adam;*.bias:lr=-1", "parameter group '*.bias:lr=-1': lr=-1 is out of range"},
      {"adam;*.bias:lr=1,lr=2", "lr is given twice"},
  };
  ExpectRefusals(bad);
}

// A grouped step's update of each parameter is the one that the spec of its
// group alone makes, to the bit (the updates are element-wise and apart),
// on the CPU backend under every policy; a group that matches no updated
// parameter (a typo) is refused, naming it.
TEST(OptimizerTest, EachParameterGroupUpdatesWithItsOwnSettings) {
  absl::StatusOr<Graph> plain = BuildModel("mnist-cnn:batch=2");
  ASSERT_TRUE(plain.ok()) << plain.status();
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  struct Case {
    const char* grouped;
    const char* outside;  // the spec of the parameters no group matches
    const char* inside;   // of those "conv*" matches
  };
  for (const Case& c :
       {Case{"adamw:lr=0.01;conv*:lr=0.001,weight_decay=0,beta2=0.9", "adamw:lr=0.01",
             "adamw:lr=0.001,weight_decay=0,beta2=0.9"},
        Case{"sgd:lr=0.1,momentum=0.9;conv*:lr=0.5,weight_decay=0.1", "sgd:lr=0.1,momentum=0.9",
             "sgd:lr=0.5,momentum=0.9,weight_decay=0.1"}}) {
    SCOPED_TRACE(c.grouped);
    std::map<std::string, ExecutionResult> runs;
    for (const char* text : {c.grouped, c.outside, c.inside}) {
      absl::StatusOr<Graph> g = AddOptimizerStep(*plain, *ParseOptimizer(text));
      ASSERT_TRUE(g.ok()) << g.status();
      absl::StatusOr<ExecutionResult> r = Execute(*g, BaselineSchedule(*g), *backend);
      ASSERT_TRUE(r.ok()) << r.status();
      runs.emplace(text, *std::move(r));
    }
    const Graph g = *AddOptimizerStep(*plain, *ParseOptimizer(c.grouped));
    int inside = 0, outside = 0;
    for (const HostTensor& t : runs.at(c.grouped).updated) {
      const std::string& id = g.id(t.node);
      if (id == "optimizer.step") continue;
      const bool in_group = absl::StrContains(id, ":conv") || absl::StartsWith(id, "conv");
      ++(in_group ? inside : outside);
      const HostTensor* alone = Find(g, runs.at(in_group ? c.inside : c.outside).updated, id);
      ASSERT_NE(alone, nullptr) << id;
      EXPECT_TRUE(t.array.data == alone->array.data) << id << " is not its group's update";
      if (g.role(t.node) != Role::kParameter) continue;  // (AdamW's first moment is alike)
      const HostTensor* other = Find(g, runs.at(in_group ? c.outside : c.inside).updated, id);
      EXPECT_FALSE(t.array.data == other->array.data) << id << " took the other settings";
    }
    EXPECT_EQ(inside, outside);  // conv1 and conv2 against fc1 and fc2: as many tensors
    EXPECT_GT(inside, 0);
    ExpectPoliciesGiveTheBaselinesBits(g, runs.at(c.grouped), {"dtr", "checkmate-lp"}, *backend);
  }
  absl::StatusOr<Graph> typo = AddOptimizerStep(*plain, *ParseOptimizer("adam;cnov*:lr=1e-4"));
  ASSERT_FALSE(typo.ok());
  EXPECT_THAT(std::string(typo.status().message()),
              HasSubstr("parameter group 'cnov*' matches no parameter that the step updates "
                        "(ids such as 'conv1.weight')"));
}

// SGD's momentum per group, as torch.optim.SGD's param_groups (momentum on
// the weights only): a parameter whose settings have momentum 0 keeps no
// buffer and its update reads its gradient; the others' buffers and
// updates are those of the spec with momentum, to the bit, under every
// policy; the state may then have a home, though the step's momentum is 0.
TEST(OptimizerTest, SgdGroupsWithoutMomentumKeepNoBuffer) {
  absl::StatusOr<Graph> plain = BuildModel("mnist-cnn:batch=2");
  ASSERT_TRUE(plain.ok()) << plain.status();
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  for (const char* grouped : {"sgd:lr=0.1,momentum=0.9;*.bias:momentum=0",
                              "sgd:lr=0.1;*.weight:momentum=0.9"}) {
    SCOPED_TRACE(grouped);
    absl::StatusOr<Graph> g = AddOptimizerStep(*plain, *ParseOptimizer(grouped));
    ASSERT_TRUE(g.ok()) << g.status();
    int64_t buffer_bytes = 0;
    for (NodeId p = 0; p < g->num_nodes(); ++p) {
      if (g->role(p) != Role::kParameter) continue;
      const std::string& id = g->id(p);
      const bool bias = absl::EndsWith(id, ".bias");
      const NodeId buf = g->Find("momentum_buffer:" + id);
      EXPECT_EQ(buf == kNoNode, bias) << id;
      if (buf != kNoNode) buffer_bytes += g->bytes(buf);
      const NodeId update = g->Find("update:" + id);
      ASSERT_NE(update, kNoNode) << id;
      EXPECT_EQ(g->id(g->inputs(update)[1]), bias ? "grad:" + id : "momentum_buffer:" + id + "#1");
      EXPECT_EQ(g->attrs(update)["momentum"].get<double>(), bias ? 0.0 : 0.9) << id;
    }
    int64_t weight_bytes = 0;
    for (const char* w : {"conv1.weight", "conv2.weight", "fc1.weight", "fc2.weight"}) {
      weight_bytes += g->bytes(g->Find(w));
    }
    EXPECT_EQ(buffer_bytes, weight_bytes);
    absl::StatusOr<ExecutionResult> run = Execute(*g, BaselineSchedule(*g), *backend);
    ASSERT_TRUE(run.ok()) << run.status();
    std::map<std::string, ExecutionResult> alone;
    for (const char* text : {"sgd:lr=0.1", "sgd:lr=0.1,momentum=0.9"}) {
      absl::StatusOr<Graph> one = AddOptimizerStep(*plain, *ParseOptimizer(text));
      ASSERT_TRUE(one.ok()) << one.status();
      absl::StatusOr<ExecutionResult> r = Execute(*one, BaselineSchedule(*one), *backend);
      ASSERT_TRUE(r.ok()) << r.status();
      for (const HostTensor& t : run->updated) {
        const std::string& id = g->id(t.node);
        const bool with_momentum = !absl::EndsWith(id, ".bias");
        if (with_momentum != (std::string(text) != "sgd:lr=0.1")) continue;
        const HostTensor* same = Find(*one, r->updated, id);
        ASSERT_NE(same, nullptr) << id;
        EXPECT_TRUE(t.array.data == same->array.data) << id << " is not its group's update";
      }
    }
    ExpectPoliciesGiveTheBaselinesBits(*g, *run, {"dtr", "rotor", "checkmate-lp"}, *backend);
  }
  absl::StatusOr<OptimizerSpec> host = ParseOptimizer("sgd:state=host;*.weight:momentum=0.9");
  ASSERT_TRUE(host.ok()) << host.status();
  absl::StatusOr<Graph> g = AddOptimizerStep(*plain, *host);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->home(g->Find("momentum_buffer:fc1.weight")), Tier::kHost);
}

// One step of SGD with momentum and weight decay on the CPU backend: every
// parameter and momentum buffer comes back updated, as the formula of
// graph/optimizer.h gives them from the step's own gradients; every policy
// gives the baseline's bits; measured peak == predicted.
TEST(OptimizerTest, TheCpuBackendRunsTheUpdatesOfEveryPolicy) {
  absl::StatusOr<Graph> plain = BuildModel("conv3d:n=8");
  absl::StatusOr<OptimizerSpec> spec = ParseOptimizer("sgd:lr=0.5,momentum=0.9,weight_decay=0.1");
  ASSERT_TRUE(plain.ok() && spec.ok());
  absl::StatusOr<Graph> g = AddOptimizerStep(*plain, *spec);
  ASSERT_TRUE(g.ok()) << g.status();
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  absl::StatusOr<ExecutionResult> base = Execute(*g, BaselineSchedule(*g), *backend);
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(base->peak_bytes, base->predicted.peak_bytes);
  int params = 0;
  for (NodeId p = 0; p < g->num_nodes(); ++p) {
    if (g->role(p) != Role::kParameter) continue;
    ++params;
    const std::string& id = g->id(p);
    SCOPED_TRACE(id);
    const HostTensor* grad = base->FindOutput(*g, "grad:" + id);
    const HostTensor* after = Find(*g, base->updated, id);
    const HostTensor* buf = Find(*g, base->updated, "momentum_buffer:" + id);
    absl::StatusOr<NpyArray> before = GenerateInput(*g, p, /*seed=*/0);
    ASSERT_TRUE(grad != nullptr && after != nullptr && buf != nullptr && before.ok());
    const std::vector<float> p0 = Floats(*before), gr = Floats(grad->array),
                             p1 = Floats(after->array), b1 = Floats(buf->array);
    bool moved = false;
    for (size_t i = 0; i < p0.size(); ++i) {
      const float d = gr[i] + 0.1f * p0[i];  // the buffer starts at zeros
      ASSERT_NEAR(b1[i], d, 1e-6f * std::abs(d) + 1e-30f) << i;
      ASSERT_NEAR(p1[i], p0[i] - 0.5f * d, 1e-6f * std::abs(p0[i]) + 1e-12f) << i;
      moved = moved || p1[i] != p0[i];
    }
    EXPECT_TRUE(moved);
  }
  EXPECT_EQ(static_cast<int>(base->updated.size()), 2 * params);
  ExpectPoliciesGiveTheBaselinesBits(*g, *base, {"dtr", "rotor", "sqrtn", "checkmate-lp"},
                                     *backend);
}

// state=host: every policy plans the step without the state and streams it
// through the updates (Note [Updates last]): prefetched once, offloaded and
// freed once, on the host at the end; the peak drops by all the state but
// one parameter's.
TEST(OptimizerTest, StateOnTheHostIsStreamedThroughTheUpdates) {
  absl::StatusOr<Graph> resident = BuildModel("transformer:layers=2,optimizer=adam");
  absl::StatusOr<Graph> plain = BuildModel("transformer:layers=2");
  absl::StatusOr<OptimizerSpec> spec = ParseOptimizer("adam:state=host");
  ASSERT_TRUE(resident.ok() && plain.ok() && spec.ok());
  absl::StatusOr<Graph> g = AddOptimizerStep(*plain, *spec);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->home(g->Find("exp_avg:ln_f.weight")), Tier::kHost);
  EXPECT_EQ(g->host_persistent_bytes(), 2 * GradedParameterBytes(*plain));
  EXPECT_FALSE(g->home(g->Find("optimizer.step")).has_value());  // resident: 4 bytes
  for (const char* policy : {"baseline", "rotor", "dtr"}) {
    SCOPED_TRACE(policy);
    absl::StatusOr<PlanOutcome> host = PlanAtMin(*g, policy);
    absl::StatusOr<PlanOutcome> device = PlanAtMin(*resident, policy);
    ASSERT_TRUE(host.ok() && device.ok()) << host.status() << device.status();
    EXPECT_LT(host->result.report.peak_bytes,
              device->result.report.peak_bytes - g->host_persistent_bytes() / 2);
    EXPECT_EQ(host->result.report.transfer_bytes, 2 * g->host_persistent_bytes());
    std::vector<int> prefetched(g->num_nodes(), 0), offloaded(g->num_nodes(), 0);
    for (const Step& step : host->result.schedule.steps) {
      prefetched[step.node] += step.action == Action::kPrefetch;
      offloaded[step.node] += step.action == Action::kOffload;
    }
    for (NodeId v = 0; v < g->num_nodes(); ++v) {
      const int moves = g->home(v) == Tier::kHost ? 1 : 0;
      EXPECT_EQ(prefetched[v], moves) << g->id(v);
      EXPECT_EQ(offloaded[v], moves) << g->id(v);
    }
  }
}

// Plans `training` with each optimizer spec under `policy` at `min`, runs
// each plan on the CPU backend (measured peaks == predicted, device and
// host) and expects every run's updated tensors to be the first run's, bit
// for bit.
void ExpectSameUpdatedBits(const Graph& training, const std::vector<OptimizerSpec>& specs,
                           const char* policy) {
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  std::vector<std::vector<HostTensor>> updated;
  for (const OptimizerSpec& spec : specs) {
    SCOPED_TRACE(spec.ToString());
    absl::StatusOr<Graph> g = AddOptimizerStep(training, spec);
    ASSERT_TRUE(g.ok()) << g.status();
    absl::StatusOr<PlanOutcome> plan = PlanAtMin(*g, policy);
    ASSERT_TRUE(plan.ok()) << plan.status();
    absl::StatusOr<ExecutionResult> r = Execute(*g, plan->result.schedule, *backend);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->peak_bytes, r->predicted.peak_bytes);
    EXPECT_EQ(r->host_peak_bytes, r->predicted.host_peak_bytes);
    updated.push_back(r->updated);
  }
  ASSERT_FALSE(updated.empty());
  ASSERT_FALSE(updated[0].empty());
  for (size_t run = 1; run < updated.size(); ++run) {
    ASSERT_EQ(updated[run].size(), updated[0].size());
    for (size_t i = 0; i < updated[0].size(); ++i) {
      EXPECT_TRUE(updated[run][i].array.data == updated[0][i].array.data) << run << " " << i;
    }
  }
}

// The same step with the state on the host and resident: the same bits,
// and measured peak == predicted on the CPU backend.
TEST(OptimizerTest, StateOnTheHostRunsToTheResidentStatesBits) {
  absl::StatusOr<Graph> plain = BuildModel("conv3d:n=8");
  absl::StatusOr<OptimizerSpec> resident = ParseOptimizer("adamw:lr=0.01");
  absl::StatusOr<OptimizerSpec> host = ParseOptimizer("adamw:lr=0.01,state=host");
  ASSERT_TRUE(plain.ok() && resident.ok() && host.ok());
  ExpectSameUpdatedBits(*plain, {*resident, *host}, "dtr");
}

// gradients=drop: the gradients are no outputs, and every policy runs an
// update early (Note [Updates early]) where that lowers the peak; the
// result is a valid plan no worse than the updates last, and it runs to the
// same parameters and state, bit for bit, as the plan that keeps them.
TEST(OptimizerTest, DroppedGradientsLetTheUpdatesRunEarly) {
  absl::StatusOr<OptimizerSpec> spec = ParseOptimizer("adam:state=host,gradients=drop");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->keep_gradients);
  EXPECT_THAT(spec->ToString(), HasSubstr("state=host,gradients=drop"));
  absl::StatusOr<OptimizerSpec> bad = ParseOptimizer("sgd:gradients=lose");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("(expected keep or drop)"));
  absl::StatusOr<OptimizerSpec> keep = ParseOptimizer("adam:state=host");
  absl::StatusOr<Graph> plain = BuildModel("resnet18:batch=2,image=32");
  ASSERT_TRUE(plain.ok() && keep.ok());
  absl::StatusOr<Graph> dropped = AddOptimizerStep(*plain, *spec);
  absl::StatusOr<Graph> kept = AddOptimizerStep(*plain, *keep);
  ASSERT_TRUE(dropped.ok() && kept.ok());
  EXPECT_EQ(dropped->outputs().size(), 1u);  // the loss alone
  for (const char* policy : {"baseline", "rotor", "dtr"}) {
    SCOPED_TRACE(policy);
    absl::StatusOr<PlanOutcome> early = PlanAtMin(*dropped, policy);
    absl::StatusOr<PlanOutcome> last = PlanAtMin(*kept, policy);
    ASSERT_TRUE(early.ok() && last.ok()) << early.status() << last.status();
    EXPECT_EQ(early->result.details.value("updates", ""), "early");
    // resnet18's gradients are about its parameters' size: most of them go.
    EXPECT_LT(early->result.report.peak_bytes,
              last->result.report.peak_bytes - GradedParameterBytes(*plain) / 2);
  }
  // Planned jointly (sinks) where activations set the peak: the
  // transformer's step with its state streamed drops by a quarter at least.
  absl::StatusOr<Graph> lm = BuildModel("transformer:layers=4");
  ASSERT_TRUE(lm.ok());
  absl::StatusOr<Graph> lm_dropped = AddOptimizerStep(*lm, *spec);
  absl::StatusOr<Graph> lm_kept = AddOptimizerStep(*lm, *keep);
  ASSERT_TRUE(lm_dropped.ok() && lm_kept.ok());
  absl::StatusOr<PlanOutcome> joint = PlanAtMin(*lm_dropped, "rotor");
  absl::StatusOr<PlanOutcome> apart = PlanAtMin(*lm_kept, "rotor");
  ASSERT_TRUE(joint.ok() && apart.ok()) << joint.status() << apart.status();
  EXPECT_EQ(joint->result.details.value("updates_planned_with_sinks", false), true);
  EXPECT_LT(joint->result.report.peak_bytes, apart->result.report.peak_bytes * 3 / 4);
  // Run: small enough to execute here; the same bits as with the gradients kept.
  for (const char* model :
       {"conv3d:n=8", "transformer:layers=2,seq=8,dim=16,heads=2,batch=2,vocab=20"}) {
    SCOPED_TRACE(model);
    absl::StatusOr<Graph> small = BuildModel(model);
    ASSERT_TRUE(small.ok());
    ExpectSameUpdatedBits(*small, {*keep, *spec}, "rotor");
  }
}

// A gradient that the backward adds into a held .grad (an in-place node of
// the backward, as pebble.torch makes for gradient accumulation) is freed
// once added, under the graph's own order too: baseline holds one gradient
// at a time, as autograd does, where it held every gradient to the end.
TEST(OptimizerTest, AGradientAddedIntoItsGradIsFreedOnceAdded) {
  nlohmann::json nodes = nlohmann::json::array();
  nodes.push_back({{"id", "x"}, {"bytes", 10}, {"persistent", true}});
  std::vector<std::string> outputs = {"loss"};
  for (int k = 0; k < 3; ++k) {
    const std::string held = absl::StrCat("grad", k, ".held");
    nodes.push_back({{"id", held}, {"bytes", 1000}, {"persistent", true}, {"role", "buffer"}});
  }
  nodes.push_back({{"id", "loss"}, {"bytes", 10}, {"cost", 1}, {"inputs", {"x"}}});
  // Each gradient is added through a view of it (a weight's gradient is
  // mm(...).t()): the view is made where the step's schedule needs it.
  for (int k = 0; k < 3; ++k) {
    const std::string g = absl::StrCat("g", k), held = absl::StrCat("grad", k, ".held");
    const std::string view = absl::StrCat(g, ".t");
    nodes.push_back({{"id", g}, {"bytes", 1000}, {"cost", 1}, {"inputs", {"loss"}},
                     {"role", "backward"}});
    nodes.push_back({{"id", view}, {"bytes", 1000}, {"cost", 0}, {"inputs", {g}},
                     {"alias_of", g}, {"role", "backward"}});
    nodes.push_back({{"id", absl::StrCat("grad:", k)}, {"bytes", 1000}, {"cost", 1},
                     {"inputs", {view, held}}, {"alias_of", held}, {"in_place", true},
                     {"role", "backward"}});
    outputs.push_back(absl::StrCat("grad:", k));
  }
  absl::StatusOr<Graph> g = GraphFromJson(
      {{"format", "pebble-graph"}, {"version", 1}, {"nodes", nodes}, {"outputs", outputs}});
  ASSERT_TRUE(g.ok()) << g.status();
  const int64_t persistent = 10 + 3 * 1000;
  for (const char* policy : {"baseline", "best-order", "dtr"}) {
    SCOPED_TRACE(policy);
    absl::StatusOr<PlanOutcome> plan = PlanAtMin(*g, policy);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->result.report.peak_bytes, persistent + 10 + 1000);
  }
}

// A home on a parameter that no update writes (no optimizer) is refused.
TEST(OptimizerTest, AHomeOnAParameterNoUpdateWritesIsRefused) {
  absl::StatusOr<Graph> plain = BuildModel("conv3d:n=8");
  ASSERT_TRUE(plain.ok());
  GraphBuilder b(plain->name());
  for (NodeId v = 0; v < plain->num_nodes(); ++v) {
    NodeSpec spec = SpecOf(*plain, v);
    if (spec.id == "conv1.weight") spec.home = Tier::kHost;
    b.AddNode(std::move(spec));
  }
  for (NodeId o : plain->outputs()) b.AddOutput(plain->id(o));
  absl::StatusOr<Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  PlanRequest request;
  absl::StatusOr<PlanOutcome> plan = PlanGraph(*g, request);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("node 'conv1.weight' has 'home' and is read by more than the "
                        "optimizer's updates"));
}

// max_grad_norm (Note [Clipping in the graph]): the updates read every
// gradient scaled by clip_grad_norm_'s factor, min(1, c / (n + 1e-6)), n the
// 2-norm of all the gradients; the step outputs the clipped gradients and
// n ("grad_norm"). On the CPU backend the clipped gradients' norm is n
// times that factor and each parameter moves by lr times its clipped
// gradient; every policy gives the baseline's bits, measured peak ==
// predicted. Several ranks and sharding refuse the step, and so does a
// gradient that is not float32.
TEST(OptimizerTest, ClippingScalesEveryGradientByTheNormsFactor) {
  absl::StatusOr<OptimizerSpec> spec = ParseOptimizer("sgd:lr=0.5,max_grad_norm=0.01");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->ToString(), "sgd:lr=0.5,momentum=0,weight_decay=0,max_grad_norm=0.01");
  for (const char* bad : {"adam:max_grad_norm=0", "sgd:max_grad_norm=-1"}) {
    absl::StatusOr<OptimizerSpec> refused = ParseOptimizer(bad);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("is out of range (above 0)"));
  }
  absl::StatusOr<Graph> plain = BuildModel("conv3d:n=8");
  ASSERT_TRUE(plain.ok());
  absl::StatusOr<Graph> g = AddOptimizerStep(*plain, *spec);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(ClipsGradients(*g));
  EXPECT_FALSE(ClipsGradients(*AddOptimizerStep(*plain, *ParseOptimizer("sgd:lr=0.5"))));
  const NodeId update = g->Find("update:conv1.weight");
  const NodeId clipped = g->Find("grad:conv1.weight");
  ASSERT_NE(update, kNoNode);
  ASSERT_NE(clipped, kNoNode);
  EXPECT_EQ(g->op(clipped), "mul");
  EXPECT_EQ(g->id(g->inputs(update)[1]), "grad:conv1.weight");
  EXPECT_EQ(g->id(g->inputs(clipped)[0]), "unclipped_grad:conv1.weight");
  EXPECT_TRUE(g->is_output(clipped));
  EXPECT_TRUE(g->is_output(g->Find("grad_norm")));
  EXPECT_FALSE(g->is_output(g->Find("unclipped_grad:conv1.weight")));

  std::unique_ptr<Backend> backend = MakeCpuBackend();
  absl::StatusOr<ExecutionResult> base = Execute(*g, BaselineSchedule(*g), *backend);
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(base->peak_bytes, base->predicted.peak_bytes);
  const HostTensor* norm = base->FindOutput(*g, "grad_norm");
  ASSERT_NE(norm, nullptr);
  const double n = Floats(norm->array).at(0);
  const double factor = std::min(1.0, 0.01 / (n + 1e-6));
  ASSERT_LT(factor, 0.5) << "the norm " << n << " is too small for the clipping to show";
  double clipped_squares = 0;
  for (NodeId p = 0; p < g->num_nodes(); ++p) {
    if (g->role(p) != Role::kParameter) continue;
    const std::string& id = g->id(p);
    SCOPED_TRACE(id);
    const HostTensor* grad = base->FindOutput(*g, "grad:" + id);
    const HostTensor* after = Find(*g, base->updated, id);
    absl::StatusOr<NpyArray> before = GenerateInput(*g, p, /*seed=*/0);
    ASSERT_TRUE(grad != nullptr && after != nullptr && before.ok());
    const std::vector<float> p0 = Floats(*before), gr = Floats(grad->array),
                             p1 = Floats(after->array);
    for (size_t i = 0; i < p0.size(); ++i) {
      clipped_squares += static_cast<double>(gr[i]) * gr[i];
      ASSERT_NEAR(p1[i], p0[i] - 0.5f * gr[i], 1e-6f * std::abs(p0[i]) + 1e-12f) << i;
    }
  }
  EXPECT_NEAR(std::sqrt(clipped_squares), n * factor, 1e-5 * n * factor);
  ExpectPoliciesGiveTheBaselinesBits(*g, *base, {"dtr", "rotor", "checkmate-lp"}, *backend);

  // Data parallel: the unclipped gradients are summed, before the clipping
  // reads them (data_parallel_run_test checks the numbers); a schedule that
  // clips before the sums is refused. Sharded, the clipping works on
  // shards (collectives_test, data_parallel_run_test).
  PlanRequest ranks;
  ranks.policy = "dtr";
  ranks.budget = "min";
  ranks.options.ranks = 2;
  absl::StatusOr<PlanOutcome> several = PlanGraph(*g, ranks);
  ASSERT_TRUE(several.ok()) << several.status();
  std::set<std::string> summed;
  for (const Step& s : several->result.schedule.steps) {
    if (s.action == Action::kAllReduce) summed.insert(g->id(s.node));
  }
  EXPECT_TRUE(summed.contains("unclipped_grad:conv1.weight")) << absl::StrJoin(summed, ", ");
  EXPECT_FALSE(summed.contains("grad:conv1.weight"));
  absl::StatusOr<Graph> sharded = ShardGraph(*g, 2, NetworkLink{});
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_NE(sharded->Find(kClipTotalId), kNoNode);
  SimulatorOptions two_ranks;
  two_ranks.ranks = 2;
  absl::StatusOr<PlanReport> simulated = Simulate(*g, BaselineSchedule(*g), two_ranks);
  ASSERT_FALSE(simulated.ok());
  EXPECT_THAT(std::string(simulated.status().message()),
              HasSubstr("the clipping reads a gradient after its all_reduce"));
  absl::StatusOr<Graph> half = BuildModel("unet3d:batch=1,variant=small,depth=8,height=8,"
                                          "width=8,dtype=fp16");
  ASSERT_TRUE(half.ok()) << half.status();
  absl::StatusOr<Graph> refused = AddOptimizerStep(*half, *spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("pebble clips float32 gradients"));
  // A graph that holds the clipping's nodes already (a step clipped twice).
  absl::StatusOr<Graph> twice = AddOptimizerStep(*g, *spec);
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(std::string(twice.status().message()),
              HasSubstr("max_grad_norm: the graph already has a node "
                        "'unclipped_grad:conv1.weight'"));
  // The zoo's key: the same graph as --optimizer's setting.
  absl::StatusOr<Graph> zoo = BuildModel("conv3d:n=8,optimizer=sgd,max_grad_norm=0.01");
  ASSERT_TRUE(zoo.ok()) << zoo.status();
  EXPECT_TRUE(ClipsGradients(*zoo));
  EXPECT_EQ(zoo->num_nodes(), g->num_nodes());
  const std::pair<const char*, const char*> bad_zoo[] = {
      {"conv3d:n=8,max_grad_norm=1", "max_grad_norm=1 needs an optimizer"},
      {"conv3d:n=8,optimizer=adam,max_grad_norm=0",
       "model 'conv3d': max_grad_norm=0 is out of range (above 0)"},
      {"conv3d:n=8,optimizer=adam,max_grad_norm=big", "max_grad_norm='big' is not a decimal"}};
  for (const auto& [text, message] : bad_zoo) {
    absl::StatusOr<Graph> bad = BuildModel(text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr(message)) << text;
  }
}

}  // namespace
}  // namespace pebble
