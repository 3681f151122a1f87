// Placeholder: `pebble run` and `pebble fit` land here.
#include "cli/common.h"

namespace pebble::cli {

void AddRunCommands(CLI::App& app, int& exit_code) {
  (void)app;
  (void)exit_code;
}

}  // namespace pebble::cli
