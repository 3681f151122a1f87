// Measured cost profiles (docs/cuda.md, "Calibration"): per-operator times
// measured on a backend by `pebble calibrate`, and the host link bandwidth,
// so that plans rest on measured times instead of FLOP counts alone.
//
// A profile is data (JSON, "format": "pebble-cost-profile", "version": 1):
//
//   {"format": "pebble-cost-profile", "version": 1,
//    "backend": "cuda", "device": "NVIDIA H100 ...",
//    "bandwidth_h2d_bytes_per_s": 2.5e10, "bandwidth_d2h_bytes_per_s": 2.6e10,
//    "entries": {"conv3d|fp32(1,1,64,64,64);fp32(4,1,3,3,3);fp32(4)|fp32|{\"padding\":1,\"stride\":1}": 1.2e-4, ...},
//    "workspace_bytes": {"conv3d|...": 1048576, ...}}
//
// An entry's key is CostKey(): the op, every operand's dtype and shape in
// order, the output's dtype, and the attrs as canonical JSON (sorted keys;
// an optimizer update's attrs say only which terms it computes: Note
// [Update keys] in cost_profile.cc).
// Node ids are not part of it, so the same layer shape in two places of a
// network, or in another model, shares one entry. Values are seconds for
// one computation of the node. "workspace_bytes" (optional) holds, for the
// keys whose kernel takes scratch on that backend, its bytes
// (Backend::QueryWorkspace): the node's workspace in a profiled graph.
//
// Pure data: nothing here touches a device (scheduler/ never includes
// runtime/).
#ifndef PEBBLE_SCHEDULER_COST_PROFILE_H_
#define PEBBLE_SCHEDULER_COST_PROFILE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"

namespace pebble {

struct CostProfile {
  std::string backend;  // "cpu", "cuda"
  std::string device;   // Backend::Description()
  double bandwidth_h2d_bytes_per_s = 0;  // 0: not measured
  double bandwidth_d2h_bytes_per_s = 0;
  // The host's rate for an optimizer's update on host copies (bytes read
  // plus written per second; graph/optimizer.h HostUpdateSeconds); 0: not
  // measured. Optional in the file ("host_update_bytes_per_s").
  double host_update_bytes_per_s = 0;
  // The ranks' network link as `pebble calibrate --ranks N` measured it
  // (the ring model's bandwidth and per-message latency, AllReduceSeconds
  // in simulator.h), on `network_ranks` ranks; 0: not measured. Optional in
  // the file ("network_bandwidth_bytes_per_s", "network_latency_s",
  // "network_ranks", all three or none).
  double network_bandwidth_bytes_per_s = 0;
  double network_latency_s = 0;
  int network_ranks = 0;
  std::map<std::string, double> entries;  // CostKey -> seconds (sorted)
  std::map<std::string, int64_t> workspace_bytes;  // CostKey -> bytes, > 0

  // The bandwidth a planner should assume for both directions: the slower
  // of the two measured ones (SPEC section 4 has one link bandwidth); nullopt
  // when neither was measured.
  std::optional<double> PlannerBandwidth() const;
};

// The profile key of node v; nullopt for nodes without a shape or dtype on
// the node or one of its inputs (they cannot be executed, so never measured).
std::optional<std::string> CostKey(const Graph& graph, NodeId v);

nlohmann::json CostProfileToJson(const CostProfile& profile);
// Errors (InvalidArgument) name what is wrong: the format or version, a
// missing or non-numeric field, a negative or non-finite time. Update keys
// with every hyper-parameter (older profiles) are read in CostKey's form.
absl::StatusOr<CostProfile> CostProfileFromJson(const nlohmann::json& doc);
absl::StatusOr<CostProfile> ReadCostProfileFile(const std::string& path);

struct CostProfileMatch {
  int matched = 0;    // computed nodes whose cost now is the profile's
  int unmatched = 0;  // computed nodes that keep their own cost
  int workspaces = 0;  // computed nodes whose workspace the profile raised
};

// A copy of `graph` in which every non-persistent node whose CostKey is in
// the profile costs the profiled seconds; the others keep their cost (the
// model zoo's FLOPs / throughput, also seconds). A node whose key has
// workspace_bytes gets the larger of its own workspace and that. Where the
// profile has a host update rate, every node with a host_cost (an update
// that may run on the host) costs HostUpdateSeconds at that rate there.
// `match` (optional) counts.
absl::StatusOr<Graph> ApplyCostProfile(const Graph& graph,
                                       const CostProfile& profile,
                                       CostProfileMatch* match = nullptr);

}  // namespace pebble

#endif  // PEBBLE_SCHEDULER_COST_PROFILE_H_
