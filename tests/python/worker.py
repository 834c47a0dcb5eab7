"""Runs on every rank (under ronderun or torchrun): one scenario per
invocation, results saved for the test to check.

    worker.py SCENARIO OUT_DIR [key=value ...]
"""
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import ronde.torch as rt  # noqa: E402
from common import STEPS, batch, loss_fn, make_model, make_optimizer  # noqa: E402
from worker_zero import torch_zero, zero  # noqa: E402


# The process sets handed to rt.init().
INIT_SETS = []


def save(out, name, obj):
    torch.save(obj, os.path.join(out, f"{name}.rank{rt.rank()}.pt"))


class PlainHook(rt.CommHook):
    """A communication hook written in Python: the engine's all-reduce."""

    def name(self):
        return "plain_python"

    def reduce(self, bucket):
        b = bucket.buffer
        self.count(b.numel() * b.element_size())
        rt.allreduce_(b, op=bucket.op, name=bucket.name,
                      prescale_factor=bucket.prescale_factor,
                      postscale_factor=bucket.postscale_factor,
                      process_set=bucket.process_set)


def plain_function_hook(bucket):
    rt.allreduce_(bucket.buffer, op=bucket.op, name=bucket.name,
                  prescale_factor=bucket.prescale_factor,
                  postscale_factor=bucket.postscale_factor,
                  process_set=bucket.process_set)


def comm_hook_of(name):
    return {"none": None, "class": PlainHook(),
            "callable": plain_function_hook,
            # Never past start_iter here: plain training.
            "powersgd_late": rt.powersgd_hook(rank=2, start_iter=1000),
            "powersgd": rt.powersgd_hook(rank=1, start_iter=1)}[name]


def train(out, optimizer="sgd", k="1", lr="0.05", compression="none",
          lr_scaling="none", zero="none", amp="", inf_step="-1",
          bucket_view="1", fusion="0", rebuild="1", autotune="0",
          hook="none"):
    k, lr, inf_step = int(k), float(lr), int(inf_step)
    model = make_model()
    if rt.rank() == 1:
        with torch.no_grad():  # broadcast_parameters must undo this
            for p in model.parameters():
                p.add_(1.0)
    rt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = make_optimizer(optimizer, model.parameters(), lr)
    opt = rt.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(),
        backward_passes_per_step=k, compression=compression,
        lr_scaling=lr_scaling, gradient_as_bucket_view=bucket_view == "1",
        fusion_threshold_mb=float(fusion) or 0.0,
        first_bucket_mb=0.001 if fusion != "0" else 1.0,
        rebuild_buckets=rebuild == "1", autotune=autotune == "1",
        comm_hook=comm_hook_of(hook))
    rt.broadcast_optimizer_state(opt, root_rank=0)
    scaler = None
    if amp == "torch":
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    elif amp == "ronde":
        scaler = rt.GradScaler("cpu", init_scale=1024.0)
    skipped = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=(zero == "none"))
        for micro in range(k):
            x, y = batch(step, micro, rt.rank(), rt.size(), k)
            # No division by k: average_aggregated_gradients does it.
            loss = loss_fn(model, x, y)
            if step == inf_step and rt.rank() == 1:
                loss = loss * float("inf")
            (scaler.scale(loss) if scaler else loss).backward()
        if amp == "torch":  # the documented torch.amp.GradScaler recipe
            opt.synchronize()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
            with opt.skip_synchronize():
                scaler.step(opt)
            scaler.update()
        elif amp == "ronde":
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        if scaler:
            skipped.append(scaler.get_scale())
    save(out, "params", {n: p.detach().clone()
                         for n, p in model.named_parameters()})
    save(out, "info", {"buckets": opt.buckets(), "scales": skipped,
                       "lr": [g["lr"] for g in opt.param_groups],
                       "hooks": opt.last_step_profile().hooks,
                       "sizing": list(opt.bucket_sizing()),
                       "saved_sizing": opt.state_dict()["ronde_bucket_sizing"]})


