// A worker's key: its signature verifies under its own public key only, over exactly the label and
// parts it signed; a key or signature of another size never verifies.
#include "transport/identity.h"

#include <gtest/gtest.h>

#include "absl/status/statusor.h"

namespace longhaul {
namespace {

TEST(Identity, ASignatureVerifiesUnderItsOwnKeyOverWhatItSigned) {
  const absl::StatusOr<WorkerKey> a = WorkerKey::Generate(), b = WorkerKey::Generate();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->public_key().size(), kPublicKeyBytes);
  EXPECT_NE(a->public_key(), b->public_key());
  const std::string sig = a->Sign("call", {"Register", "bytes"});
  EXPECT_EQ(sig.size(), kSignatureBytes);
  EXPECT_TRUE(VerifySignature(a->public_key(), sig, "call", {"Register", "bytes"}));
  EXPECT_FALSE(VerifySignature(b->public_key(), sig, "call", {"Register", "bytes"}));
  EXPECT_FALSE(VerifySignature(a->public_key(), sig, "hello", {"Register", "bytes"}));
  EXPECT_FALSE(VerifySignature(a->public_key(), sig, "call", {"Registerb", "ytes"}));
  EXPECT_FALSE(VerifySignature(a->public_key(), sig, "call", {"Register", "bytes", ""}));
  std::string flipped = sig;
  flipped[10] ^= 1;
  EXPECT_FALSE(VerifySignature(a->public_key(), flipped, "call", {"Register", "bytes"}));
  EXPECT_FALSE(VerifySignature(a->public_key().substr(1), sig, "call", {"Register", "bytes"}));
  EXPECT_FALSE(VerifySignature(a->public_key(), sig.substr(1), "call", {"Register", "bytes"}));
  EXPECT_FALSE(VerifySignature("", "", "call", {}));
}

}  // namespace
}  // namespace longhaul
