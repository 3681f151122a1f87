// Fuzz target: the cost-profile reader. The input is the text of a cost
// profile (scheduler/cost_profile.h), written to a temporary file and read
// with ReadCostProfileFile; a profile it accepts is applied to a small zoo
// model (ApplyCostProfile on mnist-cnn:batch=1), whose costs must stay
// finite and non-negative, and must survive CostProfileToJson +
// CostProfileFromJson unchanged.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "graph/graph.h"
#include "graph/models/models.h"
#include "scheduler/cost_profile.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pebble;
  static const Graph model = fuzz::MustOk(BuildModel("mnist-cnn:batch=1"), "zoo model");
  const std::string path = fuzz::WriteTempFile("profile.json", data, size);
  absl::StatusOr<CostProfile> profile = ReadCostProfileFile(path);
  if (!profile.ok()) return 0;
  (void)profile->PlannerBandwidth();
  CostProfileMatch match;
  absl::StatusOr<Graph> costed = ApplyCostProfile(model, *profile, &match);
  if (costed.ok()) {
    fuzz::Expect(costed->num_nodes() == model.num_nodes(), "nodes lost");
    for (NodeId v = 0; v < costed->num_nodes(); ++v) {
      fuzz::Expect(std::isfinite(costed->cost(v)) && costed->cost(v) >= 0,
                   "a cost that is negative or not finite");
    }
  }
  const CostProfile again = fuzz::MustOk(CostProfileFromJson(CostProfileToJson(*profile)),
                                         "re-reading the written profile");
  fuzz::Expect(again.entries == profile->entries && again.backend == profile->backend &&
                   again.device == profile->device &&
                   again.bandwidth_h2d_bytes_per_s == profile->bandwidth_h2d_bytes_per_s &&
                   again.bandwidth_d2h_bytes_per_s == profile->bandwidth_d2h_bytes_per_s,
               "the profile does not survive a round trip");
  return 0;
}