def collectives(out):
    r, n = rt.rank(), rt.size()
    res = {"rank": r, "size": n, "local_rank": rt.local_rank(),
           "host_backend": rt.host_backend()}
    t = torch.full((3,), float(r + 1))
    res["allreduce"] = rt.allreduce(t)
    res["allreduce_sum"] = rt.allreduce(t, op=rt.Sum)
    res["allreduce_max"] = rt.allreduce(t, op=rt.Max, name="max")
    u = t.clone()
    rt.allreduce_(u, op=rt.Sum)
    res["allreduce_"] = u
    hs = [rt.allreduce_async(torch.full((2,), float(r + i)), name=f"a{i}")
          for i in range(4)]
    res["async"] = [rt.synchronize(h) for h in hs]
    v = torch.full((2,), float(r))
    h = rt.allreduce_async_(v, op=rt.Sum)
    h.wait()
    res["async_"] = v
    res["poll"] = rt.poll(h)
    res["allgather"] = rt.allgather(torch.full((r + 1, 2), float(r)))
    res["allgather_async"] = rt.allgather_async(torch.tensor([r])).result()
    b = torch.full((2,), float(r))
    rt.broadcast_(b, 1)
    res["broadcast_"] = b
    res["broadcast"] = rt.broadcast(torch.tensor([r * 10.0]), 0)
    res["alltoall"] = rt.alltoall(torch.arange(n * 2.0) + 100 * r)
    ha = rt.alltoall_async(torch.arange(float(n)) + 100 * r,
                           splits=[1] * n)
    res["alltoall_async"] = ha.result()
    res["received_splits"] = ha.received_splits()
    res["reducescatter"] = rt.reducescatter(
        torch.arange(n * 2.0) + r, op=rt.Sum)
    # The same into tensors the caller keeps: each call returns its `out`.
    outs = {"allgather": torch.full((n * (n + 1) // 2, 2), -1.0),
            "alltoall": torch.full((n * 2,), -1.0),
            "reducescatter": torch.full((2,), -1.0)}
    res["into_same"] = [
        rt.allgather(torch.full((r + 1, 2), float(r)),
                     out=outs["allgather"]) is outs["allgather"],
        rt.alltoall(torch.arange(n * 2.0) + 100 * r,
                    out=outs["alltoall"]) is outs["alltoall"],
        rt.reducescatter(torch.arange(n * 2.0) + r, op=rt.Sum,
                         out=outs["reducescatter"]) is outs["reducescatter"]]
    res["into"] = outs
    hr = rt.reducescatter_async(torch.arange(n * 2.0) + r, op=rt.Sum,
                                out=torch.zeros(2))
    res["into_async"] = rt.synchronize(hr)
    try:
        rt.allgather(torch.ones(1, 2), out=torch.zeros(n + 1, 2))
        res["into_error"] = None
    except RuntimeError as e:
        res["into_error"] = str(e)
    rt.barrier()
    rt.barrier_async().wait()
    save(out, "collectives", res)


def errors(out):
    res = {}
    # Collective mismatch: rank-dependent shapes.
    try:
        rt.allreduce(torch.zeros(2 + rt.rank()), name="mismatched")
        res["collective"] = None
    except RuntimeError as e:
        res["collective"] = (type(e).__name__, str(e))
    # Parameter mismatch in DistributedOptimizer.
    model = torch.nn.Linear(3 + rt.rank(), 2)
    try:
        rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                named_parameters=model.named_parameters())
        res["optimizer"] = None
    except RuntimeError as e:
        res["optimizer"] = (type(e).__name__, str(e))
    # Local mistakes, raised by C++'s TORCH_CHECK.
    other = torch.nn.Linear(2, 2)
    try:
        rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                named_parameters=other.named_parameters())
        res["unnamed"] = None
    except ValueError as e:  # Horovod's type for it
        res["unnamed"] = (type(e).__name__, str(e))
    try:
        rt.DistributedOptimizer(torch.optim.SGD(other.parameters(), lr=0.1),
                                named_parameters=other.named_parameters(),
                                backward_passes_per_step=0)
        res["passes"] = None
    except RuntimeError as e:
        res["passes"] = (type(e).__name__, str(e))
    # backward_passes_per_step: a step after the wrong count of passes.
    opt = rt.DistributedOptimizer(torch.optim.SGD(other.parameters(), lr=0.1),
                                  named_parameters=other.named_parameters(),
                                  backward_passes_per_step=2)
    other(torch.ones(1, 2)).sum().backward()
    try:
        opt.step()
        res["count"] = None
    except RuntimeError as e:
        res["count"] = (type(e).__name__, str(e))
    save(out, "errors", res)


