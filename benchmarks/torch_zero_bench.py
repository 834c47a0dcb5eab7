"""PyTorch's peer of zero_bench, run under torchrun by run_zero.py: the
same MLP (layers x Linear(width, width)) under DDP over gloo with
torch.distributed.optim.ZeroRedundancyOptimizer(Adam) (or plain Adam with
--plain). Rank 0 prints one JSON line with the largest rank's optimizer
state bytes and peak RSS, and the median step time after a warm-up step.
"""
import argparse
import gc
import json
import resource
import time

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=5000)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--plain", action="store_true")
    a = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(1)
    net = torch.nn.Sequential(*[torch.nn.Linear(a.width, a.width)
                                for _ in range(a.layers)])
    ddp = DDP(net)
    if a.plain:
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-4)
    else:
        opt = ZeroRedundancyOptimizer(ddp.parameters(),
                                      optimizer_class=torch.optim.Adam,
                                      lr=1e-4)
    x = torch.randn(a.batch, a.width)
    times = []
    for s in range(a.steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        opt.step()
        if s > 0:
            times.append(time.perf_counter() - t0)
    inner = opt if a.plain else opt.optim
    state = sum(v.nbytes for st in inner.state.values() for v in st.values()
                if torch.is_tensor(v))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    times.sort()
    figures = torch.tensor([float(state), rss, times[len(times) // 2]],
                           dtype=torch.float64)
    dist.all_reduce(figures, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        print(json.dumps({
            "impl": "torch-ddp" if a.plain else "torch-zero",
            "np": dist.get_world_size(),
            "params": sum(q.numel() for q in net.parameters()),
            "state_bytes_per_rank": figures[0].item(),
            "peak_rss_mb": figures[1].item(),
            "step_s": figures[2].item()}), flush=True)
    # DDP's reducer holds the process group and is destroyed with the GIL
    # held: were its reference the last, ProcessGroupGloo's destructor
    # would wait, GIL held, on a worker thread that needs the GIL to free
    # a finished work's tensors (the job hung at exit). Release it first,
    # so that the group goes in destroy_process_group(), which releases
    # the GIL.
    del opt, inner, ddp
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
