// Helpers shared by the fuzz targets (docs/reliability.md).
#ifndef PEBBLE_TESTS_FUZZ_FUZZ_UTIL_H_
#define PEBBLE_TESTS_FUZZ_FUZZ_UTIL_H_

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/graph_json.h"

namespace pebble::fuzz {

// A property every input must keep was broken: report it and abort, which
// libFuzzer (and the replay main) treat as a crash.
[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz: property broken: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

inline void Expect(bool ok, const std::string& what) {
  if (!ok) Fail(what);
}

template <typename T>
T MustOk(absl::StatusOr<T> value, const std::string& what) {
  if (!value.ok()) Fail(what + ": " + std::string(value.status().message()));
  return *std::move(value);
}

// A directory of this process (made on first use, removed at exit), for
// the targets whose reader takes a path.
inline const std::string& ProcessTempDir() {
  static const std::string* dir = [] {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "pebble-fuzz-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) Fail("cannot make a temporary directory");
    auto* d = new std::string(pattern);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(*dir, ec);
    });
    return d;
  }();
  return *dir;
}

// Writes the input to `name` in the process's temporary directory; returns
// the path.
inline std::string WriteTempFile(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = ProcessTempDir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) Fail("cannot write " + path);
  return path;
}

// A graph from JSON text that must parse (the targets' fixed graphs).
inline Graph MustParseGraph(const std::string& text) {
  return MustOk(ParseGraphJson(text), "fixed graph");
}

}  // namespace pebble::fuzz

#endif  // PEBBLE_TESTS_FUZZ_FUZZ_UTIL_H_