def peer_dies(out):
    """Rank 1 exits without a word; rank 0's collective must raise
    CommError (a RuntimeError) instead of hanging."""
    if rt.rank() == 1:
        os._exit(0)
    try:
        for _ in range(3):
            rt.allreduce(torch.ones(4), name="after_peer_death")
        res = None
    except rt.CommError as e:
        res = {"type": type(e).__name__, "is_runtime": isinstance(e, RuntimeError),
               "kind": e.kind, "operation": e.operation, "msg": str(e)}
    save(out, "peer", res)
    os._exit(0)


def process_sets(out):
    """4 ranks: the set {0, 1} made at init(), {2, 3} added; every
    collective on each half, then each half training the model."""
    r = rt.rank()
    low = INIT_SETS[0]
    high = rt.add_process_set([2, 3])
    mine, other = (low, high) if r < 2 else (high, low)
    res = {"ids": (low.id, high.id), "included": mine.included(),
           "other_included": other.included(), "set_rank": mine.rank(),
           "set_size": mine.size(), "ranks": mine.ranks, "repr": repr(mine),
           "global": rt.global_process_set().is_global(),
           "sets": len(rt.process_sets())}
    t = torch.full((3,), float(r + 1))
    res["allreduce"] = rt.allreduce(t, op=rt.Sum, process_set=mine)
    res["allgather"] = rt.allgather(torch.tensor([r]), process_set=mine)
    # Roots are global ranks, as in Horovod: the set's second member.
    res["broadcast"] = rt.broadcast(torch.tensor([float(r)]), mine.ranks[1],
                                    process_set=mine)
    res["alltoall"] = rt.alltoall(torch.arange(2.0) + 10 * r,
                                  process_set=mine)
    res["reducescatter"] = rt.reducescatter(torch.arange(2.0) + r, op=rt.Sum,
                                            process_set=mine)
    h = rt.allreduce_async(torch.ones(2), op=rt.Sum, process_set=mine)
    rt.barrier()
    res["async"] = h.result()
    rt.barrier(process_set=mine)
    res["object"] = rt.broadcast_object({"from": r},
                                        root_rank=mine.ranks[1],
                                        process_set=mine)
    try:
        rt.allreduce(t, process_set=other)
        res["outside"] = None
    except RuntimeError as e:
        res["outside"] = str(e)
    model = make_model()
    if mine.rank() == 1:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    rt.broadcast_parameters(model.state_dict(), root_rank=mine.ranks[0],
                            process_set=mine)
    opt = rt.DistributedOptimizer(
        make_optimizer("sgd", model.parameters(), 0.05),
        named_parameters=model.named_parameters(), process_set=mine)
    rt.broadcast_optimizer_state(opt, root_rank=mine.ranks[0],
                                 process_set=mine)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step, 0, mine.rank(), mine.size(), 1)
        loss_fn(model, x, y).backward()
        opt.step()
    save(out, "params", {n: p.detach().clone()
                         for n, p in model.named_parameters()})
    rt.remove_process_set(high)
    res["sets_after"] = len(rt.process_sets())
    save(out, "sets", res)


def uneven(out, divide="contrib"):
    """Rank 0 has 5 steps of data, rank 1 has 3; both run them inside
    rt.Join(); the last to join broadcasts its parameters."""
    steps = 5 if rt.rank() == 0 else 3
    model = make_model()
    opt = rt.DistributedOptimizer(
        make_optimizer("sgd", model.parameters(), 0.05),
        named_parameters=model.named_parameters(),
        divide_by_set_size=divide == "size")
    sums = []
    with rt.Join(opt) as j:
        for step in range(steps):
            opt.zero_grad()
            x, y = batch(step, 0, rt.rank(), rt.size(), 1)
            loss = loss_fn(model, x, y)
            sums.append(rt.allreduce(loss.detach(), op=rt.Sum).item())
            loss.backward()
            opt.step()
    rt.broadcast_parameters(model.state_dict(), root_rank=j.last_rank)
    save(out, "params", {n: p.detach().clone()
                         for n, p in model.named_parameters()})
    save(out, "uneven", {"last": j.last_rank, "sums": sums})


