// pebble import: an ONNX model as a pebble graph (graph/import/onnx_import.h,
// docs/import.md).
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/common.h"
#include "graph/autodiff.h"
#include "graph/graph_json.h"
#include "graph/import/onnx_import.h"
#include "graph/status.h"

namespace pebble::cli {
namespace {

struct ImportFlags {
  std::string model_path;
  std::string loss = "cross-entropy";
  int64_t batch = 0;  // 0: the model's own
  std::string output;
  std::string optimizer;  // empty: none (graph/optimizer.h)
  std::string frozen;     // --frozen's patterns; empty: none
  double throughput_flops_per_s = 10e12;
  bool force = false;
  bool json = false;
};

int RunImport(const ImportFlags& flags) {
  if (flags.json && flags.output == "-") {
    // Two documents on stdout would be one that no JSON reader takes.
    return Fail(UsageError(
        "--output - writes the graph on stdout, where --json prints the summary: give "
        "--output FILE with --json, or leave out --json to get the graph alone"));
  }
  absl::Status output_ok =
      CheckOutputs({{flags.output, "--output"}}, {{flags.model_path, "the ONNX model"}},
                   flags.force);
  if (!output_ok.ok()) return Fail(output_ok);
  OnnxImportOptions options;
  if (absl::Status loss = SetOnnxLoss(flags.loss, options); !loss.ok()) return Fail(loss);
  const LossKind loss = options.loss;
  std::optional<OptimizerSpec> optimizer;
  if (!flags.optimizer.empty()) {
    absl::StatusOr<OptimizerSpec> spec = ParseOptimizerOption(flags.optimizer);
    if (!spec.ok()) return Fail(spec.status());
    if (loss == LossKind::kNone) {
      return Fail(UsageError("--optimizer needs a training graph: give --loss, not --loss none"));
    }
    optimizer = *spec;
  }
  absl::StatusOr<std::vector<std::string>> frozen = ParseFrozenOption(flags.frozen);
  if (!frozen.ok()) return Fail(frozen.status());
  options.frozen = *std::move(frozen);
  if (flags.batch > 0) options.batch = flags.batch;
  options.cost_model.device_flops_per_s = flags.throughput_flops_per_s;
  std::vector<std::string> notes;
  auto graph = ImportOnnxFile(flags.model_path, options, &notes);
  if (!graph.ok()) return Fail(ImportErrorOfOptions(graph.status()));
  for (const std::string& note : notes) std::cerr << "pebble: note: " << note << "\n";
  if (optimizer.has_value()) {
    graph = AppendOptimizerStep(*graph, *optimizer, options.cost_model);
    if (!graph.ok()) return Fail(graph.status());
  }
  absl::Status written = WriteOutput(flags.output, GraphToJsonText(*graph), flags.force);
  if (!written.ok()) return Fail(written);

  int64_t parameters = 0, parameter_bytes = 0, buffers = 0;  // (buffers: --frozen's too)
  for (NodeId v = 0; v < graph->num_nodes(); ++v) {
    if (graph->role(v) == Role::kBuffer) ++buffers;
    if (graph->role(v) != Role::kParameter) continue;
    ++parameters;
    parameter_bytes += graph->bytes(v);
  }
  if (flags.json) {
    nlohmann::json doc = {{"graph", graph->name()},
                          {"output", flags.output},
                          {"loss", flags.loss},
                          {"nodes", graph->num_nodes()},
                          {"aliases", graph->num_aliases()},
                          {"parameters", parameters},
                          {"parameter_bytes", parameter_bytes},
                          {"buffers", buffers},
                          {"persistent_bytes", graph->persistent_bytes()},
                          {"outputs", graph->outputs().size()},
                          {"notes", notes}};
    PrintJson(doc);
  } else if (flags.output != "-") {
    std::cout << "imported " << flags.model_path << " as '" << graph->name() << "' ("
              << (loss == LossKind::kNone ? "forward graph"
                                          : absl::StrCat("training graph, loss ", flags.loss))
              << "): " << graph->num_nodes() << " nodes (" << graph->num_aliases()
              << (graph->num_aliases() == 1 ? " view), " : " views), ") << parameters
              << (parameters == 1 ? " parameter of " : " parameters of ")
              << parameter_bytes << " bytes and " << buffers
              << (buffers == 1 ? " buffer" : " buffers") << "; wrote " << flags.output << "\n";
  }
  return 0;
}

}  // namespace

void AddImportCommand(CLI::App& app, int& exit_code) {
  static ImportFlags flags;
  auto* cmd = app.add_subcommand(
      "import",
      "read an ONNX model (torch.onnx.export in training mode) and write a pebble graph: "
      "the training graph with --loss, the forward graph with --loss none (docs/import.md)\n"
      "  e.g. /usr/bin/python3 examples/onnx/export.py onnx-out resnet18 --batch 2 --image 64\n"
      "       pebble import onnx-out/resnet18.onnx --loss cross-entropy --output resnet18.json");
  cmd->add_option("model", flags.model_path, "the .onnx file")->required();
  cmd->add_option("--loss", flags.loss,
                  "loss to add and differentiate: cross-entropy (nn.CrossEntropyLoss; "
                  "input 'target' of class indices, the classes on dimension 1: export a "
                  "language model's logits flattened to (batch x sequence, vocabulary); a "
                  "model whose last node is log_softmax over the classes gets the same loss, "
                  "which takes that node in), nll (nn.NLLLoss of the log_softmax the model "
                  "ends in: the same as cross-entropy on its input), mse (nn.MSELoss), bce "
                  "(nn.BCEWithLogitsLoss of logits: input 'target' of the output's shape, the "
                  "probabilities of the positive class), or none (default cross-entropy)")
      ->check(CLI::IsMember({"cross-entropy", "nll", "mse", "bce", "none"}));
  AddOptimizerOption(cmd, flags.optimizer);
  AddFrozenOption(cmd, flags.frozen);
  cmd->add_option("--batch", flags.batch,
                  "batch size: rewrites dimension 0 of every graph input (needed when the "
                  "model's batch dimension is symbolic; a file of fixed batch keeps the sizes "
                  "it computed from it, which a note says: export with dynamic_axes)")
      ->check(IntegerIn(1, int64_t{1} << 24));
  cmd->add_option("--output,-o", flags.output,
                  "graph file to write ('-': stdout, without --json); never the model itself")
      ->required();
  cmd->add_option("--throughput", flags.throughput_flops_per_s,
                  "device FLOP/s that turns FLOPs into seconds of cost (default 10e12)")
      ->check(NumberAbove(0, "a positive number of FLOP/s"));
  cmd->add_flag("--force", flags.force, "replace an existing output file");
  cmd->add_flag("--json", flags.json, "print a JSON summary (with --output FILE)");
  cmd->callback([&exit_code] { exit_code = RunImport(flags); });
}

}  // namespace pebble::cli
