// `pebble calibrate` end to end on the CPU backend (the same code path as
// --backend cuda, which needs a device): the profile it writes, and
// --profile on plan, which replaces costs with the measured times.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/make_backend.h"
#include "tests/cli_test_util.h"

namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

using Result = ::pebble::testing::CliResult;

std::string Slurp(const std::string& p) { return ::pebble::testing::ReadFileText(p); }

std::string TempPath(const std::string& name) {
  return (fs::path(::testing::TempDir()) /
          ("calibrate_" + std::to_string(getpid()) + "_" + name))
      .string();
}

Result Pebble(const std::string& args) { return ::pebble::testing::RunPebble(args); }

bool CpuBackendRuns() {
  auto b = pebble::MakeBackend("cpu");
  return b.ok() && *b != nullptr;
}

TEST(CliCalibrateTest, WritesAProfileThatPlanUses) {
  if (!CpuBackendRuns()) GTEST_SKIP() << "the CPU backend is not available in this build";
  const std::string profile = TempPath("profile.json");
  fs::remove(profile);
  Result r = Pebble("calibrate --backend cpu --model conv3d:n=8 --repeat 2 "
                    "--transfer-size 1MiB --output " + profile + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json summary = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << r.out;
  EXPECT_EQ(summary["backend"], "cpu");
  EXPECT_GT(summary["bandwidth_h2d_bytes_per_s"].get<double>(), 0);
  EXPECT_GT(summary["host_update_bytes_per_s"].get<double>(), 0);

  const nlohmann::json doc = nlohmann::json::parse(Slurp(profile), nullptr, false);
  ASSERT_FALSE(doc.is_discarded());
  EXPECT_EQ(doc["format"], "pebble-cost-profile");
  EXPECT_EQ(doc["version"], 1);
  EXPECT_EQ(doc["backend"], "cpu");
  // conv3d has 3 convs, 3 relus, the loss, their gradients...: every
  // computed node has a key; equal keys share an entry.
  ASSERT_TRUE(doc["entries"].is_object());
  EXPECT_GE(doc["entries"].size(), 10u);
  bool has_conv = false;
  for (const auto& [key, seconds] : doc["entries"].items()) {
    EXPECT_GE(seconds.get<double>(), 0) << key;
    if (key.rfind("conv3d|", 0) == 0) has_conv = true;
  }
  EXPECT_TRUE(has_conv);

  // Refuses to overwrite without --force.
  Result again = Pebble("calibrate --backend cpu --model conv3d:n=8 --repeat 1 "
                        "--transfer-size 1MiB --output " + profile);
  EXPECT_NE(again.exit_code, 0);
  EXPECT_THAT(again.err, HasSubstr("--force"));

  // plan --profile: every computed node of the same model matches.
  Result plan = Pebble("plan --model conv3d:n=8 --policy baseline --budget 100% --json "
                       "--profile " + profile);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_THAT(plan.err, HasSubstr("computed nodes take measured times"));
  const nlohmann::json p = nlohmann::json::parse(plan.out, nullptr, false);
  ASSERT_FALSE(p.is_discarded());
  // The plan's compute cost is now the sum of measured seconds, not the
  // FLOP-based estimate.
  Result flops = Pebble("plan --model conv3d:n=8 --policy baseline --budget 100% --json");
  const nlohmann::json q = nlohmann::json::parse(flops.out, nullptr, false);
  ASSERT_FALSE(q.is_discarded());
  EXPECT_NE(p["report"]["compute_cost"], q["report"]["compute_cost"]);
  // The convolutions' kernel scratch is in the profile and in the plan: the
  // same peak as planning for the backend itself, above the bare graph's.
  ASSERT_TRUE(doc.contains("workspace_bytes")) << doc.dump();
  EXPECT_GE(doc["workspace_bytes"].size(), 1u);
  for (const auto& [key, bytes] : doc["workspace_bytes"].items()) {
    EXPECT_GT(bytes.get<int64_t>(), 0) << key;
    EXPECT_TRUE(doc["entries"].contains(key)) << key;
  }
  EXPECT_THAT(plan.err, HasSubstr("a measured kernel workspace"));
  Result queried = Pebble("plan --model conv3d:n=8 --policy baseline --budget 100% --json "
                          "--backend cpu");
  ASSERT_EQ(queried.exit_code, 0) << queried.err;
  const nlohmann::json w = nlohmann::json::parse(queried.out, nullptr, false);
  ASSERT_FALSE(w.is_discarded());
  EXPECT_EQ(p["report"]["peak_bytes"], w["report"]["peak_bytes"]);
  EXPECT_GT(p["report"]["peak_bytes"].get<int64_t>(), q["report"]["peak_bytes"].get<int64_t>());
  // The same profile said to be the CUDA backend's: refused where the plan
  // is for the CPU backend (its times and workspaces would be another's),
  // taken where no backend is named.
  nlohmann::json other = doc;
  other["backend"] = "cuda";
  const std::string cuda_profile = TempPath("profile-cuda.json");
  std::ofstream(cuda_profile) << other.dump();
  for (const char* command : {"plan --model conv3d:n=8 --backend cpu --profile ",
                              "run --model conv3d:n=8 --profile "}) {
    Result refused = Pebble(command + cuda_profile);
    EXPECT_EQ(refused.exit_code, 2) << command;
    EXPECT_THAT(refused.err, HasSubstr("was measured on the cuda backend, and this plan is for "
                                       "cpu")) << command;
  }
  EXPECT_EQ(Pebble("plan --model conv3d:n=8 --profile " + cuda_profile).exit_code, 0);
  fs::remove(cuda_profile);
  fs::remove(profile);
}

TEST(CliCalibrateTest, BadInputsAreErrors) {
  Result r = Pebble("calibrate --backend nosuch --model conv3d:n=8");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("nosuch"));
  Result p = Pebble("plan --model conv3d:n=8 --policy baseline --budget 100% "
                    "--profile /nonexistent/profile.json");
  EXPECT_NE(p.exit_code, 0);
  EXPECT_THAT(p.err, HasSubstr("profile"));
  // The rank flags, as `run` refuses them, before anything is measured.
  using ::pebble::testing::ExpectOneLineError;
  ExpectOneLineError(Pebble("calibrate --model conv3d:n=8 --address 10.0.0.2 --rank-timeout 5"),
                     2, {"--address, --rank-timeout: with --ranks 2 or more only"});
  ExpectOneLineError(Pebble("calibrate --model conv3d:n=8 --ranks 2 --rank 0"), 2,
                     {"--ranks 2: give --rank and --rendezvous DIR"});
  ExpectOneLineError(Pebble("calibrate --model conv3d:n=8 --ranks 2 --rank 2 --rendezvous /tmp"),
                     2, {"--rank 2: ranks are 0 to 1"});
}