def sync_bn_data(step, size, offset=0):
    """Step `step` of the SyncBatchNorm check: every rank's rows of the
    global batch (8 each; the last step ragged), and the weights of the
    loss sum(y * g). `offset` gives each process set data of its own."""
    sizes = [8] * size if step < 2 else [8, 5, 3, 8][:size]
    g = torch.Generator().manual_seed(500 + step + offset)
    x = torch.randn(sum(sizes), 3, 4, 4, generator=g) * 2 + 0.5
    w = torch.randn(sum(sizes), 3, 4, 4, generator=g)
    return sizes, x, w


def make_sync_bn_params():
    g = torch.Generator().manual_seed(7)
    return torch.rand(3, generator=g) + 0.5, torch.randn(3, generator=g)


def sync_bn_steps(bn, steps, size, offset=0, rank=None):
    """The SyncBatchNorm check's training steps through `bn`, on rank
    `rank`'s rows, or on every rank's rows (rank None: the single-process
    reference): each step's output, input gradient and weight and bias
    gradients."""
    got = []
    for step in range(steps):
        sizes, x, w = sync_bn_data(step, size, offset)
        lo, n = ((0, sum(sizes)) if rank is None
                 else (sum(sizes[:rank]), sizes[rank]))
        mine = x[lo:lo + n].clone().requires_grad_()
        y = bn(mine)
        (y * w[lo:lo + n]).sum().backward()
        got.append({"sizes": sizes, "y": y.detach(), "dx": mine.grad,
                    "dweight": bn.weight.grad.clone(),
                    "dbias": bn.bias.grad.clone()})
        bn.weight.grad = None
        bn.bias.grad = None
    return got


def sync_bn(out, steps="3", sets="0"):
    """With sets=1 (4 ranks): ranks 0, 1 and ranks 2, 3 each normalise over
    their own set's rows only."""
    ps = None
    if sets == "1":
        pair = [rt.add_process_set([0, 1]), rt.add_process_set([2, 3])]
        ps = pair[rt.rank() // 2]
    bn = rt.SyncBatchNorm(3, momentum=0.2, process_set=ps)
    weight, bias = make_sync_bn_params()
    with torch.no_grad():
        bn.weight.copy_(weight)
        bn.bias.copy_(bias)
    r = rt.rank() if ps is None else ps.rank()
    size = rt.size() if ps is None else ps.size()
    offset = 0 if ps is None else 100 * (rt.rank() // 2)
    got = sync_bn_steps(bn, int(steps), size, offset, rank=r)
    bn.eval()
    _, x, _ = sync_bn_data(9, size)
    y_eval = bn(x[:4])
    if r == 0:
        # Eval mode does not communicate: rank 0 alone runs it again (a
        # collective here would wait for rank 1 until the timeout).
        bn(x[4:8])
    result = {"steps": got, "eval": y_eval.detach(),
              "running_mean": bn.running_mean.clone(),
              "running_var": bn.running_var.clone(),
              "tracked": int(bn.num_batches_tracked)}
    # Under autocast (a bfloat16 convolution in front) the statistics are
    # float32 and the output keeps the input's dtype.
    bn.train()
    conv = torch.nn.Conv2d(3, 3, 1)
    with torch.no_grad():
        conv.weight.copy_(torch.eye(3).view(3, 3, 1, 1))
        conv.bias.zero_()
    _, x, _ = sync_bn_data(0, size)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        result["amp"] = bn(conv(x[8 * r:8 * r + 8])).detach()
    save(out, "sync_bn", result)


def horovod_api(out):
    """A Horovod script with only its import line changed: the worker's
    own `rt` is not used here."""
    import warnings

    import ronde.torch as hvd

    r = hvd.rank()
    model = make_model()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = make_optimizer("sgd", model.parameters(), 0.05)
    opt = hvd.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(),
        compression=hvd.Compression.none, backward_passes_per_step=1)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step, 0, r, hvd.size(), 1)
        loss_fn(model, x, y).backward()
        opt.step()
    res = {"params": {n: p.detach().clone()
                      for n, p in model.named_parameters()}}
    t = torch.tensor([r + 1.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res["average_true"] = hvd.allreduce(t, average=True)
        res["average_false"] = hvd.allreduce(t, average=False, name="sum")
    res["deprecation"] = [str(w.category.__name__) for w in caught]
    res["op_sum"] = hvd.allreduce(t, op=hvd.Sum)
    res["op_max"] = hvd.allreduce(t, name=None, op=hvd.Max)
    res["fp16"] = hvd.allreduce(torch.tensor([r + 0.25]),
                                compression=hvd.Compression.fp16, op=hvd.Sum)
    try:
        hvd.allreduce(t, average=True, op=hvd.Sum)
        res["both"] = "accepted"
    except ValueError as e:
        res["both"] = str(e)
    res["allgather"] = hvd.allgather(torch.tensor([[float(r)]] * (r + 1)),
                                     name=None)
    res["broadcast"] = hvd.broadcast(torch.tensor([float(r)]), root_rank=1,
                                     name=None)
    res["broadcast_object"] = hvd.broadcast_object({"from": r}, root_rank=1)
    res["allgather_object"] = hvd.allgather_object(("rank", r, [r] * r))
    res["alltoall"], res["alltoall_received"] = hvd.alltoall(
        torch.arange(4.0) + 10 * r, splits=torch.tensor([1, 3]))
    res["alltoall_list"], res["alltoall_list_received"] = hvd.alltoall(
        torch.arange(4.0) + 10 * r, splits=[2, 2])
    grouped = [torch.full((2,), r + 1.0), torch.full((3,), r + 2.0,
               dtype=torch.float64), torch.full((1,), r + 3.0)]
    res["grouped"] = hvd.grouped_allreduce(grouped, op=hvd.Sum)
    res["grouped_inputs"] = [g.clone() for g in grouped]
    hvd.grouped_allreduce_(grouped)
    res["grouped_"] = grouped
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1),
                              torch.nn.BatchNorm2d(3), torch.nn.ReLU())
    with torch.no_grad():
        net[1].running_mean.fill_(0.5)
    net = hvd.SyncBatchNorm.convert_sync_batchnorm(net)
    res["converted"] = type(net[1]).__name__
    res["converted_running_mean"] = net[1].running_mean.clone()
    y = net(torch.randn(4, 3, 2, 2, generator=torch.Generator().manual_seed(r)))
    res["sync_bn_out_shape"] = tuple(y.shape)
    res["caps"] = (hvd.mpi_threads_supported(), hvd.mpi_enabled(),
                   hvd.gloo_enabled(), hvd.nccl_built())
    save(out, "horovod_api", res)


