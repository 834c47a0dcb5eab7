#include "optim/shard_state.h"

#include "engine/blobs.h"

#include <ronde/collectives.h>
#include <ronde/optimizer.h>
#include <ronde/runtime.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <c10/util/typeid.h>
#include <torch/optim.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <typeinfo>

namespace ronde::detail {
namespace {

using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

std::string key_of(const at::Tensor& t) {
  return std::to_string(reinterpret_cast<size_t>(t.unsafeGetTensorImpl()));
}

int64_t read_size(InputArchive& a, const std::string& key) {
  at::Tensor t;
  a.read(key, t);
  return t.item<int64_t>();
}

// Group g's part of the "param_groups" archive: keys and options.
void write_group(
    OutputArchive& groups,
    size_t g,
    const std::vector<std::string>& keys,
    const torch::optim::OptimizerOptions& options) {
  OutputArchive group(groups.compilation_unit());
  group.write("params/size", at::tensor(static_cast<int64_t>(keys.size())));
  for (size_t j = 0; j < keys.size(); ++j)
    group.write("params/" + std::to_string(j), c10::IValue(keys[j]));
  OutputArchive opts(group.compilation_unit());
  options.serialize(opts);
  group.write("options", opts);
  groups.write("param_groups/" + std::to_string(g), group);
}

const torch::optim::OptimizerOptions& options_of(
    const FullState& full, const torch::optim::Optimizer& wrapped, size_t g) {
  if (g < full.options.size() && full.options[g])
    return *full.options[g];
  return wrapped.param_groups()[g].options();
}

bool same_value(const c10::IValue& a, const c10::IValue& b) {
  if (a.isTensor() && b.isTensor())
    return at::equal(a.toTensor(), b.toTensor());
  return a.tagKind() == b.tagKind() && a.equals(b).toBool();
}

}  // namespace

void reopen(OutputArchive& out, InputArchive& in) {
  const std::string bytes = bytes_of(out);
  load_bytes(in, bytes);
}

void check_elementwise(const torch::optim::Optimizer& o) {
  TORCH_CHECK(
      !dynamic_cast<const torch::optim::LBFGS*>(&o),
      "ronde: shard_optimizer_state cannot shard LBFGS on rank ",
      ronde::rank(),
      ": its line search and history need whole parameter vectors");
  const bool known = dynamic_cast<const torch::optim::SGD*>(&o) ||
                     dynamic_cast<const torch::optim::Adam*>(&o) ||
                     dynamic_cast<const torch::optim::AdamW*>(&o) ||
                     dynamic_cast<const torch::optim::RMSprop*>(&o) ||
                     dynamic_cast<const torch::optim::Adagrad*>(&o) ||
                     dynamic_cast<const ElementwiseOptimizer*>(&o);
  TORCH_CHECK(
      known,
      "ronde: shard_optimizer_state needs an element-wise optimizer (SGD, "
      "Adam, AdamW, RMSprop, Adagrad, or one deriving from "
      "ronde::ElementwiseOptimizer); ",
      c10::demangle(typeid(o).name()),
      " is not known to be one (rank ",
      ronde::rank(),
      ")");
}

std::string shard_blob(
    const torch::optim::Optimizer& wrapped, const ShardSpots& spots) {
  OutputArchive out;
  OutputArchive opt(out.compilation_unit());
  wrapped.save(opt);
  out.write("optimizer", opt);
  std::vector<int64_t> flat;
  for (const auto& group : spots) {
    for (const ShardSpot& s : group)
      flat.insert(flat.end(), {s.group, s.index, s.offset, s.numel});
  }
  out.write("spots", at::tensor(flat, at::kLong));
  return bytes_of(out);
}

FullState assemble(
    const std::vector<std::string>& blobs, const FullGroups& groups) {
  // [group][index] -> name -> (offset, tensor) pieces, or one value.
  struct Parts {
    std::map<std::string, std::vector<std::pair<int64_t, at::Tensor>>> pieces;
    std::map<std::string, c10::IValue> values;
  };
  std::vector<std::vector<Parts>> parts(groups.size());
  for (size_t g = 0; g < groups.size(); ++g)
    parts[g].resize(groups[g].size());
  for (const std::string& blob : blobs) {
    InputArchive in;
    load_bytes(in, blob);
    at::Tensor spots;
    in.read("spots", spots);
    InputArchive opt, state, param_groups;
    in.read("optimizer", opt);
    opt.read("state", state);
    opt.read("param_groups", param_groups);
    const int64_t* s = spots.data_ptr<int64_t>();
    const int64_t ngroups = read_size(param_groups, "param_groups/size");
    for (int64_t g = 0; g < ngroups; ++g) {
      InputArchive group;
      param_groups.read("param_groups/" + std::to_string(g), group);
      const int64_t nparams = read_size(group, "params/size");
      for (int64_t j = 0; j < nparams; ++j, s += 4) {
        c10::IValue key;
        group.read("params/" + std::to_string(j), key);
        InputArchive ps;
        if (!state.try_read(key.toStringRef(), ps))
          continue;
        Parts& p = parts[s[0]][s[1]];
        for (const std::string& name : ps.keys()) {
          c10::IValue v;
          ps.read(name, v);
          if (v.isTensor() && v.toTensor().dim() == 1 &&
              v.toTensor().numel() == s[3]) {
            p.pieces[name].emplace_back(s[2], v.toTensor());
            continue;
          }
          auto it = p.values.find(name);
          TORCH_CHECK(
              it == p.values.end() || same_value(it->second, v),
              "ronde: the state '",
              name,
              "' differs between the shards of one parameter (group ",
              s[0],
              ", parameter ",
              s[1],
              "): the optimizer is not element-wise");
          p.values.emplace(name, v);
        }
      }
    }
  }
  FullState full;
  full.params.resize(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    full.params[g].resize(groups[g].size());
    for (size_t j = 0; j < groups[g].size(); ++j) {
      Parts& p = parts[g][j];
      auto& out = full.params[g][j];
      out = p.values;
      for (auto& [name, list] : p.pieces) {
        std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) {
          return a.first < b.first;
        });
        std::vector<at::Tensor> ts;
        int64_t next = 0;
        for (auto& [offset, t] : list) {
          TORCH_CHECK(
              offset == next,
              "ronde: the shards of group ",
              g,
              ", parameter ",
              j,
              " do not cover it for the state '",
              name,
              "'");
          ts.push_back(t);
          next += t.numel();
        }
        const at::Tensor& param = groups[g][j];
        TORCH_CHECK(
            next == param.numel(),
            "ronde: the shards of group ",
            g,
            ", parameter ",
            j,
            " hold ",
            next,
            " of its ",
            param.numel(),
            " elements for the state '",
            name,
            "'");
        out[name] = at::cat(ts).view(param.sizes());
      }
    }
  }
  return full;
}

