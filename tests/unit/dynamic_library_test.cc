// Loading a library at run time: the first of the candidates that loads and has every symbol
// asked for, or an error naming each candidate tried, why it failed, and the fix.
#include "util/dynamic_library.h"

#include <gtest/gtest.h>

#include "absl/status/statusor.h"

namespace longhaul {
namespace {

TEST(DynamicLibrary, TheFirstCandidateWithEverySymbolIsLoaded) {
  const absl::StatusOr<LoadedLibrary> lib =
      LoadFirst("zlib", {"/nonexistent/libz.so.1", "libz.so.1"}, {"crc32", "adler32"}, "install zlib1g");
  ASSERT_TRUE(lib.ok()) << lib.status();
  EXPECT_EQ(lib->path, "libz.so.1");
  ASSERT_EQ(lib->symbols.size(), 2u);
  auto crc32 = reinterpret_cast<unsigned long (*)(unsigned long, const unsigned char*, unsigned)>(lib->symbols[0]);
  const unsigned char abc[] = {'a', 'b', 'c'};
  EXPECT_EQ(crc32(0, abc, 3), 0x352441c2u) << "the symbol is zlib's crc32";
}

TEST(DynamicLibrary, NoCandidateIsAnErrorNamingEachAndTheFix) {
  const absl::StatusOr<LoadedLibrary> lib =
      LoadFirst("a codec", {"/nonexistent/libcodec.so.1", "libz.so.1"}, {"crc32", "codec_open", "codec_close"},
                "install libcodec1");
  ASSERT_EQ(lib.status().code(), absl::StatusCode::kFailedPrecondition) << lib.status();
  const std::string m(lib.status().message());
  EXPECT_NE(m.find("cannot load a codec: tried /nonexistent/libcodec.so.1 ("), std::string::npos) << m;
  EXPECT_NE(m.find("libz.so.1 (loads, but has no codec_open/codec_close)"), std::string::npos) << m;
  EXPECT_NE(m.find("; install libcodec1"), std::string::npos) << m;
}

}  // namespace
}  // namespace longhaul