def profile(out):
    """Trains under torch.profiler and saves the trace: ronde's ranges must
    be in it beside the model's ops."""
    model = make_model()
    rt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = rt.DistributedOptimizer(
        make_optimizer("sgd", model.parameters(), 0.05),
        named_parameters=model.named_parameters(), fusion_threshold_mb=0.0005,
        first_bucket_mb=0.0005)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        for step in range(STEPS):
            opt.zero_grad()
            with torch.profiler.record_function("load batch"):
                x, y = batch(step, 0, rt.rank(), rt.size(), 1)
            loss_fn(model, x, y).backward()
            opt.step()
    prof.export_chrome_trace(os.path.join(out, f"trace.{rt.rank()}.json"))
    save(out, "profile", sorted({e.key for e in prof.key_averages()}))


ELASTIC_SAMPLES, ELASTIC_EPOCHS, ELASTIC_LR = 24, 2, 0.02


def elastic_data():
    i = torch.arange(ELASTIC_SAMPLES, dtype=torch.float64).unsqueeze(1)
    j = torch.arange(4, dtype=torch.float64).unsqueeze(0)
    x = torch.sin(0.37 * i + 1.3 * j).float()
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.cos(i).float()
    return x, y


def elastic_horovod(out, kill_rank="2", kill_step="5", step_sleep="0"):
    """A Horovod elastic script (TorchState, ElasticSampler, commit, reset
    callbacks), written against ``hvd = ronde.torch``: launch rank
    `kill_rank` dies of SIGKILL at global step `kill_step`. It commits when
    the job has read a multiple of 6 samples, so that what is left divides
    by 2 and 3 ranks. A process started to join runs the same."""
    import signal
    import time
    hvd = rt
    launch_rank = -1 if rt._C._joining() else hvd.rank()
    x, y = elastic_data()
    dataset = torch.utils.data.TensorDataset(x, y)
    model = torch.nn.Linear(4, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
        model.bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=ELASTIC_LR)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   lr_scaling="linear")
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0,
                                   step=0,
                                   seen=torch.zeros(ELASTIC_EPOCHS,
                                                    ELASTIC_SAMPLES))
    eras = [(0, hvd.size())]
    state.register_reset_callbacks(
        [lambda: eras.append((state.step, hvd.size()))])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, ELASTIC_EPOCHS):
            loader = torch.utils.data.DataLoader(dataset, batch_size=1,
                                                 sampler=state.sampler)
            for batch_idx, (xb, yb) in enumerate(loader):
                if launch_rank == int(kill_rank) and state.step == int(kill_step):
                    os.kill(os.getpid(), signal.SIGKILL)
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(xb), yb).backward()
                opt.step()
                used = torch.zeros(ELASTIC_SAMPLES)
                used[state.sampler.get_indices(batch_idx, 1)] = 1
                state.seen[state.epoch] += hvd.allreduce(used, op=hvd.Sum)
                state.sampler.record_batch(batch_idx, 1)
                state.step += 1
                time.sleep(float(step_sleep))
                if state.sampler.consumed() % 6 == 0:
                    state.commit()
            state.sampler.set_epoch(state.epoch + 1)

    train(state)
    save(out, "elastic", {
        "params": torch.cat([model.weight.flatten(), model.bias]).detach(),
        "eras": eras, "seen": state.seen, "size": hvd.size(),
        "lr": opt.param_groups[0]["lr"]})


