// Collectives (runtime/collectives.h) with gloo over TCP: the ranks meet
// through a directory that every rank sees (gloo's FileStore: on one machine,
// or on a file system the machines share), then connect to each other's
// address directly.
#ifndef PEBBLE_RUNTIME_GLOO_GLOO_COLLECTIVES_H_
#define PEBBLE_RUNTIME_GLOO_GLOO_COLLECTIVES_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/collectives.h"

namespace pebble {

struct GlooOptions {
  int rank = 0;
  int ranks = 1;
  // A new, empty directory for each run, the same for every rank; a rank
  // whose marker file is already there refuses (a directory of an earlier
  // run would hand out dead addresses).
  std::string rendezvous_dir;
  // The address the other ranks reach this one at.
  std::string address = "127.0.0.1";
  // Seconds a rank waits for the others, to meet and in each collective.
  double timeout_s = 300;
};

// Whether this build has gloo (Debian's libgloo-dev); without it,
// ConnectGloo fails saying so.
bool HaveGloo();

// Meets the other ranks and connects to them; returns once all have.
absl::StatusOr<std::unique_ptr<Collectives>> ConnectGloo(const GlooOptions& options);

}  // namespace pebble

#endif  // PEBBLE_RUNTIME_GLOO_GLOO_COLLECTIVES_H_
