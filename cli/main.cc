// pebble: plan how a training step uses memory, and prove it.
#include <iostream>

#include "CLI/CLI.hpp"
#include "cli/common.h"

namespace {

constexpr const char* kDescription = R"(pebble: decides how a training step uses memory, and proves it.

It takes a computation graph, picks an execution order and a forget /
recompute / swap-to-host policy that fits a memory budget at the least extra
time, and checks the plan in an exact simulator.

Examples (each runs as it is, in order; the line marked exit 1 fails on purpose):
  pebble models                                   # built-in models
  pebble policies                                 # planners
  pebble describe --model conv3d:n=128            # per-node memory table
  pebble plan --model conv3d:n=128 --policy rotor --budget 90%
  pebble plan --model resnet18:batch=8 --policy rotor --budget 40%   # exit 1: reaches 61% at least
  pebble export --model mnist-cnn --format json --output mnist.json
  pebble plan --graph mnist.json --budget min --schedule-out mnist-plan.json
  pebble simulate --graph mnist.json --schedule mnist-plan.json
  pebble compare --model resnet18:batch=8 --budgets 100%,80%,min
  pebble run --model conv3d:n=64 --policy rotor --budget 90%
  pebble fit --model conv3d --vary n --budget 256MiB

Sizes: whole bytes or with units (512MiB, 8GiB, 2GB, 1.5e9; a fraction of a
unit rounds down to whole bytes). Budgets also take a percentage of the
baseline peak (60%) or 'min'; a bare number under 1024 is refused as
ambiguous. A plan that does not fit its budget fails plan and run (exit 1),
naming the least peak the policy reaches. Every command takes --json and
then prints one JSON document on stdout. Outputs never replace a file
without --force, nor a file the command reads. Errors go to stderr with a non-zero exit code (1: bad
input or failure, 2: bad command line, e.g. a malformed value).)";

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{kDescription, "pebble"};
  app.formatter(pebble::cli::HelpFormatter());
  app.require_subcommand(1);
  app.failure_message(pebble::cli::OneLineFailure);
  app.set_version_flag("--version", "pebble 0.1.0");
  int exit_code = 0;
  pebble::cli::AddInfoCommands(app, exit_code);
  pebble::cli::AddPlanCommands(app, exit_code);
  pebble::cli::AddRunCommands(app, exit_code);
  pebble::cli::AddCalibrateCommand(app, exit_code);
  pebble::cli::AddImportCommand(app, exit_code);
  pebble::cli::RefuseEmptyValues(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return pebble::cli::FinishStdout(app.exit(e));
  } catch (const CLI::CallForAllHelp& e) {
    return pebble::cli::FinishStdout(app.exit(e));
  } catch (const CLI::CallForVersion& e) {
    return pebble::cli::FinishStdout(app.exit(e));
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  return pebble::cli::FinishStdout(exit_code);
}
