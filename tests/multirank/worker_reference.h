// The reference side of the collective scenarios: every rank's input,
// generated deterministically from (rank, seed, shape), the result a
// collective must give, computed from all of them, and the checks of each
// collective on a process set against that reference.
#pragma once

#include <ronde/collectives.h>
#include <ronde/process_set.h>

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace ronde::testing {

// Exact comparison for integers and for reductions whose order does not
// matter; a tolerance for float sums reduced in ring order.
bool close(const at::Tensor& a, const at::Tensor& b);

// Rank r's input for a collective: deterministic in (r, seed, shape).
at::Tensor input_for(
    int r, int64_t seed, at::IntArrayRef shape, at::ScalarType dtype);

// The reduction of n ranks' inputs, computed in double/long.
at::Tensor reference_reduce(
    int n,
    int64_t seed,
    at::IntArrayRef shape,
    at::ScalarType dtype,
    ronde::ReduceOp op);

// A sum against its exact value, within what rounding allows (see the
// definition for the bound).
bool close_sum(
    const at::Tensor& got,
    int n,
    int64_t seed,
    at::IntArrayRef shape,
    at::ScalarType dtype);

extern const std::vector<at::ScalarType> kFloatTypes;
extern const std::vector<at::ScalarType> kIntTypes;

// Each collective on `ps` (the job when default), against the reference;
// a difference is a failed CHECK_W.
void check_allreduce(const ronde::ProcessSet& ps = {});
void check_allgather(const ronde::ProcessSet& ps = {});
void check_broadcast(const ronde::ProcessSet& ps = {});
void check_alltoall(const ronde::ProcessSet& ps = {});
void check_reducescatter(const ronde::ProcessSet& ps = {});
void check_into(const ronde::ProcessSet& ps = {});
void check_async(const ronde::ProcessSet& ps = {});

}  // namespace ronde::testing
