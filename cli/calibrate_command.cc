// pebble calibrate: measures per-operator times and the host link bandwidth
// on a backend and writes a cost profile (scheduler/cost_profile.h) that
// plan/run/compare/fit take with --profile (docs/cuda.md, "Calibration").
//
// Method: the model's baseline schedule runs through the executor once to
// warm up (library autotuning, first-touch allocations) and then `--repeat`
// times; each compute step's measured duration (the backend's events) is a
// sample for its node's CostKey, and the profile keeps the median of all
// samples of a key (nodes of equal key, e.g. repeated layers, pool their
// samples). The bandwidth is the median of three timed Backend::Copy calls
// of `--transfer-size` bytes each way between a device buffer and a pinned
// host buffer. The host's rate for an optimizer's update on host copies
// (updates=host) is timed likewise (MeasureHostUpdate). Each kernel's
// scratch (Backend::QueryWorkspace) is planned as its node's workspace
// during the runs and kept in workspace_bytes. With --ranks N, the ranks
// (one process each) then meet and measure their network link
// (MeasureNetworkLink: all-reduces of 4 KiB and of --network-size), which
// rank 0 writes into the profile.
#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/common.h"
#include "graph/optimizer.h"
#include "graph/status.h"
#include "runtime/collectives.h"
#include "runtime/executor.h"
#include "runtime/gloo/gloo_collectives.h"
#include "runtime/make_backend.h"
#include "runtime/workspace.h"
#include "scheduler/budget.h"
#include "scheduler/cost_profile.h"
#include "scheduler/planner.h"