void write_full(
    OutputArchive& archive,
    const FullState& full,
    const torch::optim::Optimizer& wrapped,
    const FullGroups& groups) {
  archive.write("pytorch_version", c10::IValue("1.5.0"));
  OutputArchive state(archive.compilation_unit());
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t j = 0; j < groups[g].size(); ++j) {
      if (g >= full.params.size() || full.params[g][j].empty())
        continue;
      OutputArchive ps(state.compilation_unit());
      for (const auto& [name, v] : full.params[g][j])
        ps.write(name, v);
      state.write(key_of(groups[g][j]), ps);
    }
  }
  archive.write("state", state);
  OutputArchive param_groups(archive.compilation_unit());
  param_groups.write(
      "param_groups/size", at::tensor(static_cast<int64_t>(groups.size())));
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<std::string> keys;
    for (const auto& p : groups[g])
      keys.push_back(key_of(p));
    write_group(param_groups, g, keys, options_of(full, wrapped, g));
  }
  archive.write("param_groups", param_groups);
}

FullState read_full(
    InputArchive& archive,
    const torch::optim::Optimizer& wrapped,
    const FullGroups& groups) {
  c10::IValue version;
  TORCH_CHECK(
      archive.try_read("pytorch_version", version),
      "ronde: rank ",
      ronde::rank(),
      ": the optimizer state is not in LibTorch's format, which a sharded "
      "optimizer reads");
  InputArchive state, param_groups;
  archive.read("state", state);
  archive.read("param_groups", param_groups);
  const int64_t ngroups = read_size(param_groups, "param_groups/size");
  TORCH_CHECK(
      ngroups == static_cast<int64_t>(groups.size()),
      "ronde: the saved optimizer state has ",
      ngroups,
      " param groups, this optimizer ",
      groups.size(),
      " (rank ",
      ronde::rank(),
      ")");
  FullState full;
  full.params.resize(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    InputArchive group;
    param_groups.read("param_groups/" + std::to_string(g), group);
    const int64_t n = read_size(group, "params/size");
    TORCH_CHECK(
        n == static_cast<int64_t>(groups[g].size()),
        "ronde: param group ",
        g,
        " of the saved optimizer state has ",
        n,
        " parameters, this optimizer's ",
        groups[g].size(),
        " (rank ",
        ronde::rank(),
        ")");
    full.params[g].resize(n);
    for (int64_t j = 0; j < n; ++j) {
      c10::IValue key;
      group.read("params/" + std::to_string(j), key);
      InputArchive ps;
      if (!state.try_read(key.toStringRef(), ps))
        continue;
      for (const std::string& name : ps.keys()) {
        c10::IValue v;
        ps.read(name, v);
        full.params[g][j][name] = v;
      }
    }
    InputArchive opts;
    group.read("options", opts);
    auto options = wrapped.param_groups()[g].options().clone();
    options->serialize(opts);
    full.options.push_back(std::move(options));
  }
  return full;
}

void load_slices(
    torch::optim::Optimizer& wrapped,
    const FullState& full,
    const ShardSpots& spots,
    const FullGroups& groups) {
  OutputArchive archive;
  archive.write("pytorch_version", c10::IValue("1.5.0"));
  OutputArchive state(archive.compilation_unit());
  OutputArchive param_groups(archive.compilation_unit());
  param_groups.write(
      "param_groups/size", at::tensor(static_cast<int64_t>(spots.size())));
  for (size_t g = 0; g < spots.size(); ++g) {
    const auto& shards = wrapped.param_groups()[g].params();
    TORCH_INTERNAL_ASSERT(shards.size() == spots[g].size());
    std::vector<std::string> keys;
    for (size_t k = 0; k < shards.size(); ++k) {
      const ShardSpot& s = spots[g][k];
      keys.push_back(key_of(shards[k]));
      const auto& values = full.params[s.group][s.index];
      if (values.empty())
        continue;
      const at::Tensor& param = groups[s.group][s.index];
      OutputArchive ps(state.compilation_unit());
      for (const auto& [name, v] : values) {
        if (v.isTensor() && v.toTensor().sizes() == param.sizes()) {
          ps.write(
              name,
              c10::IValue(v.toTensor()
                              .reshape({-1})
                              .narrow(0, s.offset, s.numel)
                              .clone()));
        } else {
          ps.write(name, v);
        }
      }
      state.write(keys.back(), ps);
    }
    write_group(param_groups, g, keys, options_of(full, wrapped, g));
  }
  archive.write("state", state);
  archive.write("param_groups", param_groups);
  InputArchive in;
  reopen(archive, in);
  wrapped.state().clear();
  wrapped.load(in);
}

}  // namespace ronde::detail
