// Fuzz target: the .npy reader. The input is the content of an .npy file,
// written to a temporary file and read with ReadNpy (which takes a path). An
// array it accepts must hold NumElements(shape) * DTypeSize(dtype) bytes and
// survive WriteNpy + ReadNpy unchanged.
#include <cstddef>
#include <cstdint>
#include <string>

#include "graph/graph.h"
#include "runtime/npy.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pebble;
  const std::string path = fuzz::WriteTempFile("input.npy", data, size);
  absl::StatusOr<NpyArray> array = ReadNpy(path);
  if (!array.ok()) return 0;
  fuzz::Expect(static_cast<int64_t>(array->data.size()) ==
                   NumElements(array->shape) * DTypeSize(array->dtype),
               "payload size is not shape x dtype");
  const std::string copy = fuzz::ProcessTempDir() + "/copy.npy";
  const absl::Status written = WriteNpy(copy, *array);
  fuzz::Expect(written.ok(), "cannot write back: " + std::string(written.message()));
  const NpyArray again = fuzz::MustOk(ReadNpy(copy), "reading back the written array");
  fuzz::Expect(again.shape == array->shape && again.dtype == array->dtype &&
                   again.data == array->data,
               "the array does not survive a round trip");
  return 0;
}
