// PowerSGD (ronde/comm_hook.h; Vogels et al., NeurIPS 2019): per bucket,
// one all-reduce of [the gradients sent as they are, the used flags, every
// P = M Q], then P orthogonalized, then one all-reduce of every Q = M^T P,
// and M ~ P Q^T. State (the warm-start Q and the error buffer of each
// compressed gradient) is keyed by parameter index, so that buckets laid
// out again (the first step's rebuild, autotune) keep it.
#include <ronde/comm_hook.h>

#include <ronde/runtime.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>

namespace ronde {
namespace {

// A compressed gradient, seen as an n x m matrix of rank r.
struct Matrix {
  size_t param;
  at::Tensor m;  // the gradient's view, reshaped
  int64_t rank;
};

// `b`^T `thin` as (`thin`^T `b`)^T, for a thin `thin` (k x r, r small): P =
// M Q is (Q^T M^T)^T and Q = M^T P is (P^T M)^T. The same product, but the
// BLAS takes the r x k by k x m product on its fast path: with one thread
// on a 4096 x 4096 float matrix at rank 4, Q = M^T P takes 10 ms this way
// and 129 ms as mm(M^T, P), and P 11 ms against 22 (rank 1: 3.5 ms either
// way).
at::Tensor thin_product(const at::Tensor& thin, const at::Tensor& b) {
  return at::mm(thin.t(), b).t();
}

// Gram-Schmidt on the columns of `p` (n x r), in place: each column is
// made orthogonal to those before it, then divided by its norm plus `eps`
// (a zero column stays zero).
void orthogonalize(at::Tensor& p, double eps) {
  const int64_t r = p.size(1);
  for (int64_t i = 0; i < r; ++i) {
    at::Tensor col = p.narrow(1, i, 1);
    at::Tensor norm = at::linalg_vector_norm(col, 2, at::IntArrayRef{0}, true);
    col.div_(norm.add(eps).clamp_min(std::numeric_limits<float>::min()));
    if (i + 1 < r) {
      at::Tensor rest = p.narrow(1, i + 1, r - i - 1);
      rest.sub_(at::sum(col * rest, {0}, true) * col);
    }
  }
}

// Where `view` starts in `buffer`, in elements.
int64_t offset_in(const at::Tensor& buffer, const at::Tensor& view) {
  return view.storage_offset() - buffer.storage_offset();
}

class PowerSGDHook : public CommHook {
 public:
  explicit PowerSGDHook(const PowerSGDOptions& o) : o_(o) {
    TORCH_CHECK(
        o.rank() >= 1,
        "ronde: PowerSGD on rank ",
        ronde::rank(),
        ": rank must be at least 1, got ",
        o.rank());
    TORCH_CHECK(
        o.start_iter() >= 0,
        "ronde: PowerSGD on rank ",
        ronde::rank(),
        ": start_iter must be >= 0, got ",
        o.start_iter());
    TORCH_CHECK(
        o.min_compression_rate() > 0,
        "ronde: PowerSGD on rank ",
        ronde::rank(),
        ": min_compression_rate must be positive, got ",
        o.min_compression_rate());
    TORCH_CHECK(
        o.orthogonalization_epsilon() >= 0,
        "ronde: PowerSGD on rank ",
        ronde::rank(),
        ": orthogonalization_epsilon must be >= 0, got ",
        o.orthogonalization_epsilon());
  }

  std::string name() const override {
    return "powersgd";
  }
  std::string describe() const override {
    std::ostringstream s;
    s.precision(17);
    s << "powersgd rank=" << o_.rank() << " start_iter=" << o_.start_iter()
      << " min_compression_rate=" << o_.min_compression_rate()
      << " error_feedback=" << o_.error_feedback()
      << " warm_start=" << o_.warm_start()
      << " epsilon=" << o_.orthogonalization_epsilon() << " seed=" << o_.seed();
    return s.str();
  }
  bool stateful() const override {
    return true;
  }