def elastic_doc_loop(out, samples="92", batch="5", every="2",
                     kills="2:4:3,1:3:4"):
    """The loop of ronde.torch.elastic's docstring, as written there: the
    batch number goes on from the restored ``state.batch``
    (``enumerate(loader, state.batch)``) and is passed to ``record_batch``.
    `kills` lists ``launch_rank:world_size:batch``: that rank dies of
    SIGKILL at the start of that batch while the world has that size. Every
    trained sample is counted in the state (``seen``, summed over the ranks
    each batch), so a roll-back to the last commit drops the counts of the
    batches it undoes."""
    import signal
    hvd = rt
    n, batch_size, every = int(samples), int(batch), int(every)
    kills = {tuple(int(v) for v in k.split(":")) for k in kills.split(",")}
    launch_rank = hvd.rank()
    torch.manual_seed(0)
    dataset = torch.utils.data.TensorDataset(
        torch.arange(n), torch.randn(n, 2), torch.randn(n, 1))
    model = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01),
        named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size,
                                         sampler=sampler)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0,
                                   batch=0, seen=torch.zeros(n))
    eras = [(0, hvd.size())]
    state.register_reset_callbacks(
        [lambda: eras.append((state.batch, hvd.size()))])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, 1):
            for state.batch, (idx, x, y) in enumerate(loader, state.batch):
                if (launch_rank, hvd.size(), state.batch) in kills:
                    os.kill(os.getpid(), signal.SIGKILL)
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                used = torch.zeros(n)
                used.index_add_(0, idx, torch.ones(len(idx)))
                state.seen += hvd.allreduce(used, op=hvd.Sum)
                state.sampler.record_batch(state.batch, batch_size)
                if state.batch % every == 0:
                    state.commit()
            state.batch = 0
            state.sampler.set_epoch(state.epoch + 1)

    train(state)
    save(out, "elastic_doc", {"seen": state.seen, "eras": eras,
                              "size": hvd.size()})


def main():
    scenario, out = sys.argv[1], sys.argv[2]
    kwargs = dict(a.split("=", 1) for a in sys.argv[3:])
    if scenario == "process_sets":
        INIT_SETS.append(rt.ProcessSet([1, 0]))
    rt.init(process_sets=INIT_SETS)
    try:
        {"train": train, "collectives": collectives, "errors": errors,
         "peer_dies": peer_dies, "process_sets": process_sets,
         "uneven": uneven, "sync_bn": sync_bn,
         "horovod_api": horovod_api, "profile": profile,
         "elastic_horovod": elastic_horovod,
         "elastic_doc_loop": elastic_doc_loop, "zero": zero,
         "torch_zero": torch_zero}[scenario](
             out, **kwargs)
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    rt.shutdown()


if __name__ == "__main__":
    main()
