// The check that every rank holds the same list of tensors (parameters,
// buffers) before ronde pairs them up across ranks: one allgather of each
// rank's list as text, and the same error on every rank naming the first
// difference.
#pragma once

#include <ronde/process_set.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace ronde::detail {

// "'name' Float[3, 4] on cpu": what must agree across ranks.
std::string describe_tensor(const std::string& name, const at::Tensor& t);

// "Float@cpu": tensors that may share one flat buffer.
std::string dtype_device_key(const at::Tensor& t);

// Throws c10::Error on every rank of `set` unless every rank's `lines`
// equal those of the set's first rank; `what` names the list in the message
// (which names job ranks) and the collectives.
void check_same_everywhere(
    const std::string& what,
    const std::vector<std::string>& lines,
    const ProcessSet& set = {});

}  // namespace ronde::detail
