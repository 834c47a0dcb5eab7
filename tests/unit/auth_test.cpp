// The job secret's keys, sealed store values, the identity record, the
// signed store over a real TCPStore (forged, moved and replayed values),
// failure notices that do not verify, and the checkpoint file's encryption.
#include "runtime/auth.h"
#include "runtime/records.h"
#include "runtime/rendezvous.h"
#include "runtime/signed_store.h"
#include "train/checkpoint_file.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ronde::detail {
namespace {

Key32 key_of(const std::string& secret, const std::string& job = "job") {
  return run_key(job_key_from_secret(secret, job), "challenge");
}

std::string temp_file(const std::string& content, mode_t mode) {
  char path[] = "/tmp/ronde-auth-test-XXXXXX";
  int fd = ::mkstemp(path);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(
      ::write(fd, content.data(), content.size()),
      static_cast<ssize_t>(content.size()));
  ::close(fd);
  ::chmod(path, mode);
  return path;
}

std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string text(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}

TEST(Auth, SealedValueOpensOnlyUnderItsKeyAndStoreKey) {
  const Key32 k = key_of("a secret of sixteen+ bytes");
  const std::string sealed = seal_value(k, "ronde/job/x", {3, 7, "payload"});
  std::string why;
  auto v = open_value(k, "ronde/job/x", sealed, why);
  ASSERT_TRUE(v) << why;
  EXPECT_EQ(v->writer, 3);
  EXPECT_EQ(v->sequence, 7u);
  EXPECT_EQ(v->payload, "payload");
  // Another key: another secret, another job, another run.
  EXPECT_FALSE(open_value(
      key_of("another secret, 16+ bytes"), "ronde/job/x", sealed, why));
  EXPECT_FALSE(open_value(
      key_of("a secret of sixteen+ bytes", "job2"),
      "ronde/job/x",
      sealed,
      why));
  EXPECT_FALSE(open_value(
      run_key(job_key_from_secret("a secret of sixteen+ bytes", "job"), "c2"),
      "ronde/job/x",
      sealed,
      why));
  // Moved to another key.
  EXPECT_FALSE(open_value(k, "ronde/job/y", sealed, why));
  EXPECT_NE(why.find("does not verify"), std::string::npos) << why;
  // Any byte changed.
  for (size_t i = 0; i < sealed.size(); ++i) {
    std::string bad = sealed;
    bad[i] ^= 1;
    EXPECT_FALSE(open_value(k, "ronde/job/x", bad, why)) << "byte " << i;
  }
  // Plain text, and anything shorter than a seal.
  EXPECT_FALSE(open_value(k, "ronde/job/x", "1|allreduce", why));
  EXPECT_NE(why.find("not sealed"), std::string::npos) << why;
  EXPECT_FALSE(open_value(k, "ronde/job/x", "", why));
}

TEST(Auth, IdentityRecordVerifiesWithTheJobKeyOnly) {
  const Key32 jk = job_key_from_secret("the job's own secret!", "j1");
  const std::string challenge(32, '\x5a');
  const std::string text = encode_identity("j1", 4, &jk, challenge);
  IdentityRecord r = decode_identity(text);
  EXPECT_EQ(r.job_id, "j1");
  EXPECT_EQ(r.size, "4");
  EXPECT_TRUE(r.authenticated);
  EXPECT_EQ(r.challenge, challenge);
  EXPECT_TRUE(identity_verifies(r, jk));
  EXPECT_FALSE(
      identity_verifies(r, job_key_from_secret("another job's secret", "j1")));
  // A changed size or challenge fails the tag.
  IdentityRecord changed = r;
  changed.size = "5";
  EXPECT_FALSE(identity_verifies(changed, jk));
  changed = r;
  changed.challenge[0] ^= 1;
  EXPECT_FALSE(identity_verifies(changed, jk));
  // The unauthenticated form, as before.
  IdentityRecord plain = decode_identity(encode_identity("j1", 4, nullptr, ""));
  EXPECT_EQ(plain.job_id, "j1");
  EXPECT_EQ(plain.size, "4");
  EXPECT_FALSE(plain.authenticated);
  EXPECT_FALSE(identity_verifies(plain, jk));
  // A job id with bars in it.
  EXPECT_EQ(
      decode_identity(encode_identity("a|b", 2, &jk, challenge)).job_id, "a|b");
}

TEST(Auth, SecretFileMustBePrivateAndLongEnough) {
  const std::string good = temp_file("0123456789abcdef0123\n", 0600);
  EXPECT_EQ(
      read_private_file(good, "the job secret file", 16),
      "0123456789abcdef0123");
  const std::string open_to_all = temp_file("0123456789abcdef0123", 0644);
  try {
    read_private_file(open_to_all, "the job secret file", 16);
    ADD_FAILURE() << "a file others may read was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("mode 0644"), std::string::npos)
        << e.what();
  }
  const std::string short_one = temp_file("short", 0600);
  EXPECT_THROW(
      read_private_file(short_one, "the job secret file", 16),
      std::runtime_error);
  EXPECT_THROW(
      read_private_file("/nonexistent/secret", "x", 16), std::runtime_error);
  for (const auto& f : {good, open_to_all, short_one})
    ::unlink(f.c_str());
}

// A store server in this process, and a client of it as a stranger (no
// secret) would have.
struct StorePair {
  c10::intrusive_ptr<c10d::TCPStore> server, stranger;
  StorePair() {
    c10d::TCPStoreOptions so;
    so.port = 0;
    so.isServer = true;
    so.waitWorkers = false;
    so.timeout = std::chrono::seconds(10);
    server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
    so.port = server->getPort();
    so.isServer = false;
    stranger = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  }
};

TEST(SignedStore, RefusesForgedMovedAndReplayedValues) {
  StorePair p;
  const Key32 k = key_of("the job's own secret!");
  auto a = c10::make_intrusive<SignedStore>(p.server, k, 0);
  auto b = c10::make_intrusive<SignedStore>(p.stranger->clone(), k, 1);
  a->set("ronde/j/x", bytes("one"));
  EXPECT_EQ(text(b->get("ronde/j/x")), "one");
  EXPECT_EQ(text(b->get("ronde/j/x")), "one");  // read again: fine
  // What the store holds is sealed, not the value.
  EXPECT_NE(text(p.stranger->get("ronde/j/x")), "one");

  // A stranger's value.
  p.stranger->set("ronde/j/y", bytes("forged"));
  try {
    b->get("ronde/j/y");
    ADD_FAILURE() << "a forged value was accepted";
  } catch (const RefusedStoreValue& e) {
    EXPECT_EQ(e.key(), "ronde/j/y");
    EXPECT_NE(
        std::string(e.what()).find("'ronde/j/y' refused"), std::string::npos)
        << e.what();
  }
  // A sealed value copied to another key.
  p.stranger->set("ronde/j/z", p.stranger->get("ronde/j/x"));
  EXPECT_THROW(b->get("ronde/j/z"), RefusedStoreValue);
  // A replay: the older value written back over a newer one.
  const auto old = p.stranger->get("ronde/j/x");
  a->set("ronde/j/x", bytes("two"));
  EXPECT_EQ(text(b->get("ronde/j/x")), "two");
  p.stranger->set("ronde/j/x", old);
  try {
    b->get("ronde/j/x");
    ADD_FAILURE() << "a replayed value was accepted";
  } catch (const RefusedStoreValue& e) {
    EXPECT_NE(std::string(e.what()).find("replayed"), std::string::npos)
        << e.what();
  }
  // Another job's (or run's) sealed value.
  auto other = c10::make_intrusive<SignedStore>(
      p.stranger->clone(), key_of("another job's secret!"), 0);
  other->set("ronde/j/w", bytes("theirs"));
  EXPECT_THROW(b->get("ronde/j/w"), RefusedStoreValue);
  // Counters pass through.
  EXPECT_EQ(a->add("ronde/j/n", 2), 2);
  EXPECT_EQ(b->add("ronde/j/n", 0), 2);
}

TEST(SignedStore, AForgedFailureNoticeLeavesItsRankASuspect) {
  StorePair p;
  const Key32 k = key_of("the job's own secret!");
  LaunchInfo info;
  info.job_id = "j";
  info.size = 3;
  info.rank = 0;
  SignedStore mine(p.server, k, 0);
  // Rank 1 really posted its notice; rank 2's is a stranger's forgery.
  SignedStore(p.stranger->clone(), k, 1)
      .set(job_key(info, "failed/1"), std::vector<uint8_t>{1});
  p.stranger->set(job_key(info, "failed/2"), std::vector<uint8_t>{1});
  // std::cerr's buffer, not its file descriptor: gtest's fd capture would
  // close descriptors the store's server thread is reusing.
  std::stringstream captured;
  std::streambuf* was = std::cerr.rdbuf(captured.rdbuf());
  auto failed = failed_peers(mine, info, std::chrono::milliseconds(300));
  std::cerr.rdbuf(was);
  const std::string err = captured.str();
  EXPECT_EQ(failed, std::vector<int>{2});
  EXPECT_NE(err.find("ignoring a failure notice"), std::string::npos) << err;
  EXPECT_NE(err.find("failed/2"), std::string::npos) << err;
  // Unauthenticated, the forgery would have been believed.
  LaunchInfo plain = info;
  plain.job_id = "j-plain";
  p.stranger->set(job_key(plain, "failed/1"), std::vector<uint8_t>{1});
  p.stranger->set(job_key(plain, "failed/2"), std::vector<uint8_t>{1});
  EXPECT_EQ(
      failed_peers(*p.server, plain, std::chrono::milliseconds(300)),
      std::vector<int>{});
}

TEST(Records, PeerAndProgressRecordsAreParsedStrictly) {
  PeerInfo p;
  p.host = "boot/net:1.2";
  p.address = {"198.18.0.2", "route to 198.18.0.1"};
  p.local_rank = 1;
  p.local_size = 2;
  p.cross_rank = 0;
  p.cross_size = 3;
  p.launcher = "ronde";
  PeerInfo q = decode_peer(encode_peer(p), 1);
  EXPECT_EQ(q.host, p.host);
  EXPECT_EQ(q.address.address, p.address.address);
  EXPECT_EQ(q.local_size, 2);
  EXPECT_EQ(q.cross_size, 3);
  EXPECT_THROW(
      decode_peer("a\nb\nc\nx\n1\n0\n1\nronde", 3), std::runtime_error);
  EXPECT_THROW(
      decode_peer("a\nb\nc\n0\n0\n0\n1\nronde", 3), std::runtime_error);
  EXPECT_THROW(decode_peer("a\nb", 3), std::runtime_error);
  EXPECT_THROW(decode_peer(encode_peer(p) + "\nextra", 3), std::runtime_error);
  auto pr = decode_progress(encode_progress({41, "allreduce 'x'"}));
  ASSERT_TRUE(pr);
  EXPECT_EQ(pr->started, 41);
  EXPECT_EQ(pr->what, "allreduce 'x'");
  EXPECT_FALSE(decode_progress("x|y"));
  EXPECT_FALSE(decode_progress("-1|y"));
  EXPECT_FALSE(decode_progress("99999999999999999999999|y"));
  EXPECT_FALSE(decode_progress("12"));
}

TEST(CheckpointFile, PlainAndEncryptedRoundTrip) {
  const std::string payload = "the archive's bytes \x00\x01 and more";
  std::string why;
  auto plain =
      decode_checkpoint(encode_checkpoint(7, payload, "").bytes(), 7, "", why);
  ASSERT_TRUE(plain) << why;
  EXPECT_EQ(*plain, payload);
  const std::string key(32, 'k');
  const std::string a = encode_checkpoint(7, payload, key).bytes();
  const std::string b = encode_checkpoint(7, payload, key).bytes();
  EXPECT_NE(a, b) << "a fresh nonce per file";
  EXPECT_EQ(a.find("the archive"), std::string::npos) << "not encrypted";
  auto opened = decode_checkpoint(a, 7, key, why);
  ASSERT_TRUE(opened) << why;
  EXPECT_EQ(*opened, payload);
  // Empty payloads too.
  EXPECT_TRUE(
      decode_checkpoint(encode_checkpoint(1, "", key).bytes(), 1, key, why));
}

// The CRC-32 of `file` after the encrypted prefix, rewritten, as one who
// changes a file on purpose would.
void fix_crc(std::string& file) {
  constexpr size_t prefix = 32 + 8 + 12 + 16;
  uint32_t crc = 0;
  {
    // Recomputed with zlib's polynomial: the same as the writer's.
    uint32_t c = 0xffffffffu;
    for (size_t i = prefix; i < file.size(); ++i) {
      c ^= static_cast<uint8_t>(file[i]);
      for (int k = 0; k < 8; ++k)
        c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    crc = ~c;
  }
  std::memcpy(file.data() + 24, &crc, 4);
}

TEST(CheckpointFile, EveryChangedByteAndAWrongKeyAreRefused) {
  const std::string payload(300, 'p');
  const std::string key(32, 'k');
  const std::string file = encode_checkpoint(9, payload, key).bytes();
  std::string why;
  EXPECT_FALSE(decode_checkpoint(file, 9, std::string(32, 'K'), why));
  EXPECT_NE(why.find("another key"), std::string::npos) << why;
  EXPECT_FALSE(decode_checkpoint(file, 9, "", why));
  EXPECT_NE(why.find("encrypted"), std::string::npos) << why;
  EXPECT_FALSE(decode_checkpoint(
      encode_checkpoint(9, payload, "").bytes(), 9, key, why));
  EXPECT_NE(why.find("not encrypted"), std::string::npos) << why;
  for (size_t i = 0; i < file.size(); ++i) {
    std::string bad = file;
    bad[i] ^= 0x10;
    if (i >= 32 + 8 + 12 + 16 || i < 24 || i >= 28)
      fix_crc(bad);  // past the checksum: only the tag can tell
    EXPECT_FALSE(decode_checkpoint(bad, 9, key, why)) << "byte " << i;
  }
  std::string changed = file;
  changed[100] ^= 1;
  fix_crc(changed);
  EXPECT_FALSE(decode_checkpoint(changed, 9, key, why));
  EXPECT_NE(why.find("tag does not verify"), std::string::npos) << why;
  changed = file;
  changed[100] ^= 1;
  EXPECT_FALSE(decode_checkpoint(changed, 9, key, why));
  EXPECT_NE(why.find("checksum"), std::string::npos) << why;
}

TEST(CheckpointFile, KeyFileHoldsRawOrHexBytes) {
  const std::string hex = temp_file(std::string(64, 'a') + "\n", 0600);
  EXPECT_EQ(read_checkpoint_key(hex), std::string(32, '\xaa'));
  const std::string raw = temp_file(std::string(32, '\x01'), 0600);
  EXPECT_EQ(read_checkpoint_key(raw), std::string(32, '\x01'));
  const std::string bad = temp_file(std::string(40, 'z'), 0600);
  EXPECT_THROW(read_checkpoint_key(bad), std::runtime_error);
  for (const auto& f : {hex, raw, bad})
    ::unlink(f.c_str());
}

}  // namespace
}  // namespace ronde::detail
