// Sealing on set, opening and the replay check on get.
#include "runtime/signed_store.h"

namespace ronde::detail {

SignedStore::SignedStore(
    c10::intrusive_ptr<c10d::Store> inner, Key32 run_key, int writer)
    : SignedStore(
          std::move(inner), run_key, writer, std::make_shared<State>()) {}

SignedStore::SignedStore(
    c10::intrusive_ptr<c10d::Store> inner,
    Key32 run_key,
    int writer,
    std::shared_ptr<State> state)
    : c10d::Store(inner->getTimeout()),
      inner_(std::move(inner)),
      run_key_(run_key),
      writer_(writer),
      state_(std::move(state)) {}

c10::intrusive_ptr<c10d::Store> SignedStore::clone() {
  return c10::make_intrusive<SignedStore>(
      inner_->clone(), run_key_, writer_, state_);
}

void SignedStore::set(
    const std::string& key, const std::vector<uint8_t>& value) {
  SealedValue v;
  v.writer = writer_;
  v.sequence = state_->next_sequence.fetch_add(1);
  v.payload.assign(value.begin(), value.end());
  const std::string sealed = seal_value(run_key_, key, v);
  inner_->set(key, std::vector<uint8_t>(sealed.begin(), sealed.end()));
}

std::vector<uint8_t> SignedStore::get(const std::string& key) {
  const std::vector<uint8_t> raw = inner_->get(key);
  std::string why;
  auto v = open_value(run_key_, key, std::string(raw.begin(), raw.end()), why);
  if (!v)
    throw RefusedStoreValue(key, why);
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    uint64_t& newest = state_->newest[{key, v->writer}];
    // The same value read again is fine; an older one of the same writer
    // is a replay.
    if (v->sequence < newest) {
      throw RefusedStoreValue(
          key,
          "replayed: rank " + std::to_string(v->writer) + "'s value #" +
              std::to_string(v->sequence) + ", after #" +
              std::to_string(newest) + " was read");
    }
    newest = v->sequence;
  }
  return std::vector<uint8_t>(v->payload.begin(), v->payload.end());
}

int64_t SignedStore::add(const std::string& key, int64_t value) {
  return inner_->add(key, value);
}

bool SignedStore::deleteKey(const std::string& key) {
  return inner_->deleteKey(key);
}

bool SignedStore::check(const std::vector<std::string>& keys) {
  return inner_->check(keys);
}

int64_t SignedStore::getNumKeys() {
  return inner_->getNumKeys();
}

void SignedStore::wait(const std::vector<std::string>& keys) {
  inner_->wait(keys);
}

void SignedStore::wait(
    const std::vector<std::string>& keys,
    const std::chrono::milliseconds& timeout) {
  inner_->wait(keys, timeout);
}

const std::chrono::milliseconds& SignedStore::getTimeout() const noexcept {
  return inner_->getTimeout();
}

void SignedStore::setTimeout(const std::chrono::milliseconds& timeout) {
  inner_->setTimeout(timeout);
}

}  // namespace ronde::detail
