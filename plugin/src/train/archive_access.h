// The module inside LibTorch's serialize archives. OutputArchive and
// InputArchive keep it private and offer only a zip file as the way out,
// which copies and checksums every byte; an elastic commit must cost a
// memcpy, so it copies the archive's module instead. The access goes
// through an explicit template instantiation, which the language exempts
// from access checks; a LibTorch that renames the member fails to compile
// here rather than misbehave.
#pragma once

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

namespace ronde::detail {

template <typename Tag, typename Tag::type Member>
struct ArchiveAccess {
  friend typename Tag::type member_of(Tag) {
    return Member;
  }
};

struct OutputModuleTag {
  using type = torch::jit::Module torch::serialize::OutputArchive::*;
  friend type member_of(OutputModuleTag);
};
struct InputModuleTag {
  using type = torch::jit::Module torch::serialize::InputArchive::*;
  friend type member_of(InputModuleTag);
};

template struct ArchiveAccess<
    OutputModuleTag,
    &torch::serialize::OutputArchive::module_>;
template struct ArchiveAccess<
    InputModuleTag,
    &torch::serialize::InputArchive::module_>;

inline torch::jit::Module& module_of(torch::serialize::OutputArchive& a) {
  return a.*member_of(OutputModuleTag{});
}
inline torch::jit::Module& module_of(torch::serialize::InputArchive& a) {
  return a.*member_of(InputModuleTag{});
}

}  // namespace ronde::detail
