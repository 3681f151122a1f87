#include "runtime/collectives.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pebble {

absl::Status CheckSameOnEveryRank(Collectives& collectives, uint64_t fingerprint,
                                  absl::string_view what, absl::string_view advice) {
  // An all-gather made of a sum: each rank writes its slot, zeros elsewhere.
  // The fingerprint goes in two 32-bit halves, so that no sum overflows.
  const int ranks = collectives.ranks();
  std::vector<int64_t> slots(2 * static_cast<size_t>(ranks), 0);
  slots[2 * collectives.rank()] = static_cast<int64_t>(fingerprint >> 32);
  slots[2 * collectives.rank() + 1] = static_cast<int64_t>(fingerprint & 0xffffffffu);
  if (absl::Status s = collectives.AllReduceSum(slots.data(), static_cast<int64_t>(slots.size()),
                                                absl::StrCat("the comparison of ", what));
      !s.ok()) {
    return s;
  }
  std::vector<int> differ;
  for (int r = 1; r < ranks; ++r) {
    if (slots[2 * r] != slots[0] || slots[2 * r + 1] != slots[1]) differ.push_back(r);
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, " differs between the ranks (rank", differ.size() > 1 ? "s " : " ",
      absl::StrJoin(differ, ", "), " from rank 0): ", advice));
}

}  // namespace pebble
