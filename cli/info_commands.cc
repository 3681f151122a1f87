// pebble models | policies | describe | export
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/common.h"
#include "graph/graph_json.h"
#include "graph/models/models.h"
#include "graph/optimizer.h"
#include "graph/status.h"
#include "scheduler/budget.h"
#include "scheduler/memory_layout.h"
#include "scheduler/planner.h"

namespace pebble::cli {
namespace {

int RunModels(bool json) {
  if (json) {
    nlohmann::json doc = nlohmann::json::array();
    for (const ModelInfo& m : ListModels()) {
      nlohmann::json params = nlohmann::json::array();
      for (const ModelParam& p : m.params) {
        params.push_back({{"name", p.name}, {"default", p.default_value}, {"help", p.help}});
      }
      doc.push_back({{"name", m.name},
                     {"description", m.description},
                     {"training_graph", m.training_graph},
                     {"params", params}});
    }
    PrintJson(doc);
    return 0;
  }
  std::vector<std::pair<std::string, std::string>> entries;
  for (const ModelInfo& m : ListModels()) {
    std::vector<std::string> params;
    for (const ModelParam& p : m.params) params.push_back(p.name + "=" + p.default_value);
    entries.emplace_back(m.name, absl::StrCat(m.description, "\n",
                                              params.empty() ? "(no parameters)"
                                                             : absl::StrJoin(params, " ")));
  }
  std::cout << DefinitionList(entries, 100)
            << "\nName a model with parameters: conv3d:n=128,batch=2. Unset parameters take "
               "the defaults\nshown; 'pebble models --json' has what each one means.\n";
  return 0;
}

int RunPolicies(bool json) {
  const auto policies = PlannerRegistry::Global().List();
  if (json) {
    nlohmann::json doc = nlohmann::json::array();
    for (const PolicyInfo* p : policies) {
      doc.push_back({{"name", p->name},
                     {"kind", std::string(PlanKindName(p->kind))},
                     {"exact", p->exact},
                     {"description", p->description}});
    }
    PrintJson(doc);
    return 0;
  }
  std::vector<std::pair<std::string, std::string>> entries;
  for (const PolicyInfo* p : policies) {
    entries.emplace_back(p->name, absl::StrCat(PlanKindName(p->kind), ", ",
                                               p->exact ? "exact" : "heuristic", ": ",
                                               p->description));
  }
  std::cout << DefinitionList(entries, 100);
  return 0;
}

// Elements of a tensor node: from its shape, else bytes / 4.
int64_t Elements(const Graph& g, NodeId v) {
  if (g.shape(v).has_value()) return NumElements(*g.shape(v));
  return g.bytes(v) / 4;
}

struct MemorySummary {
  int64_t parameters = 0, parameter_bytes = 0;
  int64_t buffer_bytes = 0, input_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  int64_t gradient_bytes = 0;  // the parameter gradients (outputs)
  int64_t forward_bytes = 0;   // all forward activations, kept at once
  int64_t backward_bytes = 0;  // all backward tensors
  int64_t baseline_peak = 0;
};

// Storages count once (SPEC section 1, "Aliases"): a view adds no bytes,
// except that a gradient output that is a view counts its storage, once.
MemorySummary Summarize(const Graph& g, int64_t baseline_peak) {
  MemorySummary s;
  s.baseline_peak = baseline_peak;
  std::vector<uint8_t> gradient_storage(g.num_nodes(), 0);
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    if (g.is_alias(v)) {
      const NodeId root = g.storage(v);
      if (g.role(v) == Role::kBackward && g.is_output(v) && !g.is_output(root) &&
          !gradient_storage[root]) {
        gradient_storage[root] = 1;
        s.gradient_bytes += g.bytes(root);
      }
      continue;
    }
    switch (g.role(v)) {
      case Role::kParameter:
        s.parameters += Elements(g, v);
        s.parameter_bytes += g.bytes(v);
        break;
      case Role::kBuffer: s.buffer_bytes += g.bytes(v); break;
      case Role::kInput: s.input_bytes += g.bytes(v); break;
      case Role::kForward: s.forward_bytes += g.bytes(v); break;
      case Role::kBackward:
        s.backward_bytes += g.bytes(v);
        // (a clipped step's norm is an output of the backward, no gradient)
        if (g.is_output(v) && g.id(v) != kGradNormId) s.gradient_bytes += g.bytes(v);
        break;
      case Role::kOptimizerState: s.optimizer_state_bytes += g.bytes(v); break;
      case Role::kUpdate: break;  // in place: no bytes of its own
    }
  }
  return s;
}

// The baseline plan of `g`, simulated once by PlanMemoryLayout: its peak
// and the arena it needs (the runtime allocates exactly this). A graph that
// pebble's policies do not plan (a 'home' on a tensor that more than the
// updates read) has none: the status says why.
absl::StatusOr<MemoryLayout> BaselineLayout(const Graph& g) {
  RETURN_IF_ERROR(CheckPlannable(g));
  ASSIGN_OR_RETURN(const Schedule schedule, BaselinePlanSchedule(g));
  return PlanMemoryLayout(g, schedule);
}

int RunDescribe(const GraphSource& source, bool json) {
  auto graph = source.Load();
  if (!graph.ok()) return Fail(graph.status());
  const Graph& g = *graph;
  const absl::StatusOr<MemoryLayout> layout = BaselineLayout(g);
  // (a graph that no policy plans is still described, without its baseline)
  if (!layout.ok() && layout.status().code() != absl::StatusCode::kUnimplemented) {
    return Fail(layout.status());
  }
  const MemorySummary s = Summarize(g, layout.ok() ? layout->peak_bytes : 0);
  if (json) {
    nlohmann::json nodes = nlohmann::json::array();
    for (NodeId v = 0; v < g.num_nodes(); ++v) {
      nlohmann::json n = {{"id", g.id(v)},
                          {"op", g.op(v)},
                          {"role", std::string(RoleName(g.role(v)))},
                          {"bytes", g.bytes(v)},
                          {"cost", g.cost(v)},
                          {"workspace", g.workspace(v)},
                          {"persistent", g.persistent(v)},
                          {"output", g.is_output(v)}};
      if (g.shape(v).has_value()) n["shape"] = *g.shape(v);
      if (g.dtype(v).has_value()) n["dtype"] = std::string(DTypeName(*g.dtype(v)));
      if (g.is_alias(v)) n["alias_of"] = g.id(g.alias_of(v));
      nodes.push_back(std::move(n));
    }
    nlohmann::json summary = {{"num_nodes", g.num_nodes()},
                              {"num_aliases", g.num_aliases()},
                              {"parameters", s.parameters},
                              {"parameter_bytes", s.parameter_bytes},
                              {"buffer_bytes", s.buffer_bytes},
                              {"optimizer_state_bytes", s.optimizer_state_bytes},
                              {"input_bytes", s.input_bytes},
                              {"gradient_bytes", s.gradient_bytes},
                              {"forward_activation_bytes", s.forward_bytes},
                              {"backward_bytes", s.backward_bytes},
                              {"persistent_bytes", g.persistent_bytes()},
                              {"baseline_peak_bytes", nullptr},
                              {"baseline_arena_bytes", nullptr},
                              {"baseline_fragmentation", nullptr}};
    if (layout.ok()) {
      summary["baseline_peak_bytes"] = s.baseline_peak;
      summary["baseline_arena_bytes"] = layout->arena_bytes;
      summary["baseline_fragmentation"] = layout->fragmentation;
    } else {
      summary["baseline_note"] = layout.status().message();
    }
    PrintJson({{"graph", g.name()}, {"nodes", nodes}, {"summary", summary}});
    return 0;
  }
  // Graphs with views get an "alias of" column (a view's bytes are its
  // logical size; it holds none of its own).
  std::vector<std::string> header = {"node", "op", "role", "shape", "dtype", "bytes", "cost",
                                     "inputs"};
  if (g.has_aliases()) header.push_back("alias of");
  Table table(header);
  const CostUnit unit = source.Costs();
  for (NodeId v = 0; v < g.num_nodes(); ++v) {
    std::vector<std::string> inputs;
    for (NodeId u : g.inputs(v)) inputs.push_back(g.id(u));
    std::string in = absl::StrJoin(inputs, ",");
    if (in.size() > 48) in = in.substr(0, 45) + "...";
    std::vector<std::string> row = {
        g.id(v) + (g.is_output(v) ? " *" : ""), g.op(v), std::string(RoleName(g.role(v))),
        g.shape(v).has_value() ? ShapeToString(*g.shape(v)) : "",
        g.dtype(v).has_value() ? std::string(DTypeName(*g.dtype(v))) : "",
        FormatBytes(g.bytes(v)), unit.Amount(g.cost(v)), in};
    if (g.has_aliases()) row.push_back(g.is_alias(v) ? g.id(g.alias_of(v)) : "");
    table.AddRow(row);
  }
  std::cout << "Graph " << (g.name().empty() ? source.Label() : g.name()) << " ("
            << g.num_nodes() << " nodes; * marks outputs"
            << (g.has_aliases()
                    ? absl::StrCat("; ", g.num_aliases(),
                                   g.num_aliases() == 1 ? " view shares its" : " views share their",
                                   " base's memory, counted once")
                    : std::string())
            << "; cost: " << unit.Basis()
            << ")\n\n"
            << table.ToString() << "\n";
  Table summary({"memory", "bytes", "human"});
  auto row = [&](const std::string& what, int64_t bytes) {
    summary.AddRow({what, absl::StrCat(bytes), FormatBytes(bytes)});
  };
  row(absl::StrCat("parameters (", s.parameters, " values)"), s.parameter_bytes);
  row("parameter gradients", s.gradient_bytes);
  row("buffers (running stats)", s.buffer_bytes);
  if (s.optimizer_state_bytes > 0) row("optimizer state", s.optimizer_state_bytes);
  row("data batch (input, target)", s.input_bytes);
  row("forward activations, all kept", s.forward_bytes);
  row("backward tensors, all kept", s.backward_bytes);
  if (layout.ok()) {
    row("baseline peak (own order, free at last use)", s.baseline_peak);
    row(absl::StrFormat("baseline arena (%s, +%.2f%%)", layout->strategy,
                        100 * layout->fragmentation),
        layout->arena_bytes);
  }
  std::cout << summary.ToString();
  if (!layout.ok()) std::cout << "no baseline plan: " << layout.status().message() << "\n";
  return 0;
}

// Writes the graph as one rank runs it: sharded where `ranks` says
// --shard full, as plan and simulate shard it.
int RunExport(const GraphSource& source, const RankFlags& ranks, const std::string& format,
              const std::string& output, bool force) {
  if (absl::Status s = CheckOutputs({{output, "--output"}}, source.InputFiles(), force); !s.ok()) {
    return Fail(s);
  }
  if (ranks.ranks > 1 && ranks.shard == "none") {
    return Fail(UsageError(absl::StrCat(
        "--ranks ", ranks.ranks, " without --shard full: data parallelism runs the graph whole "
        "on every rank, so export would write the same graph; give --shard full to write one "
        "rank's sharded graph")));
  }
  // (a graph sharded already is written as it is, without --ranks)
  auto graph = ranks.shard == "full" ? ranks.Sharded(source.Load()) : source.Load();
  if (!graph.ok()) return Fail(graph.status());
  std::string text;
  if (format == "json") {
    text = GraphToJsonText(*graph);
  } else {
    text = GraphToDot(*graph);
  }
  absl::Status written = WriteOutput(output, text, force);
  if (!written.ok()) return Fail(written);
  return 0;
}

}  // namespace

