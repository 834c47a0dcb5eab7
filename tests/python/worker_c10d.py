"""torch.distributed on backend="ronde": the scenarios of test_c10d.py,
launched by torchrun (or ronderun) as `worker_c10d.py SCENARIO OUT k=v...`.
Each rank checks its own results against a local reference and saves
what the test compares across backends."""
import datetime
import os
import sys
import time
import traceback
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn

import ronde.torch as rt

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
DTYPES = FLOATS + (torch.int32, torch.int64, torch.int8, torch.uint8)


def save(out, name, obj):
    torch.save(obj, os.path.join(out, f"{name}.rank{dist.get_rank()}.pt"))


def val(k, dt, m=6, small=False):
    """Rank k's input: small values, exact in every type (products too)."""
    base = (torch.arange(m) % 2 + 1) if small else (torch.arange(m) % 3 + k + 1)
    return base.to(dt)


class Checker:
    def __init__(self):
        self.failures = []

    def eq(self, what, got, want):
        if got.dtype != want.dtype or not torch.equal(got, want):
            self.failures.append(f"{what}: got {got.tolist()} want {want.tolist()}")

    def done(self):
        if self.failures:
            raise AssertionError(
                f"rank {dist.get_rank()}: {len(self.failures)} wrong:\n"
                + "\n".join(self.failures[:20]))


def wait(work, async_op):
    if async_op:
        work.wait()


def check_ops(c, group, ranks, async_op):
    """Every operation and dtype on `group` (whose members are the global
    `ranks`), against what the members' inputs give."""
    n = len(ranks)
    me = dist.get_rank(group)
    a = async_op
    for dt in DTYPES:
        tag = f"{dt} async={a} n={n}"
        xs = [val(k, dt) for k in range(n)]
        for op, fold in ((dist.ReduceOp.SUM, lambda v: sum(v[1:], v[0])),
                         (dist.ReduceOp.MIN, lambda v: torch.stack(v).min(0).values),
                         (dist.ReduceOp.MAX, lambda v: torch.stack(v).max(0).values)):
            t = xs[me].clone()
            wait(dist.all_reduce(t, op=op, group=group, async_op=a), a)
            c.eq(f"all_reduce {op} {tag}", t, fold(xs).to(dt))
        ps = [val(k, dt, small=True) for k in range(n)]
        t = ps[me].clone()
        wait(dist.all_reduce(t, op=dist.ReduceOp.PRODUCT, group=group, async_op=a), a)
        c.eq(f"all_reduce PRODUCT {tag}", t, torch.stack(ps).prod(0).to(dt))
        if dt in (torch.float32, torch.float64):
            t = xs[me].clone()
            wait(dist.all_reduce(t, op=dist.ReduceOp.AVG, group=group, async_op=a), a)
            c.eq(f"all_reduce AVG {tag}", t, (sum(xs[1:], xs[0]) / n).to(dt))
            t = xs[me].clone()
            op = dist._make_nccl_premul_sum(0.5)
            wait(dist.all_reduce(t, op=op, group=group, async_op=a), a)
            c.eq(f"all_reduce PREMUL_SUM {tag}", t, sum(x * 0.5 for x in xs).to(dt))
        root = n - 1
        t = xs[me].clone()
        wait(dist.broadcast(t, src=ranks[root], group=group, async_op=a), a)
        c.eq(f"broadcast {tag}", t, xs[root])
        t = xs[me].clone()
        wait(dist.reduce(t, dst=ranks[0], group=group, async_op=a), a)
        c.eq(f"reduce {tag}", t, sum(xs[1:], xs[0]) if me == 0 else xs[me])
        outs = [torch.zeros_like(xs[0]) for _ in range(n)]
        wait(dist.all_gather(outs, xs[me], group=group, async_op=a), a)
        c.eq(f"all_gather {tag}", torch.stack(outs), torch.stack(xs))
        big = torch.zeros(n * 6, dtype=dt)
        wait(dist.all_gather_into_tensor(big, xs[me], group=group, async_op=a), a)
        c.eq(f"all_gather_into_tensor {tag}", big, torch.cat(xs))
        groot = 1 % n
        outs = [torch.zeros_like(xs[0]) for _ in range(n)] if me == groot else None
        wait(dist.gather(xs[me], outs, dst=ranks[groot], group=group, async_op=a), a)
        if me == groot:
            c.eq(f"gather {tag}", torch.stack(outs), torch.stack(xs))
        chunks = [val(10 + k, dt) for k in range(n)]
        t = torch.zeros(6, dtype=dt)
        wait(dist.scatter(t, chunks if me == 0 else None, src=ranks[0],
                          group=group, async_op=a), a)
        c.eq(f"scatter {tag}", t, chunks[me])
        # Rank k contributes, for rank j, val(k + j).
        parts = [[val(k + j, dt) for j in range(n)] for k in range(n)]
        want = sum((parts[k][me] for k in range(1, n)), parts[0][me])
        t = torch.zeros(6, dtype=dt)
        wait(dist.reduce_scatter(t, parts[me], group=group, async_op=a), a)
        c.eq(f"reduce_scatter {tag}", t, want)
        t = torch.zeros(6, dtype=dt)
        wait(dist.reduce_scatter_tensor(t, torch.cat(parts[me]), group=group,
                                        async_op=a), a)
        c.eq(f"reduce_scatter_tensor {tag}", t, want)
        # all_to_all_single with splits: rank k sends j + 1 rows to rank j.
        rows = [torch.full((j + 1, 2), 10 * me + j).to(dt) for j in range(n)]
        send = torch.cat(rows)
        recv = torch.zeros((me + 1) * n, 2, dtype=dt)
        wait(dist.all_to_all_single(
            recv, send, output_split_sizes=[me + 1] * n,
            input_split_sizes=[j + 1 for j in range(n)], group=group,
            async_op=a), a)
        c.eq(f"all_to_all_single {tag}", recv, torch.cat(
            [torch.full((me + 1, 2), 10 * k + me).to(dt) for k in range(n)]))
        even = torch.cat([val(me + j, dt, m=2) for j in range(n)])
        got = torch.zeros_like(even)
        wait(dist.all_to_all_single(got, even, group=group, async_op=a), a)
        c.eq(f"all_to_all_single even {tag}", got,
             torch.cat([val(k + me, dt, m=2) for k in range(n)]))
        outs = [torch.zeros(6, dtype=dt) for _ in range(n)]
        wait(dist.all_to_all(outs, parts[me], group=group, async_op=a), a)
        c.eq(f"all_to_all {tag}", torch.stack(outs),
             torch.stack([parts[k][me] for k in range(n)]))
    wait(dist.barrier(group=group, async_op=a), a)


