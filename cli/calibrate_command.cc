// Placeholder: `pebble calibrate` lands here.
#include "cli/common.h"

namespace pebble::cli {

void AddCalibrateCommand(CLI::App& app, int& exit_code) {
  (void)app;
  (void)exit_code;
}

}  // namespace pebble::cli
