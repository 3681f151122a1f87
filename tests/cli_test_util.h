// Running the real pebble binary from a test: the command-line tests share
// this one runner.
#ifndef PEBBLE_TESTS_CLI_TEST_UTIL_H_
#define PEBBLE_TESTS_CLI_TEST_UTIL_H_

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pebble::testing {

struct CliResult {
  int exit_code = -1;  // 128 + signal when the process was killed
  std::string out;
  std::string err;
};

// Writes `text` to `path`, bytes as they are.
inline void WriteText(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// The header of a version 1.0 .npy file holding the header dict `dict`
// (magic, length, the dict padded with spaces and a newline as NumPy pads
// it); the data follows it.
inline std::string NpyVersion1Header(std::string dict) {
  dict.append((64 - (10 + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';
  std::string header = "\x93NUMPY\x01";
  header += '\0';
  header += static_cast<char>(dict.size() & 0xff);
  header += static_cast<char>(dict.size() >> 8);
  return header + dict;
}

// The whole file, or "" when it cannot be read.
inline std::string ReadFileText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The directory whose bin/pebble the CLI tests run: $PEBBLE_BINARY_DIR when
// set (binaries moved to another machine, scripts/gpu-bundle), else the
// build tree the tests were built in.
inline std::string PebbleBinaryDir() {
  const char* dir = std::getenv("PEBBLE_BINARY_DIR");
  return dir != nullptr && *dir != '\0' ? dir : PEBBLE_BINARY_DIR;
}

// The scratch directories this process made, removed as it exits where
// every test it ran passed (a failed test's are kept to look into).
class ScratchDirs {
 public:
  static ScratchDirs& Get() {
    static ScratchDirs dirs;  // (made after gtest's UnitTest, so gone before it)
    return dirs;
  }
  void Add(std::filesystem::path dir) { dirs_.push_back(std::move(dir)); }
  ~ScratchDirs() {
    if (!::testing::UnitTest::GetInstance()->Passed()) return;
    std::error_code ignored;
    for (const std::filesystem::path& dir : dirs_) std::filesystem::remove_all(dir, ignored);
  }

 private:
  ScratchDirs() { ::testing::UnitTest::GetInstance(); }
  std::vector<std::filesystem::path> dirs_;
};

// A fresh, empty directory "<temp>/<prefix>_<pid>_<name>" for one test: the
// processes ctest runs in parallel never share one. Removed at exit where
// the tests passed (ScratchDirs).
inline std::filesystem::path ScratchDir(const std::string& prefix, const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    (prefix + "_" + std::to_string(getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ScratchDirs::Get().Add(dir);
  return dir;
}

// Runs `<build>/bin/pebble <args>` through the shell, capturing both
// streams. ctest runs the tests of one file in parallel processes, so the
// capture files are named by process id and call.
inline CliResult RunPebble(const std::string& args) {
  static int calls = 0;
  const std::filesystem::path dir = ::testing::TempDir();
  const std::string stem =
      "pebble_cli_" + std::to_string(getpid()) + "_" + std::to_string(++calls);
  const std::string out_path = (dir / (stem + ".out")).string();
  const std::string err_path = (dir / (stem + ".err")).string();
  const std::string cmd = PebbleBinaryDir() + "/bin/pebble " + args + " >" +
                          out_path + " 2>" + err_path;
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFileText(out_path);
  r.err = ReadFileText(err_path);
  std::filesystem::remove(out_path);
  std::filesystem::remove(err_path);
  return r;
}

// Exit `code` with exactly one line on stderr, starting "pebble: " and
// containing every one of `words`.
inline void ExpectOneLineError(const CliResult& r, int code,
                               std::initializer_list<std::string> words) {
  EXPECT_EQ(r.exit_code, code) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.rfind("pebble: ", 0), 0u) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "not one line:\n" << r.err;
  for (const std::string& w : words) EXPECT_THAT(r.err, ::testing::HasSubstr(w));
}

}  // namespace pebble::testing

#endif  // PEBBLE_TESTS_CLI_TEST_UTIL_H_
