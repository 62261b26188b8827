// The job secret: what a secret file must be, and the proofs made with it.
#include "transport/job_secret.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace longhaul {
namespace {

std::string TempPath(const std::string& name) {
  const std::string p = absl::StrCat(::testing::TempDir(), "/job_secret_test_", getpid(), "_", name);
  std::remove(p.c_str());
  return p;
}

std::string WriteFile(const std::string& name, const std::string& text, mode_t mode) {
  const std::string p = TempPath(name);
  std::ofstream(p) << text;
  chmod(p.c_str(), mode);
  return p;
}

TEST(JobSecret, ProofIsHmacSha256OverLengthPrefixedParts) {
  // Known answers from Python's hmac over the same bytes: each of label and parts preceded by its
  // length as u64 little-endian.
  const std::string path = WriteFile("known", "0123456789abcdef0123\n", 0600);
  auto secret = JobSecret::Load(path);
  ASSERT_TRUE(secret.ok()) << secret.status();
  EXPECT_EQ(absl::BytesToHexString(secret->Proof("label", {"ab", "c"})),
            "37e27aaecbc7dfa04dfb3f5ffb773cd7e6dd062ebd2b0730ec751645b3da5395");
  EXPECT_EQ(absl::BytesToHexString(JobSecret().Proof("label", {"ab", "c"})),
            "74d4f79e42d2571f371f3af01ddcf189a907a4b7f7f38c6093502a0658279dc4");
  // Moving a boundary between parts, or between the label and the parts, changes the proof.
  EXPECT_NE(secret->Proof("label", {"ab", "c"}), secret->Proof("label", {"a", "bc"}));
  EXPECT_NE(secret->Proof("label", {"ab", "c"}), secret->Proof("labela", {"b", "c"}));
  EXPECT_TRUE(ProofsEqual(secret->Proof("x", {}), secret->Proof("x", {})));
  EXPECT_FALSE(ProofsEqual(secret->Proof("x", {}), JobSecret().Proof("x", {})));
  EXPECT_FALSE(ProofsEqual("abc", "ab"));
}

TEST(JobSecret, BadSecretFilesAreRefusedNamingTheFix) {
  auto missing = JobSecret::Load(TempPath("missing"));
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("longhaul secret"), std::string::npos) << missing.status();
  auto shared = JobSecret::Load(WriteFile("shared", "0123456789abcdef0123", 0644));
  EXPECT_TRUE(absl::IsPermissionDenied(shared.status())) << shared.status();
  EXPECT_NE(shared.status().message().find("chmod 600"), std::string::npos) << shared.status();
  auto short_one = JobSecret::Load(WriteFile("short", "abc\n", 0600));
  EXPECT_TRUE(absl::IsInvalidArgument(short_one.status())) << short_one.status();
  EXPECT_NE(short_one.status().message().find("holds 3 bytes"), std::string::npos) << short_one.status();
}

TEST(JobSecret, WriteNewMakesAPrivateRandomSecretAndNeverOverwrites) {
  const std::string a = TempPath("a"), b = TempPath("b");
  ASSERT_TRUE(JobSecret::WriteNew(a).ok());
  ASSERT_TRUE(JobSecret::WriteNew(b).ok());
  struct stat st;
  ASSERT_EQ(stat(a.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto sa = JobSecret::Load(a), sb = JobSecret::Load(b);
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_TRUE(sa->set());
  EXPECT_EQ(sa->source(), a);
  EXPECT_NE(sa->Proof("x", {}), sb->Proof("x", {})) << "two secrets alike";
  const absl::Status again = JobSecret::WriteNew(a);
  EXPECT_TRUE(absl::IsFailedPrecondition(again)) << again;
  auto still = JobSecret::Load(a);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->Proof("x", {}), sa->Proof("x", {}));
}

TEST(JobSecret, TheFlagThenTheEnvironmentThenNone) {
  const std::string a = TempPath("flag"), b = TempPath("env");
  ASSERT_TRUE(JobSecret::WriteNew(a).ok());
  ASSERT_TRUE(JobSecret::WriteNew(b).ok());
  unsetenv("LONGHAUL_SECRET_FILE");
  auto none = JobSecret::FromFlagOrEnv("");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->set());
  setenv("LONGHAUL_SECRET_FILE", b.c_str(), 1);
  auto env = JobSecret::FromFlagOrEnv("");
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->source(), b);
  auto flag = JobSecret::FromFlagOrEnv(a);
  ASSERT_TRUE(flag.ok());
  EXPECT_EQ(flag->source(), a);
  unsetenv("LONGHAUL_SECRET_FILE");
}

TEST(JobSecret, NoncesAreFreshAndFull) {
  auto a = RandomNonce(), b = RandomNonce();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), kNonceBytes);
  EXPECT_NE(*a, *b);
}

}  // namespace
}  // namespace longhaul