def check_more(c, n):
    """Futures, coalesced calls, point to point and the object helpers on
    the default group."""
    me = dist.get_rank()
    xs = [val(k, torch.float32) for k in range(n)]
    total = sum(xs[1:], xs[0])
    t = xs[me].clone()
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2).wait()
    c.eq("future.then", doubled, total * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pg = dist.distributed_c10d._get_default_group()
        one = [xs[me].clone(), (xs[me] * 2).clone()]
        pg.allreduce_coalesced(one).wait()
        c.eq("allreduce_coalesced 0", one[0], total)
        c.eq("allreduce_coalesced 1", one[1], total * 2)
        outs = [torch.zeros(6 * n), torch.zeros(3 * n)]
        pg.allgather_into_tensor_coalesced(outs, [xs[me], xs[me][:3] + 1]).wait()
        c.eq("allgather_into_tensor_coalesced 0", outs[0], torch.cat(xs))
        c.eq("allgather_into_tensor_coalesced 1", outs[1],
             torch.cat([x[:3] + 1 for x in xs]))
        # c10d's layout: lists[r][i] receives rank r's input i (inputs of
        # one size too, which a transposed layout would fill silently).
        for second in (lambda x: x[:3] + 1, lambda x: x * 10):
            lists = [[torch.zeros(6), torch.zeros_like(second(xs[0]))]
                     for _ in range(n)]
            dist.all_gather_coalesced(lists, [xs[me], second(xs[me])])
            for r in range(n):
                c.eq(f"all_gather_coalesced rank {r} input 0", lists[r][0], xs[r])
                c.eq(f"all_gather_coalesced rank {r} input 1", lists[r][1],
                     second(xs[r]))
        outs = [torch.zeros(2), torch.zeros(1)]
        ins = [torch.cat([xs[me][:2]] * n), torch.ones(n)]
        pg.reduce_scatter_tensor_coalesced(outs, ins).wait()
        c.eq("reduce_scatter_tensor_coalesced 0", outs[0],
             sum(x[:2] for x in xs))
        c.eq("reduce_scatter_tensor_coalesced 1", outs[1], torch.full((1,), float(n)))
    # bool, reduced as gloo reduces it: a logical or for SUM, MAX and BOR,
    # a logical and for PRODUCT, MIN and BAND.
    bits = [torch.tensor([k % 2 == 0, True, False, k == 0]) for k in range(n)]
    R = dist.ReduceOp
    for op, fold in ((R.SUM, any), (R.MAX, any), (R.BOR, any),
                     (R.PRODUCT, all), (R.MIN, all), (R.BAND, all)):
        for async_op in (False, True):
            t = bits[me].clone()
            wait(dist.all_reduce(t, op=op, async_op=async_op), async_op)
            want = torch.tensor([fold(b[i].item() for b in bits) for i in range(4)])
            c.eq(f"all_reduce bool {op} async={async_op}", t, want)
    # An output smaller than a rank's input is an error on every rank (it
    # was filled with the wrong elements), and the group goes on.
    try:
        dist.all_gather([torch.zeros(4) for _ in range(n)], xs[me])
        c.failures.append("all_gather into outputs of 4 for inputs of 6 passed")
    except RuntimeError as e:
        if "each output holds one rank's input" not in str(e):
            c.failures.append(f"all_gather into small outputs: {e}")
    # Past the check's frames: reduce_scatter_tensor into its output (the
    # in-place form too, the output inside the input) and
    # all_gather_into_tensor from the rank's own block of the output.
    k = 1 << 16
    base = torch.arange(n * k, dtype=torch.float32)
    scale = n * (n + 1) / 2
    out = torch.full((k,), -1.0)
    dist.reduce_scatter_tensor(out, base * (me + 1))
    c.eq("reduce_scatter_tensor large", out, base[me * k:(me + 1) * k] * scale)
    flat = base * (me + 1)
    dist.reduce_scatter_tensor(flat.narrow(0, me * k, k), flat)
    want = base * (me + 1)
    want[me * k:(me + 1) * k] = base[me * k:(me + 1) * k] * scale
    c.eq("reduce_scatter_tensor in place", flat, want)
    gathered = torch.zeros(n * k)
    gathered.narrow(0, me * k, k).copy_(base[:k] + me)
    dist.all_gather_into_tensor(gathered, gathered.narrow(0, me * k, k))
    c.eq("all_gather_into_tensor in place", gathered,
         torch.cat([base[:k] + r for r in range(n)]))
    # A ring: every rank sends first, then receives.
    nxt, prv = (me + 1) % n, (me - 1) % n
    got = torch.zeros(6)
    reqs = [dist.isend(xs[me] + 100, nxt), dist.irecv(got, prv)]
    for q in reqs:
        q.wait()
    c.eq("isend/irecv ring", got, xs[prv] + 100)
    got2 = torch.zeros(6)
    ops = [dist.P2POp(dist.isend, xs[me] * 3, prv),
           dist.P2POp(dist.irecv, got2, nxt)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    c.eq("batch_isend_irecv", got2, xs[nxt] * 3)
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": me})
    if objs != [{"rank": k} for k in range(n)]:
        c.failures.append(f"all_gather_object: {objs}")
    lst = [f"from {me}"] if me == 0 else [None]
    dist.broadcast_object_list(lst, src=0)
    if lst != ["from 0"]:
        c.failures.append(f"broadcast_object_list: {lst}")


def ops(out):
    dist.init_process_group("ronde", timeout=datetime.timedelta(seconds=60))
    n = dist.get_world_size()
    c = Checker()
    everyone = list(range(n))
    for async_op in (False, True):
        check_ops(c, None, everyone, async_op)
    check_more(c, n)
    # Two subgroups at once: their calls interleave, each in its own order.
    lo = [0, 1]
    hi = list(range(1, n)) if n > 2 else [0, 1]
    g_lo = dist.new_group(lo, backend="ronde")
    g_hi = dist.new_group(hi, backend="ronde")
    me = dist.get_rank()
    pending = []
    for g, members in ((g_lo, lo), (g_hi, hi)):
        if me in members:
            t = torch.full((4,), float(me))
            pending.append((dist.all_reduce(t, group=g, async_op=True), t,
                            float(sum(members)), members))
    for w, t, want, members in pending:
        w.wait()
        c.eq(f"subgroup {members} all_reduce", t, torch.full((4,), want))
    for g, members in ((g_lo, lo), (g_hi, hi)):
        if me in members:
            check_ops(c, g, members, async_op=True)
    assert isinstance(g_lo._get_backend(torch.device("cpu")) if me in lo else
                      None, (rt._C.C10dBackend, type(None)))
    # Sequence numbers, as gloo keeps them: one more per operation a member
    # starts on the group, the same on every member. (torch's ProcessGroup
    # asks only gloo's, NCCL's, XCCL's and UCC's backends for them; ours
    # answers where it is asked, as through the backend here.)
    if me in lo:
        backend = g_lo._get_backend(torch.device("cpu"))
        backend._set_sequence_number_for_group()
        seq = backend._get_sequence_number_for_group()
        dist.all_reduce(torch.ones(2), group=g_lo)
        dist.barrier(group=g_lo)
        got = backend._get_sequence_number_for_group()
        if got != seq + 2:
            c.failures.append(f"sequence number {seq} then {got}, not {seq + 2}")
        seqs = [None] * len(lo)
        dist.all_gather_object(seqs, got, group=g_lo)
        if seqs != [got] * len(lo):
            c.failures.append(f"sequence numbers differ between ranks: {seqs}")
    c.done()
    save(out, "ops_ok", True)
    dist.destroy_process_group()


class Net(nn.Module):
    """An MLP with a branch that some steps leave unused."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)
        self.spare = nn.Linear(16, 4)

    def forward(self, x, use_spare=True):
        h = torch.tanh(self.a(x))
        out = self.b(h)
        return out + self.spare(h) if use_spare else out


def global_batch(step):
    g = torch.Generator().manual_seed(500 + step)
    return torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)


def shard(x, rank, size):
    per = x.shape[0] // size
    return x[rank * per:(rank + 1) * per]


def train_ddp(config, pg, steps):
    """DDP on the group `pg` (None: the default group, ronde) in one of the
    configurations; returns its parameters."""
    from torch.distributed.algorithms.ddp_comm_hooks import (
        default_hooks, powerSGD_hook)
    from torch.nn.parallel import DistributedDataParallel as DDP
    me, n = dist.get_rank(), dist.get_world_size()
    kw = {"find_unused_parameters": config == "unused",
          "static_graph": config == "static"}
    model = DDP(Net(), process_group=pg, **kw)
    if config == "fp16_hook":
        model.register_comm_hook(pg, default_hooks.fp16_compress_hook)
    if config == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=pg, matrix_approximation_rank=1,
            start_powerSGD_iter=2, random_seed=7)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if config == "join":
        from torch.distributed.algorithms.join import Join
        with Join([model]):
            for step in range(steps + 2 * me):
                x, y = global_batch(step)
                opt.zero_grad()
                nn.functional.mse_loss(model(shard(x, me, n)), shard(y, me, n)).backward()
                opt.step()
        return [p.detach().clone() for p in model.parameters()]
    for step in range(steps):
        x, y = global_batch(step)
        x, y = shard(x, me, n), shard(y, me, n)
        opt.zero_grad()
        if config == "no_sync":
            half = x.shape[0] // 2
            with model.no_sync():
                (nn.functional.mse_loss(model(x[:half]), y[:half]) / 2).backward()
            (nn.functional.mse_loss(model(x[half:]), y[half:]) / 2).backward()
        else:
            spare = config != "unused" or step % 3 != 0
            nn.functional.mse_loss(model(x, use_spare=spare), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def reference_params(config, steps):
    """One process on the whole batches."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        x, y = global_batch(step)
        opt.zero_grad()
        spare = config != "unused" or step % 3 != 0
        nn.functional.mse_loss(model(x, use_spare=spare), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def train_zero(pg, steps):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    me, n = dist.get_rank(), dist.get_world_size()
    model = Net()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam,
                                  process_group=pg, lr=0.01)
    for step in range(steps):
        x, y = global_batch(step)
        opt.zero_grad()
        nn.functional.mse_loss(model(shard(x, me, n)), shard(y, me, n)).backward()
        for p in model.parameters():  # the gradients' average, as DDP gives
            dist.all_reduce(p.grad, group=pg)
            p.grad /= n
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def train_fsdp(pg, steps):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    me, n = dist.get_rank(), dist.get_world_size()
    model = Net()
    mesh = DeviceMesh.from_group(pg or dist.group.WORLD, "cpu")
    fully_shard(model.a, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        x, y = global_batch(step)
        opt.zero_grad()
        nn.functional.mse_loss(model(shard(x, me, n)), shard(y, me, n)).backward()
        opt.step()
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def ddp(out, steps="20", configs="plain,unused,static,no_sync,fp16_hook,powersgd,join"):
    """Each DDP configuration on ronde (the default group) and on gloo (a
    group of every rank), then ZeroRedundancyOptimizer and FSDP likewise."""
    steps = int(steps)
    dist.init_process_group("ronde", timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    got = {}
    for config in configs.split(","):
        got[config] = {"ronde": train_ddp(config, None, steps),
                       "gloo": train_ddp(config, gloo, steps)}
        if config in ("plain", "unused", "static", "no_sync"):
            got[config]["reference"] = reference_params(config, steps)
    got["zero"] = {"ronde": train_zero(None, steps), "gloo": train_zero(gloo, steps)}
    got["fsdp"] = {"ronde": train_fsdp(None, steps), "gloo": train_fsdp(gloo, steps)}
    save(out, "ddp", got)
    dist.destroy_process_group()


def errors(out):
    """A shape mismatch and a type mismatch fail on every rank with ronde's
    message, and the group goes on working."""
    dist.init_process_group("ronde", timeout=datetime.timedelta(seconds=30))
    me = dist.get_rank()
    seen = []
    for bad in (torch.ones(4 + me), torch.ones(4, dtype=torch.float64 if me else torch.float32)):
        try:
            dist.all_reduce(bad)
            seen.append("")
        except Exception as e:  # noqa: BLE001
            seen.append(str(e))
    try:
        dist.all_gather_into_tensor(torch.zeros(2 * (3 + me)), torch.ones(3 + me))
        seen.append("")
    except Exception as e:  # noqa: BLE001
        seen.append(str(e))
    t = torch.ones(3)
    dist.all_reduce(t)
    seen.append(t.tolist())
    # all_to_all_single whose rows arrive split otherwise than the output's
    # splits say, though as many in all: an error, the output untouched.
    got = torch.full((4,), -7.0)
    try:
        dist.all_to_all_single(got, torch.full((4,), float(me)),
                               output_split_sizes=[2, 2],
                               input_split_sizes=[1, 3] if me == 0 else [3, 1])
        seen.append("")
    except Exception as e:  # noqa: BLE001
        seen.append(str(e))
    seen.append(got.tolist())
    save(out, "errors", seen)
    dist.destroy_process_group()


def peer_dies(out, timeout="8"):
    """The last rank dies after a first collective; the others' next one
    fails within the timeout, naming it."""
    dist.init_process_group(
        "ronde", timeout=datetime.timedelta(seconds=float(timeout)))
    me, n = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(torch.ones(2))
    if me == n - 1:
        os._exit(0)
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(2))
        msg = ""
    except Exception as e:  # noqa: BLE001
        msg = str(e)
    save(out, "peer_dies", {"message": msg, "seconds": time.monotonic() - start})
    sys.stdout.flush()
    os._exit(0)


def p2p_tags(out):
    """Rank 0 isends tagged messages (in the header and past it) that rank 1
    irecvs in another order, on ronde and on gloo: each receive gets its
    tag's message, one tag's messages in the order sent. Then a receive
    whose tensor is smaller than its message fails, and the next message
    of that tag still arrives."""
    dist.init_process_group("ronde", timeout=datetime.timedelta(seconds=30))
    me = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    sent = [(1, 4, 1.0), (2, 4, 2.0), (3, 1000, 3.0), (4, 1000, 4.0),
            (5, 4, 5.0), (5, 4, 6.0)]
    order = [1, 0, 3, 2, 4, 5]  # the receives, by index into `sent`
    got = {}
    for name, g in (("ronde", None), ("gloo", gloo)):
        if me == 0:
            reqs = [dist.isend(torch.full((n,), v), 1, group=g, tag=tag)
                    for tag, n, v in sent]
        else:
            bufs = [torch.zeros(sent[i][1]) for i in order]
            reqs = [dist.irecv(b, 0, group=g, tag=sent[i][0])
                    for b, i in zip(bufs, order)]
        for q in reqs:
            q.wait()
        if me == 1:
            got[name] = [sorted(set(b.tolist())) for b in bufs]
    try:
        if me == 0:
            dist.send(torch.full((200,), 7.0), 1, tag=9)
        else:
            dist.recv(torch.zeros(100), 0, tag=9)
        got["mismatch"] = ""
    except Exception as e:  # noqa: BLE001
        got["mismatch"] = str(e)
    t = torch.full((3,), 8.0) if me == 0 else torch.zeros(3)
    if me == 0:
        dist.send(t, 1, tag=9)
    else:
        dist.recv(t, 0, tag=9)
    got["after"] = t.tolist()
    save(out, "p2p_tags", got)
    dist.destroy_process_group()


def p2p_any_source(out, timeout="20"):
    """Rank 1 receives from any source, which ronde refuses, while rank 0
    sends to it: both fail, the sender about as soon as the receiver."""
    dist.init_process_group(
        "ronde", timeout=datetime.timedelta(seconds=float(timeout)))
    me = dist.get_rank()
    dist.barrier()
    start = time.monotonic()
    try:
        if me == 0:
            dist.send(torch.ones(4), 1)
        else:
            dist.recv(torch.zeros(4))
        msg = ""
    except Exception as e:  # noqa: BLE001
        msg = str(e)
    save(out, "p2p_any_source",
         {"message": msg, "seconds": time.monotonic() - start})
    sys.stdout.flush()
    os._exit(0)  # the sender's set never connected: no teardown to wait on


def mixed(out, order="c10d_first"):
    """The process group and ronde's DistributedOptimizer in one program,
    either one started first: training matches one process, and the
    group's collectives run between the steps."""
    from common import STEPS, batch, loss_fn, make_model, reference
    if order == "ronde_first":
        rt.init()
    dist.init_process_group("ronde", timeout=datetime.timedelta(seconds=60))
    assert rt.is_initialized() and rt.size() == dist.get_world_size()
    assert rt.rank() == dist.get_rank()
    model = make_model()
    opt = rt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters())
    counts = []
    for step in range(STEPS):
        x, y = batch(step, 0, rt.rank(), rt.size(), 1)
        opt.zero_grad()
        loss_fn(model, x, y).backward()
        opt.step()
        c = torch.ones(1)
        dist.all_reduce(c)
        counts.append(c.item())
    want = reference("sgd", size=rt.size())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), want[name], atol=1e-6, rtol=1e-5)
    assert counts == [float(rt.size())] * STEPS, counts
    save(out, f"mixed_{order}", True)
    dist.destroy_process_group()


def main():
    scenario, out = sys.argv[1], sys.argv[2]
    kwargs = dict(a.split("=", 1) for a in sys.argv[3:])
    try:
        globals()[scenario](out, **kwargs)
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    rt.shutdown()


if __name__ == "__main__":
    main()