  void reduce(CommBucket& bucket) override {
    count_bucket();
    const at::Tensor& buffer = bucket.buffer;
    std::lock_guard<std::mutex> lock(mutex_);
    // The steps this hook has reduced (saved with its state, so that a
    // resumed job compresses from the same step on).
    const int64_t iter = iter_;
    if (bucket.last)
      ++iter_;
    std::vector<Matrix> matrices;
    if (iter >= o_.start_iter() && buffer.is_floating_point())
      matrices = compressible(bucket);
    if (matrices.empty()) {
      count_bytes(buffer.numel() * buffer.element_size());
      allreduce_async_(buffer, bucket.options).wait();
      return;
    }
    // What goes as it is: the buffer less the compressed segments.
    std::vector<at::Tensor> plain;
    int64_t at = 0;
    for (const Matrix& x : matrices) {
      const int64_t start = offset_in(buffer, x.m);
      if (start > at)
        plain.push_back(buffer.narrow(0, at, start - at));
      at = start + x.m.numel();
    }
    if (at < buffer.numel())
      plain.push_back(buffer.narrow(0, at, buffer.numel() - at));

    std::vector<at::Tensor> ps, qs;
    for (Matrix& x : matrices) {
      if (o_.error_feedback()) {
        at::Tensor& e = errors_[x.param];
        if (!e.defined() || !e.sizes().equals(x.m.sizes()))
          e = at::zeros_like(x.m);
        x.m.add_(e);
      }
      qs.push_back(initial_q(x, iter));
      ps.push_back(thin_product(qs.back(), x.m.t()));
    }
    // One all-reduce for the plain part and every P: P's scale does not
    // matter (it is orthogonalized), so the bucket's factors serve both.
    std::vector<at::Tensor> first = plain;
    for (const auto& p : ps)
      first.push_back(p.reshape({-1}));
    at::Tensor wire = at::cat(first);
    count_bytes(wire.numel() * wire.element_size());
    allreduce_async_(wire, named(bucket, ".p")).wait();
    int64_t off = 0;
    for (auto& t : plain) {
      t.copy_(wire.narrow(0, off, t.numel()));
      off += t.numel();
    }
    for (auto& p : ps) {
      p = wire.narrow(0, off, p.numel()).view(p.sizes());
      off += p.numel();
      orthogonalize(p, o_.orthogonalization_epsilon());
    }
    std::vector<at::Tensor> second;
    for (size_t i = 0; i < matrices.size(); ++i)
      second.push_back(thin_product(ps[i], matrices[i].m).reshape({-1}));
    at::Tensor qwire = at::cat(second);
    count_bytes(qwire.numel() * qwire.element_size());
    allreduce_async_(qwire, named(bucket, ".q")).wait();
    off = 0;
    for (size_t i = 0; i < matrices.size(); ++i) {
      Matrix& x = matrices[i];
      at::Tensor q =
          qwire.narrow(0, off, qs[i].numel()).view(qs[i].sizes()).clone();
      off += q.numel();
      if (o_.error_feedback()) {
        at::Tensor& e = errors_[x.param];
        e.copy_(x.m);
        at::mm_out(x.m, ps[i], q.t());
        e.sub_(x.m);
      } else {
        at::mm_out(x.m, ps[i], q.t());
      }
      if (o_.warm_start())
        qs_[x.param] = q;
    }
  }

  void save(torch::serialize::OutputArchive& archive) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    archive.write("iter", at::tensor({iter_}, at::kLong));
    write_map(archive, "q", qs_);
    write_map(archive, "error", errors_);
  }
  void load(torch::serialize::InputArchive& archive) override {
    std::lock_guard<std::mutex> lock(mutex_);
    at::Tensor iter;
    iter_ = archive.try_read("iter", iter) ? iter.item<int64_t>() : 0;
    read_map(archive, "q", qs_);
    read_map(archive, "error", errors_);
  }
  void reset() override {
    std::lock_guard<std::mutex> lock(mutex_);
    iter_ = 0;
    qs_.clear();
    errors_.clear();
  }