TEST(CliCalibrateTest, CudaWithoutDeviceSaysSo) {
  auto b = pebble::MakeBackend("cuda");
  if (b.ok()) GTEST_SKIP() << "a CUDA device is present";
  Result r = Pebble("calibrate --backend cuda --model conv3d:n=8");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, ::testing::AnyOf(HasSubstr("no CUDA device"), HasSubstr("without CUDA")));
}

#ifdef PEBBLE_FAKE_CUDA_PLUGIN
// The binary loads its CUDA backend from libpebble_cuda.so only for
// --backend cuda (runtime/factory/cuda_plugin.h); each way that can fail
// names the file, and the other commands never need it.
TEST(CliCalibrateTest, CudaPluginRefusalsNameTheFile) {
  struct Plugin {
    explicit Plugin(const std::string& path) { setenv("PEBBLE_CUDA_PLUGIN", path.c_str(), 1); }
    ~Plugin() { unsetenv("PEBBLE_CUDA_PLUGIN"); }
  };
  const std::string run = "run --model mnist-cnn:batch=2 --policy dtr --budget min --backend cuda";
  {
    Plugin missing("/nonexistent/libpebble_cuda.so");
    ::pebble::testing::ExpectOneLineError(
        Pebble(run), 1, {"PEBBLE_CUDA_PLUGIN", "/nonexistent/libpebble_cuda.so", "--backend cpu"});
    Result plan = Pebble("plan --model mnist-cnn:batch=2 --policy dtr --budget min");
    EXPECT_EQ(plan.exit_code, 0) << plan.err;
    Result cpu = Pebble("run --model mnist-cnn:batch=2 --policy dtr --budget min --backend cpu");
    EXPECT_EQ(cpu.exit_code, 0) << cpu.err;
  }
  {
    const std::string text = TempPath("not_a_library.so");
    ::pebble::testing::WriteText(text, "not an ELF file\n");
    Plugin not_elf(text);
    ::pebble::testing::ExpectOneLineError(
        Pebble(run), 1, {"cannot load pebble's CUDA backend", text, "--backend cpu"});
    fs::remove(text);
  }
  {
    // A bare name is the file in the working directory, which is loaded
    // (dlopen alone would look the name up on the library path instead).
    const fs::path text = TempPath("bare_name.so");
    ::pebble::testing::WriteText(text, "not an ELF file\n");
    const fs::path here = fs::current_path();
    fs::current_path(text.parent_path());
    Plugin bare(text.filename().string());
    Result r = Pebble(run);
    fs::current_path(here);
    ::pebble::testing::ExpectOneLineError(r, 1, {"cannot load pebble's CUDA backend",
                                                 fs::absolute(text).string()});
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("No such file"))) << r.err;
    fs::remove(text);
  }
  // A bundle for a GPU machine (scripts/gpu-bundle) carries this test but
  // not the fake plugin of its build tree.
  if (!fs::exists(PEBBLE_FAKE_CUDA_PLUGIN)) {
    std::cout << "no " << PEBBLE_FAKE_CUDA_PLUGIN << " here: another build's plugin unchecked\n";
    return;
  }
  {
    Plugin other(PEBBLE_FAKE_CUDA_PLUGIN);
    ::pebble::testing::ExpectOneLineError(
        Pebble(run), 1, {PEBBLE_FAKE_CUDA_PLUGIN, "another build of pebble", "0.0.0-another-build"});
  }
}
#endif

}  // namespace
