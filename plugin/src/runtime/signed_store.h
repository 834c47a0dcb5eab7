// The job's store as the ranks of an authenticated job see it: every value
// ronde sets is sealed (runtime/auth.h) and every value it gets is opened
// and checked before use, so a process that can reach the store but has no
// secret can neither make a rank act on a value of its own nor replay one.
// Counters (add), existence (check, wait) and deletion pass through: the
// store computes them itself, so they cannot carry a tag. An attacker who
// reaches the store can still stall or fail a job through them (or by
// deleting keys); it cannot make a rank trust what it wrote.
#pragma once

#include "runtime/auth.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

namespace ronde::detail {

// A store value that failed its check: forged, written without the secret,
// or replayed. Never acted upon; the message names the key.
class RefusedStoreValue : public std::runtime_error {
 public:
  RefusedStoreValue(const std::string& key, const std::string& why)
      : std::runtime_error("ronde: store value '" + key + "' refused: " + why),
        key_(key) {}
  const std::string& key() const noexcept {
    return key_;
  }

 private:
  std::string key_;
};

class SignedStore : public c10d::Store {
 public:
  // `writer`: this process's rank, recorded in each value it seals.
  SignedStore(c10::intrusive_ptr<c10d::Store> inner, Key32 run_key, int writer);

  c10::intrusive_ptr<c10d::Store> clone() override;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  // Throws RefusedStoreValue.
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(
      const std::vector<std::string>& keys,
      const std::chrono::milliseconds& timeout) override;
  const std::chrono::milliseconds& getTimeout() const noexcept override;
  void setTimeout(const std::chrono::milliseconds& timeout) override;

  // Shared by clones: the sequence numbers this process sealed with and the
  // newest one seen of each (key, writer), which a replay falls behind.
  struct State {
    std::atomic<uint64_t> next_sequence{1};
    std::mutex mutex;
    std::map<std::pair<std::string, int32_t>, uint64_t> newest;
  };
  SignedStore(
      c10::intrusive_ptr<c10d::Store> inner,
      Key32 run_key,
      int writer,
      std::shared_ptr<State> state);

 private:
  c10::intrusive_ptr<c10d::Store> inner_;
  Key32 run_key_;
  int writer_;
  std::shared_ptr<State> state_;
};

}  // namespace ronde::detail
