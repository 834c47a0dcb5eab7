// An allgather into a buffer the caller keeps (for the sharded engine's
// pool of gather buffers): the result is `into`'s first elements, shaped
// as allgather's, when `into` is large enough and of the input's type and
// device; a new tensor otherwise. Handle::result() returns it either way.
#pragma once

#include <ronde/collectives.h>

namespace ronde::detail {

Handle allgather_into_async(
    const at::Tensor& tensor,
    const at::Tensor& into,
    const CollectiveOptions& options = {});

}  // namespace ronde::detail
