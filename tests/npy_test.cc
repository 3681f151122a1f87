#include "runtime/npy.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pebble {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

NpyArray Iota(Shape shape) {
  NpyArray a;
  a.shape = std::move(shape);
  a.dtype = DType::kFloat32;
  const int64_t n = NumElements(a.shape);
  a.data.resize(n * 4);
  for (int64_t i = 0; i < n; ++i) {
    const float v = 0.5f * static_cast<float>(i) - 3.0f;
    std::memcpy(a.data.data() + 4 * i, &v, 4);
  }
  return a;
}

TEST(NpyTest, RoundTripKeepsShapeDtypeAndBytes) {
  for (const Shape& shape : {Shape{}, Shape{7}, Shape{2, 3, 4}, Shape{1, 1, 3, 3, 3}, Shape{0, 5}}) {
    NpyArray a = Iota(shape);
    const std::string path = TempPath("roundtrip.npy");
    ASSERT_TRUE(WriteNpy(path, a).ok());
    auto b = ReadNpy(path);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->shape, a.shape);
    EXPECT_EQ(b->dtype, DType::kFloat32);
    EXPECT_EQ(b->data, a.data);
  }
}

TEST(NpyTest, HeaderIsAlignedTo64Bytes) {
  const std::string path = TempPath("aligned.npy");
  ASSERT_TRUE(WriteNpy(path, Iota({3, 5})).ok());
  EXPECT_EQ((std::filesystem::file_size(path) - 3 * 5 * 4) % 64, 0u);
}

TEST(NpyTest, RejectsBadFiles) {
  const std::string path = TempPath("bad.npy");
  {
    std::ofstream out(path);
    out << "not numpy at all";
  }
  EXPECT_THAT(std::string(ReadNpy(path).status().message()), ::testing::HasSubstr("bad magic"));
  EXPECT_EQ(ReadNpy(TempPath("missing.npy")).status().code(), absl::StatusCode::kNotFound);
  // Truncated payload.
  ASSERT_TRUE(WriteNpy(path, Iota({10})).ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  EXPECT_THAT(std::string(ReadNpy(path).status().message()), ::testing::HasSubstr("truncated"));
  NpyArray bf16;
  bf16.dtype = DType::kBFloat16;
  bf16.shape = {1};
  bf16.data.resize(2);
  EXPECT_FALSE(WriteNpy(path, bf16).ok());
}

// An .npy file whose header is `header_text` (padded) followed by
// `payload` bytes of zeros.
std::string NpyWithHeader(const std::string& name, std::string header_text, size_t payload) {
  header_text.append((64 - (10 + header_text.size() + 1) % 64) % 64, ' ');
  header_text += '\n';
  const std::string path = TempPath(name);
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const char len[2] = {static_cast<char>(header_text.size() & 0xff),
                       static_cast<char>(header_text.size() >> 8)};
  out.write(len, 2);
  out << header_text << std::string(payload, '\0');
  return path;
}

TEST(NpyTest, HeadersCannotClaimMoreThanTheFileHolds) {
  auto message = [](const std::string& path) {
    return std::string(ReadNpy(path).status().message());
  };
  // 2^40 elements: refused by the file's size, not by a failed allocation.
  EXPECT_THAT(message(NpyWithHeader(
                  "huge.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }",
                  16)),
              ::testing::HasSubstr("truncated data"));
  // (2^61, 3) x 4 bytes overflows 64 bits.
  EXPECT_THAT(
      message(NpyWithHeader(
          "overflow.npy",
          "{'descr': '<f4', 'fortran_order': False, 'shape': (2305843009213693952, 3), }", 16)),
      ::testing::HasSubstr("more than 2^63 bytes"));
  EXPECT_THAT(message(NpyWithHeader(
                  "extra.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 12)),
              ::testing::HasSubstr("extra bytes"));
  const std::string exact =
      NpyWithHeader("exact.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
  ASSERT_TRUE(ReadNpy(exact).ok()) << ReadNpy(exact).status();
  // A header length past the end of the file.
  const std::string cut = TempPath("cut.npy");
  {
    std::ofstream out(cut, std::ios::binary);
    out.write("\x93NUMPY\x01\x00\xff\xff", 10);
  }
  EXPECT_THAT(message(cut), ::testing::HasSubstr("truncated header"));
}

TEST(NpyTest, DirectoriesAndDevicesAreNotRead) {
  EXPECT_THAT(std::string(ReadNpy(::testing::TempDir()).status().message()),
              ::testing::HasSubstr("not a regular file"));
  EXPECT_THAT(std::string(ReadNpy("/dev/zero").status().message()),
              ::testing::HasSubstr("not a regular file"));
}

// Cross-check with NumPy itself when the system Python has it.
TEST(NpyTest, InteroperatesWithNumpy) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 with numpy is not installed";
  }
  const std::string ours = TempPath("ours.npy");
  const std::string theirs = TempPath("theirs.npy");
  ASSERT_TRUE(WriteNpy(ours, Iota({2, 3})).ok());
  const std::string script =
      "/usr/bin/python3 -c \"import numpy as np; a = np.load('" + ours +
      "'); assert a.dtype == np.float32 and a.shape == (2, 3) and a[1, 2] == -0.5, a; "
      "np.save('" + theirs + "', np.arange(12, dtype=np.int64).reshape(3, 4) * 7)\"";
  ASSERT_EQ(std::system(script.c_str()), 0);
  auto b = ReadNpy(theirs);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->dtype, DType::kInt64);
  EXPECT_EQ(b->shape, (Shape{3, 4}));
  int64_t last = 0;
  std::memcpy(&last, b->data.data() + 11 * 8, 8);
  EXPECT_EQ(last, 77);
}

}  // namespace
}  // namespace pebble