namespace pebble::cli {
namespace {

struct CalibrateFlags {
  GraphSource source;
  std::string backend = "cpu";
  std::string output;  // empty or "-": stdout
  int repeat = 5;
  std::string transfer_size = "64MiB";
  uint64_t seed = 0;
  bool force = false;
  bool json = false;
  // Several ranks: the network link (docs/cuda.md, "Calibration").
  int ranks = 1;
  RankProcessFlags process;  // --rank, --rendezvous, --address, --rank-timeout
  std::string network_size = "8MiB";
  bool network_size_given = false;  // (refused without --ranks, as the rank flags are)
};

// With --ranks N: meets the other ranks and measures the link into
// `profile`.
absl::Status MeasureNetwork(const CalibrateFlags& f, CostProfile& profile) {
  ASSIGN_OR_RETURN(const int64_t large, ParseSize(f.network_size));
  constexpr int64_t kSmallBytes = 4096;
  if (large < 4 * kSmallBytes) {
    return UsageError("--network-size: at least 16KiB (four times the small all-reduce)");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Collectives> collectives,
                   ConnectGloo(f.process.Gloo(f.ranks)));
  ASSIGN_OR_RETURN(const NetworkLink link, MeasureNetworkLink(*collectives, kSmallBytes, large));
  profile.network_bandwidth_bytes_per_s = link.bandwidth_bytes_per_s;
  profile.network_latency_s = link.latency_s;
  profile.network_ranks = f.ranks;
  return absl::OkStatus();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Bytes per second of `bytes` copied in `direction` (median of 3 timed
// copies on the copy stream).
absl::StatusOr<double> MeasureBandwidth(Backend& backend, CopyDirection direction,
                                        std::byte* device, std::byte* host, int64_t bytes) {
  std::vector<double> rates;
  for (int i = 0; i < 3; ++i) {
    backend.ResetEvents();
    ASSIGN_OR_RETURN(EventId start, backend.Record(Stream::kCopy));
    if (direction == CopyDirection::kHostToDevice) {
      RETURN_IF_ERROR(backend.Copy(direction, device, host, bytes));
    } else {
      RETURN_IF_ERROR(backend.Copy(direction, host, device, bytes));
    }
    ASSIGN_OR_RETURN(EventId end, backend.Record(Stream::kCopy));
    RETURN_IF_ERROR(backend.Synchronize());
    ASSIGN_OR_RETURN(double seconds, backend.ElapsedSeconds(start, end));
    if (seconds > 0) rates.push_back(static_cast<double>(bytes) / seconds);
  }
  backend.ResetEvents();
  if (rates.empty()) {
    return absl::InternalError("the copy timings were all zero; try a larger --transfer-size");
  }
  return Median(rates);
}

absl::Status MeasureLink(Backend& backend, int64_t bytes, CostProfile& profile) {
  ASSIGN_OR_RETURN(std::byte * device, backend.AllocateDevice(bytes));
  auto host = backend.AllocateHost(bytes);
  if (!host.ok()) {
    backend.FreeDevice(device);
    return host.status();
  }
  absl::Status s = backend.Fill(device, 0, bytes);
  if (s.ok()) {
    auto h2d = MeasureBandwidth(backend, CopyDirection::kHostToDevice, device, *host, bytes);
    auto d2h = h2d.ok() ? MeasureBandwidth(backend, CopyDirection::kDeviceToHost, device,
                                           *host, bytes)
                        : h2d;
    if (h2d.ok() && d2h.ok()) {
      profile.bandwidth_h2d_bytes_per_s = *h2d;
      profile.bandwidth_d2h_bytes_per_s = *d2h;
    } else {
      s = h2d.ok() ? d2h.status() : h2d.status();
    }
  }
  backend.FreeHost(*host);
  backend.FreeDevice(device);
  return s;
}

// The host's rate for an optimizer's update on host copies (bytes read
// plus written per second): Adam's first-moment update (three operands of
// `bytes`, one written) run as a host compute through the executor, on
// `backend`'s host buffers (pinned on CUDA); the median of three runs.
absl::StatusOr<double> MeasureHostUpdate(Backend& backend, int64_t bytes) {
  const int64_t elements = std::max<int64_t>(1, bytes / 4);
  bytes = elements * 4;
  GraphBuilder b("host-update-probe");
  for (const char* id : {"p", "g", "m"}) {
    NodeSpec t;
    t.id = id;
    t.bytes = bytes;
    t.persistent = true;
    t.home = Tier::kHost;
    t.shape = Shape{elements};
    t.dtype = DType::kFloat32;
    b.AddNode(std::move(t));
  }
  NodeSpec out;  // a graph has an output: a resident scalar
  out.id = "out";
  out.bytes = 4;
  out.persistent = true;
  out.shape = Shape{};
  out.dtype = DType::kFloat32;
  b.AddNode(std::move(out));
  b.AddOutput("out");
  NodeSpec update;
  update.id = "m#1";
  update.op = "adam_exp_avg";
  update.bytes = bytes;
  update.inputs = {"m", "g", "p"};
  update.alias_of = "m";
  update.in_place = true;
  update.runs_on = Tier::kHost;
  update.host_cost = 0;
  update.shape = Shape{elements};
  update.dtype = DType::kFloat32;
  update.attrs = {{"lr", 1e-3},   {"weight_decay", 0.0}, {"beta1", 0.9},
                  {"beta2", 0.999}, {"eps", 1e-8},       {"decoupled_weight_decay", false}};
  b.AddNode(std::move(update));
  ASSIGN_OR_RETURN(const Graph graph, b.Build());
  Schedule schedule;
  schedule.steps.push_back({Action::kHostCompute, graph.Find("m#1")});
  ExecutorOptions exec;
  exec.download_outputs = false;
  std::vector<double> rates;
  for (int run = 0; run <= 3; ++run) {  // run 0 warms up (first touch)
    ASSIGN_OR_RETURN(ExecutionResult r, Execute(graph, schedule, backend, exec));
    if (run > 0 && r.host_time_s > 0) {
      rates.push_back(static_cast<double>(4 * bytes) / r.host_time_s);  // 3 read, 1 written
    }
  }
  if (rates.empty()) {
    return absl::InternalError("the host update timings were all zero; try a larger "
                               "--transfer-size");
  }
  return Median(rates);
}

absl::StatusOr<std::pair<CostProfile, int>> Calibrate(const CalibrateFlags& f,
                                                      const Graph& given) {
  if (f.repeat < 1) return absl::InvalidArgumentError("--repeat must be at least 1");
  ASSIGN_OR_RETURN(int64_t transfer_bytes, ParseSize(f.transfer_size));
  if (transfer_bytes <= 0) return absl::InvalidArgumentError("--transfer-size must be positive");
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, MakeBackend(f.backend));
  if (backend == nullptr) {
    return absl::UnimplementedError(absl::StrCat("backend '", f.backend, "' is not available"));
  }
  // Kernels run with their scratch planned, as they will under a profile.
  ASSIGN_OR_RETURN(const Graph planned, WithBackendWorkspace(given, *backend));
  const Graph& graph = planned;
  ASSIGN_OR_RETURN(std::unique_ptr<Planner> planner, MakePlanner("baseline"));
  PlannerOptions options;  // no budget: the baseline order as it is
  ASSIGN_OR_RETURN(PlanResult plan, planner->Plan(graph, options));

  ExecutorOptions exec;
  exec.seed = f.seed;
  exec.download_outputs = false;
  std::map<std::string, std::vector<double>> samples;
  int keyed_nodes = 0;
  std::vector<std::optional<std::string>> keys(graph.num_nodes());
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    keys[v] = CostKey(graph, v);
  }
  for (int run = 0; run <= f.repeat; ++run) {  // run 0 warms up
    auto result = Execute(graph, plan.schedule, *backend, exec);
    if (!result.ok()) {
      return absl::Status(result.status().code(),
                          absl::StrCat("calibration run ", run, ": ", result.status().message()));
    }
    if (run == 0) continue;
    for (const StepMeasurement& step : result->steps) {
      if (step.action != Action::kCompute || !keys[step.node].has_value()) continue;
      samples[*keys[step.node]].push_back(std::max(0.0, step.end_s - step.start_s));
    }
  }
  CostProfile profile;
  profile.backend = backend->name();
  profile.device = backend->Description();
  for (auto& [key, times] : samples) profile.entries[key] = Median(times);
  for (NodeId v = 0; v < graph.num_nodes(); ++v) {
    if (!graph.persistent(v) && keys[v].has_value() && samples.count(*keys[v]) > 0) {
      ++keyed_nodes;
      if (graph.workspace(v) > 0) profile.workspace_bytes[*keys[v]] = graph.workspace(v);
    }
  }
  RETURN_IF_ERROR(MeasureLink(*backend, transfer_bytes, profile));
  // Up to 16 MiB a tensor: four of them live on the host at once.
  ASSIGN_OR_RETURN(profile.host_update_bytes_per_s,
                   MeasureHostUpdate(*backend, std::min<int64_t>(transfer_bytes, 16 << 20)));
  return std::make_pair(std::move(profile), keyed_nodes);
}

int RunCalibrate(const CalibrateFlags& f) {
  const bool to_stdout = f.output.empty() || f.output == "-";
  if (to_stdout && f.json) {
    return Fail(UsageError(
        "--json prints a summary on stdout, where the profile goes without --output: give "
        "--output FILE with --json"));
  }
  if (absl::Status s = f.process.Check(f.ranks); !s.ok()) return Fail(s);
  if (f.network_size_given && f.ranks < 2) {
    return Fail(UsageError("--network-size: the link's timed all-reduce; with --ranks 2 or "
                           "more only"));
  }
  // Before measuring, which takes a while: a refused --output fails now
  // (rank 0 alone writes it).
  if (absl::Status s = CheckOutputs({{to_stdout ? "-" : f.output, "--output"}},
                                    f.source.InputFiles(), f.force);
      f.process.rank == 0 && !s.ok()) {
    return Fail(s);
  }
  auto graph = f.source.Load();
  if (!graph.ok()) return Fail(graph.status());
  auto calibrated = Calibrate(f, *graph);
  if (!calibrated.ok()) return Fail(calibrated.status());
  CostProfile& profile = calibrated->first;
  if (f.ranks > 1) {
    if (absl::Status s = MeasureNetwork(f, profile); !s.ok()) return Fail(s);
    if (f.process.rank != 0) {
      std::cout << absl::StrFormat(
          "rank %d of %d: link %.3g GB/s, latency %s (rank 0 writes the profile)\n",
          f.process.rank,
          f.ranks, profile.network_bandwidth_bytes_per_s / 1e9,
          FormatSeconds(profile.network_latency_s));
      return 0;
    }
  }
  const std::string text = CostProfileToJson(profile).dump(2) + "\n";
  if (absl::Status s = WriteOutput(to_stdout ? "-" : f.output, text, f.force); !s.ok()) {
    return Fail(s);
  }
  if (to_stdout) return 0;  // stdout holds the profile itself
  if (f.json) {
    PrintJson({{"output", f.output},
               {"backend", profile.backend},
               {"device", profile.device},
               {"entries", profile.entries.size()},
               {"nodes_measured", calibrated->second},
               {"bandwidth_h2d_bytes_per_s", profile.bandwidth_h2d_bytes_per_s},
               {"bandwidth_d2h_bytes_per_s", profile.bandwidth_d2h_bytes_per_s},
               {"host_update_bytes_per_s", profile.host_update_bytes_per_s},
               {"network_bandwidth_bytes_per_s", profile.network_bandwidth_bytes_per_s},
               {"network_latency_s", profile.network_latency_s},
               {"network_ranks", profile.network_ranks}});
  } else {
    std::cout << absl::StrFormat(
        "%s: %d op entries from %d nodes of %s on %s (%s); link %.3g GB/s host->device, "
        "%.3g GB/s device->host; host updates %.3g GB/s\n",
        f.output, profile.entries.size(), calibrated->second, f.source.Label(),
        profile.backend, profile.device, profile.bandwidth_h2d_bytes_per_s / 1e9,
        profile.bandwidth_d2h_bytes_per_s / 1e9, profile.host_update_bytes_per_s / 1e9);
    if (profile.network_ranks > 0) {
      std::cout << absl::StrFormat("  network: %.3g GB/s, latency %s, measured on %d ranks\n",
                                   profile.network_bandwidth_bytes_per_s / 1e9,
                                   FormatSeconds(profile.network_latency_s),
                                   profile.network_ranks);
    }
  }
  return 0;
}

}  // namespace

void AddCalibrateCommand(CLI::App& app, int& exit_code) {
  static CalibrateFlags flags;
  CLI::App* cmd = app.add_subcommand(
      "calibrate",
      "measure op times and host link bandwidth on a backend; writes a cost profile for "
      "--profile");
  flags.source.AddOptions(cmd);
  cmd->add_option("--backend", flags.backend, "cpu or cuda (default cpu)")->check(BackendName());
  cmd->add_option("--output,-o", flags.output, "profile file (default: stdout)");
  cmd->add_option("--repeat", flags.repeat, "timed runs after one warm-up (default 5)")
      ->check(IntegerIn(1, 1000));
  cmd->add_option("--transfer-size", flags.transfer_size,
                  "bytes per timed host<->device copy (default 64MiB)")
      ->check(PositiveSize());
  cmd->add_option("--seed", flags.seed, "seed of the generated inputs (default 0)")
      ->check(IntegerIn(0, INT64_MAX));
  cmd->add_flag("--force", flags.force, "replace an existing output file");
  cmd->add_flag("--json", flags.json,
                "print the summary as JSON (with --output FILE: without it, stdout holds the "
                "profile)");
  cmd->add_option("--ranks", flags.ranks,
                  "ranks that also measure their network link (all-reduces over gloo), each "
                  "one process; rank 0 writes it into the profile, which plan, compare, "
                  "simulate and run then take as --network (default 1: no link)")
      ->check(IntegerIn(1, 1 << 20));
  flags.process.AddOptions(cmd, "");
  CLI::Option* network_size = cmd->add_option(
      "--network-size", flags.network_size,
      "with --ranks: bytes of the large timed all-reduce (default 8MiB; the small one is 4KiB)");
  network_size->check(PositiveSize());
  cmd->callback([&exit_code, network_size] {
    flags.process.NoteGiven();
    flags.network_size_given = network_size->count() > 0;
    exit_code = RunCalibrate(flags);
  });
}

}  // namespace pebble::cli
