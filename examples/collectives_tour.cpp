// A tour of ronde's collectives: run it with `ronderun -np 2 collectives_tour`.
// Every rank contributes its own data; rank 0 prints what came back.
#include <ronde/ronde.h>

#include <torch/torch.h>

#include <iostream>

int main() {
  ronde::init();
  const int rank = ronde::rank();
  const int size = ronde::size();
  auto say = [&](const std::string& what, const torch::Tensor& t) {
    if (rank == 0)
      std::cout << what << ":\n" << t << "\n" << std::endl;
  };
  if (rank == 0) {
    std::cout << "ronde " << RONDE_VERSION_STRING << ": " << size
              << " ranks, job " << ronde::job_id() << ", device "
              << ronde::device() << "\n"
              << std::endl;
  }

  // Each rank holds [rank, rank, rank]: the average is (size - 1) / 2.
  torch::Tensor mine = torch::full({3}, static_cast<float>(rank));
  say("allreduce (average)", ronde::allreduce(mine));
  say("allreduce (max)",
      ronde::allreduce(
          mine, ronde::AllreduceOptions().op(ronde::ReduceOp::Max)));

  // Rank r contributes r + 1 rows: allgather concatenates them in rank order.
  say("allgather", ronde::allgather(torch::full({rank + 1, 2}, rank)));

  // Everyone receives rank 0's tensor.
  say("broadcast from rank 0",
      ronde::broadcast(torch::arange(4) * (rank + 1), 0));

  // Rank r sends row d to rank d: a transpose across ranks.
  torch::Tensor rows = torch::arange(size).to(torch::kFloat) + 10 * rank;
  say("alltoall (rank 0 receives element 0 of every rank)",
      ronde::alltoall(rows));

  // Sum over ranks, then each rank keeps its share of the rows.
  say("reducescatter (rank 0's share)",
      ronde::reducescatter(
          torch::ones({2 * size, 2}),
          ronde::ReducescatterOptions().op(ronde::ReduceOp::Sum)));

  // Asynchronous: start several, overlap other work, then wait.
  std::vector<ronde::Handle> handles;
  for (int i = 0; i < 4; ++i) {
    handles.push_back(ronde::allreduce_async(
        torch::full({2}, float(i)),
        ronde::AllreduceOptions().name("async." + std::to_string(i))));
  }
  for (auto& h : handles)
    h.wait();
  say("last async result", handles.back().result());

  ronde::barrier();
  ronde::shutdown();
  return 0;
}
