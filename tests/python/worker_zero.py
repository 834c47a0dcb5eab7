"""The sharding scenarios of worker.py (ZeRO stages 1 and 2 through
ronde.torch, and a script written for PyTorch's ZeroRedundancyOptimizer)."""
import os

import torch

import ronde.torch as rt
from common import STEPS, batch, loss_fn, make_model, make_optimizer


def save(out, name, obj):
    torch.save(obj, os.path.join(out, f"{name}.rank{rt.rank()}.pt"))


def zero(out, optimizer="adam", stage="1", amp="0"):
    """Sharded and unsharded DistributedOptimizer side by side on the same
    batches (fine buckets, so parameters straddle ranks): equal bit for bit
    after every step, clipping with rt.clip_grad_norm_ (and, with amp=1,
    rt.GradScaler with one rank overflowing at step 2); then rank 0's
    consolidated state_dict equals the unsharded one's, and a fresh sharded
    optimizer loads it into the same state."""
    kw = dict(fusion_threshold_mb=0.002, first_bucket_mb=0.001)
    models, opts, scalers = [], [], []
    for sharded in (False, True):
        model = make_model()
        opt = rt.DistributedOptimizer(
            make_optimizer(optimizer, model.parameters(), 0.01),
            named_parameters=model.named_parameters(), **kw,
            shard_optimizer_state=sharded and stage == "1",
            shard_gradients=sharded and stage == "2")
        models.append(model)
        opts.append(opt)
        scalers.append(rt.GradScaler("cpu", init_scale=256.0))
    differ = []
    for step in range(STEPS):
        x, y = batch(step, 0, rt.rank(), rt.size(), 1)
        for model, opt, scaler in zip(models, opts, scalers):
            opt.zero_grad()
            loss = loss_fn(model, x, y)
            if amp == "1":
                if step == 2 and rt.rank() == rt.size() - 1:
                    loss = loss * float("inf")
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                rt.clip_grad_norm_(opt, 0.05)
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                rt.clip_grad_norm_(opt, 0.05)
                opt.step()
        if not all(torch.equal(a, b) for a, b in zip(
                models[0].parameters(), models[1].parameters())):
            differ.append(step)
    opts[1].consolidate_state_dict(to=0)
    got = opts[1].state_dict() if rt.rank() == 0 else None
    got = rt.broadcast_object(got, root_rank=0)
    fresh = make_model()
    again = rt.DistributedOptimizer(
        make_optimizer(optimizer, fresh.parameters(), 0.01),
        named_parameters=fresh.named_parameters(), **kw,
        shard_optimizer_state=True)
    again.load_state_dict(got)
    again.consolidate_state_dict(to=0)
    same_state = None
    if rt.rank() == 0:
        want = opts[0].state_dict()
        same_state = (_same_state(want, got)
                      and _same_state(want, again.state_dict()))
    save(out, "zero", {"differ": differ, "same_state": same_state,
                       "scales": [s.get_scale() for s in scalers]})


def _same_state(a, b):
    if a["state"].keys() != b["state"].keys():
        return False
    for i, s in a["state"].items():
        t = b["state"][i]
        if s.keys() != t.keys() or not all(
                torch.equal(torch.as_tensor(s[k]), torch.as_tensor(t[k]))
                for k in s):
            return False
    return [g["lr"] for g in a["param_groups"]] == [
        g["lr"] for g in b["param_groups"]]


def torch_zero(out, impl="ronde"):
    """A script written for torch.distributed.optim.ZeroRedundancyOptimizer
    (DDP over gloo, Adam sharded, the consolidated state saved on rank 0);
    with impl=ronde only its import differs."""
    import torch.distributed as dist
    if impl == "ronde":
        from ronde.torch import ZeroRedundancyOptimizer
    else:
        from torch.distributed.optim import ZeroRedundancyOptimizer
    dist.init_process_group("gloo")
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = ZeroRedundancyOptimizer(ddp.parameters(),
                                  optimizer_class=torch.optim.Adam, lr=0.01)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step, 0, dist.get_rank(), dist.get_world_size(), 1)
        loss_fn(ddp, x, y).backward()
        opt.step()
    opt.consolidate_state_dict(to=0)
    if dist.get_rank() == 0:
        save(out, f"zero_state_{impl}", opt.state_dict())
    save(out, f"zero_params_{impl}", {n: p.detach().clone()
                                      for n, p in model.named_parameters()})
    dist.destroy_process_group()