void AddInfoCommands(CLI::App& app, int& exit_code) {
  static bool models_json = false, policies_json = false;
  auto* models = app.add_subcommand("models", "list the built-in models and their parameters");
  models->add_flag("--json", models_json, "print JSON");
  models->callback([&exit_code] { exit_code = RunModels(models_json); });

  auto* policies = app.add_subcommand(
      "policies", "list the planners: one-shot / multi-shot / offload, exact or heuristic");
  policies->add_flag("--json", policies_json, "print JSON");
  policies->callback([&exit_code] { exit_code = RunPolicies(policies_json); });

  static GraphSource describe_source;
  static bool describe_json = false;
  auto* describe = app.add_subcommand(
      "describe",
      "per-node table (op, shape, bytes, cost) and the memory summary: parameters, "
      "gradients, activations, baseline peak\n  e.g. pebble describe --model mnist-cnn:batch=32");
  describe_source.AddOptions(describe);
  describe->add_flag("--json", describe_json, "print JSON");
  describe->callback(
      [&exit_code] { exit_code = RunDescribe(describe_source, describe_json); });

  static GraphSource export_source;
  static RankFlags export_ranks;
  static std::string export_format = "json", export_output = "-";
  static bool export_force = false, export_json = false;
  auto* exp = app.add_subcommand(
      "export",
      "write the (training) graph as a pebble-graph JSON file or Graphviz DOT; with "
      "--ranks N --shard full, as one rank runs it sharded\n"
      "  e.g. pebble export --model conv3d:n=64 --format dot --output conv3d.dot");
  export_source.AddOptions(exp);
  export_ranks.AddOptions(exp, &export_source, /*planned=*/false, /*copies=*/false);
  exp->add_option("--format,-f", export_format, "json or dot")
      ->check(CLI::IsMember({"json", "dot"}));
  exp->add_option("--output,-o", export_output, "file to write ('-': stdout, the default)");
  exp->add_flag("--force", export_force, "replace an existing output file");
  exp->add_flag("--json", export_json, "same as --format json");
  exp->callback([&exit_code] {
    if (export_json && export_format != "json") {
      exit_code = Fail(UsageError(absl::StrCat("--json writes JSON, --format ", export_format,
                                               " asks for ", export_format, ": give one")));
      return;
    }
    exit_code = RunExport(export_source, export_ranks, export_json ? "json" : export_format,
                          export_output, export_force);
  });
}

}  // namespace pebble::cli
