// A standalone main for the fuzz targets in the normal build (no libFuzzer):
// calls LLVMFuzzerTestOneInput once on every file given, and on every file
// of every directory given (sorted, not recursive). Exits 1 when a path
// cannot be read or names nothing; a crashing input aborts the program, as
// it would the fuzzer.
//
//   fuzz_graph tests/fuzz/corpus/graph
//   fuzz_npy crash-1234abcd
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

namespace {

bool RunFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
    return false;
  }
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  std::fprintf(stderr, "replay: %s (%zu bytes)\n", path.c_str(), bytes.size());
  // A copy in its own allocation, so that a read past its end is caught by
  // a sanitizer as it would be under libFuzzer.
  std::vector<uint8_t> copy(bytes.begin(), bytes.end());
  const uint8_t* data = copy.empty() ? nullptr : copy.data();
  LLVMFuzzerTestOneInput(data, copy.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
    return 2;
  }
  namespace fs = std::filesystem;
  int runs = 0;
  bool ok = true;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg = argv[i];
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      std::vector<fs::path> files;
      for (const fs::directory_entry& e : fs::directory_iterator(arg, ec)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
      if (files.empty()) {
        std::fprintf(stderr, "replay: %s holds no files\n", argv[i]);
        ok = false;
      }
      for (const fs::path& f : files) {
        ok = RunFile(f) && ok;
        ++runs;
      }
    } else if (fs::is_regular_file(arg, ec)) {
      ok = RunFile(arg) && ok;
      ++runs;
    } else {
      std::fprintf(stderr, "replay: no such file or directory: %s\n", argv[i]);
      ok = false;
    }
  }
  std::fprintf(stderr, "replay: %d inputs%s\n", runs, ok ? "" : ", with errors");
  return ok ? 0 : 1;
}
