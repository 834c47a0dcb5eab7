"""The train_bench workloads in PyTorch with DistributedDataParallel (gloo):
the baseline for ronde's DistributedOptimizer. --backend ronde runs the
same DDP on ronde's torch.distributed backend; --zero wraps the SGD in
torch's ZeroRedundancyOptimizer. Launched by ronderun (reads RONDE_* variables) or torchrun."""
import argparse
import gc
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def make_workload(name):
    """The model, batch size and one batch (x, y) of a workload: what the
    Python training benchmarks (py_train_bench.py, join_bench.py) share."""
    if name == "mlp":
        model, batch = make_mlp(), 64
        x, y = torch.randn(batch, 1024), torch.randint(0, 1000, (batch,))
    else:
        model, batch = ResNet18(), 32
        x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    return model, batch, x, y


class StepClock:
    """Each timed step's wall time and CPU time: this (the training)
    thread's, and every other thread's of the process (the communication
    threads), as train_bench measures them."""

    def __init__(self):
        self.wall, self.main_cpu, self.other_cpu = [], [], []

    def start(self):
        self._at = (time.perf_counter(), time.thread_time(),
                    time.process_time())

    def stop(self):
        wall, main, process = self._at
        main = time.thread_time() - main
        self.wall.append(time.perf_counter() - wall)
        self.main_cpu.append(main)
        self.other_cpu.append(time.process_time() - process - main)

    def cpu(self):
        """Median CPU seconds per step: training thread, other threads."""
        return [statistics.median(self.main_cpu),
                statistics.median(self.other_cpu)]


def make_mlp():
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(),
                         nn.Linear(4096, 4096), nn.ReLU(),
                         nn.Linear(4096, 4096), nn.ReLU(),
                         nn.Linear(4096, 1000))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.shortcut(x) if self.shortcut is not None else x))


class ResNet18(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(64)
        blocks, cin = [], 64
        for i, planes in enumerate([64, 128, 256, 512]):
            for b in range(2):
                blocks.append(BasicBlock(cin, planes, 2 if b == 0 and i > 0 else 1))
                cin = planes
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, 10)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workload", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--compression", default="none",
                   help="DDP's communication hook: fp16 or bf16 "
                        "(fp16_compress_hook, bf16_compress_hook: the peers of "
                        "ronde's wire compression) or powersgdR (powerSGD_hook "
                        "at rank R from the third step, ronde's PowerSGD peer)")
    p.add_argument("--backend", choices=["gloo", "ronde"], default="gloo")
    p.add_argument("--zero", action="store_true",
                   help="torch's ZeroRedundancyOptimizer around the SGD")
    p.add_argument("--json")
    a = p.parse_args()
    if a.backend == "ronde":
        import ronde.torch  # noqa: F401  (registers the backend)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank = int(os.environ.get("RONDE_RANK") or os.environ["RANK"])
    size = int(os.environ.get("RONDE_SIZE") or os.environ["WORLD_SIZE"])
    addr = os.environ.get("RONDE_RENDEZVOUS_ADDR") or os.environ["MASTER_ADDR"]
    port = int(os.environ.get("RONDE_RENDEZVOUS_PORT") or os.environ["MASTER_PORT"])
    dist.init_process_group(a.backend, init_method=f"tcp://{addr}:{port}",
                            rank=rank, world_size=size)
    model, batch, x, y = make_workload(a.workload)
    # Buffers are not re-broadcast every step: ronde does not do it either.
    powersgd = a.compression.startswith("powersgd")
    ddp_args = {}
    if powersgd:
        # powerSGD_hook issues its second and third collectives from future
        # callbacks, which gloo runs on its own threads: with several buckets
        # the ranks issue them in different orders and hang (rank 0 waiting
        # in compute_qs while rank 1 is in two buckets' P all-reduces). One
        # bucket for the whole model is the order-safe way on gloo.
        ddp_args["bucket_cap_mb"] = 4096
    try:
        ddp = nn.parallel.DistributedDataParallel(
            model, forward_sync_buffers=False, **ddp_args)
    except TypeError:  # releases before forward_sync_buffers
        ddp = nn.parallel.DistributedDataParallel(
            model, broadcast_buffers=False, **ddp_args)
    if powersgd:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=int(a.compression[len("powersgd"):]),
            start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif a.compression in ("fp16", "bf16"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        hook = {"fp16": default_hooks.fp16_compress_hook,
                "bf16": default_hooks.bf16_compress_hook}[a.compression]
        ddp.register_comm_hook(None, hook)
    elif a.compression != "none":
        raise SystemExit(f"--compression {a.compression}: none, fp16, bf16 "
                         "or powersgdR")
    if a.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.SGD,
                                      lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    clock = StepClock()
    for s in range(a.warmup + a.steps):
        clock.start()
        opt.zero_grad(set_to_none=False)  # as train_bench: gradients stay allocated
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        if s >= a.warmup:
            clock.stop()
    step = torch.tensor([statistics.median(clock.wall)], dtype=torch.float64)
    dist.all_reduce(step, op=dist.ReduceOp.MAX)
    step = step.item()
    # CPU: the mean over the ranks (Gloo's threads are the other ones).
    cpu = torch.tensor(clock.cpu(), dtype=torch.float64)
    dist.all_reduce(cpu)
    main_cpu, other_cpu = (cpu / size).tolist()
    if rank == 0:
        print(f"{a.workload} ddp ({a.compression}, {a.backend}"
              f"{', zero' if a.zero else ''}): {size} rank(s), median step {step * 1e3:.1f} ms, "
              f"{size * batch / step:.1f} samples/s")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"workload": a.workload, "mode": "ddp",
                           "backend": a.backend, "zero": a.zero,
                           "compression": a.compression, "ranks": size,
                           "batch_per_rank": batch, "step_s": step,
                           "samples_per_s": size * batch / step,
                           "main_cpu_s": main_cpu, "other_cpu_s": other_cpu,
                           "steps": a.steps}, f)
    # As in torch_zero_bench.py: DDP's reducer must not hold the last
    # reference to the process group, or the group is destroyed at exit
    # with the GIL held, where torch's gloo can hang.
    del opt, ddp, model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