 private:
  // The bucket's gradients worth compressing: two or more dimensions, and
  // n*m >= min_compression_rate * (n+m)*r.
  std::vector<Matrix> compressible(const CommBucket& bucket) const {
    std::vector<Matrix> out;
    for (size_t i = 0; i < bucket.gradients.size(); ++i) {
      const at::Tensor& g = bucket.gradients[i];
      if (g.dim() < 2)
        continue;
      const int64_t n = g.size(0), m = g.numel() / std::max<int64_t>(n, 1);
      const int64_t r = std::min({o_.rank(), n, m});
      if (r < 1 || static_cast<double>(n) * m < o_.min_compression_rate() *
                                                    static_cast<double>(n + m) *
                                                    r) {
        continue;
      }
      out.push_back(Matrix{bucket.parameters[i], g.view({n, m}), r});
    }
    return out;
  }

  // The last step's Q (warm start), or a random one, orthogonalized, drawn
  // alike on every rank: seeded by the seed, the parameter, and (without
  // warm start) the step.
  at::Tensor initial_q(const Matrix& x, int64_t step) {
    const int64_t m = x.m.size(1);
    if (o_.warm_start()) {
      auto it = qs_.find(x.param);
      // A Q that came back zero (the gradient was zero on every rank: an
      // unused parameter) would keep P and Q zero for good; draw anew. On
      // the host only: the test costs a device sync.
      if (it != qs_.end() && it->second.size(0) == m &&
          it->second.size(1) == x.rank &&
          !(it->second.is_cpu() && !it->second.any().item<bool>())) {
        return it->second;
      }
    }
    uint64_t seed = o_.seed() * 0x9E3779B97F4A7C15ULL + x.param * 1000003ULL;
    if (!o_.warm_start())
      seed += static_cast<uint64_t>(step) * 0xD1B54A32D192ED03ULL;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    at::Tensor q = at::randn({m, x.rank}, gen, at::TensorOptions(at::kFloat))
                       .to(x.m.options());
    orthogonalize(q, o_.orthogonalization_epsilon());
    return q;
  }

  static AllreduceOptions named(const CommBucket& b, const char* suffix) {
    AllreduceOptions o = b.options;
    o.name(o.name() + suffix);
    return o;
  }

  static void write_map(
      torch::serialize::OutputArchive& a,
      const std::string& key,
      const std::map<size_t, at::Tensor>& m) {
    std::vector<int64_t> keys;
    for (const auto& [k, t] : m) {
      keys.push_back(static_cast<int64_t>(k));
      a.write(key + "_" + std::to_string(k), t);
    }
    a.write(key, at::tensor(keys, at::kLong));
  }
  static void read_map(
      torch::serialize::InputArchive& a,
      const std::string& key,
      std::map<size_t, at::Tensor>& m) {
    m.clear();
    at::Tensor keys;
    if (!a.try_read(key, keys))
      return;
    for (int64_t i = 0; i < keys.numel(); ++i) {
      const auto k = static_cast<size_t>(keys[i].item<int64_t>());
      at::Tensor t;
      a.read(key + "_" + std::to_string(k), t);
      m[k] = t;
    }
  }

  const PowerSGDOptions o_;
  mutable std::mutex mutex_;  // the state, against save() and load()
  int64_t iter_ = 0;
  std::map<size_t, at::Tensor> qs_;      // by parameter: the last Q
  std::map<size_t, at::Tensor> errors_;  // by parameter: M - P Q^T
};

}  // namespace

std::shared_ptr<CommHook> powersgd_hook(const PowerSGDOptions& options) {
  return std::make_shared<PowerSGDHook>(options);
}

}  // namespace ronde
