"""What the workers and the tests share: the model, the data, and the
single-process reference training loop."""
import torch
import torch.nn as nn
import torch.nn.functional as F

IN, HIDDEN, OUT = 8, 16, 4
BATCH = 4  # per rank and micro-batch
STEPS = 5


def make_model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, OUT))


def batch(step, micro, rank, size, k):
    """Rank `rank`'s micro-batch `micro` of step `step`: rows of the global
    batch of step `step`, which one process would see whole."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size * k * BATCH, IN, generator=g)
    y = torch.randn(size * k * BATCH, OUT, generator=g)
    lo = (micro * size + rank) * BATCH
    return x[lo:lo + BATCH], y[lo:lo + BATCH]


def make_optimizer(name, params, lr):
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr)
    raise ValueError(name)


def loss_fn(model, x, y):
    return F.mse_loss(model(x), y)


def reference(optimizer="sgd", size=2, k=1, lr=0.05, scaler=None,
              inf_step=None):
    """One process on every rank's data at once: what the ranks must end
    with. `scaler`: a torch.amp.GradScaler kwargs dict; `inf_step`: a step
    whose loss is made infinite (so the scaler skips it)."""
    model = make_model()
    opt = make_optimizer(optimizer, model.parameters(), lr)
    sc = torch.amp.GradScaler("cpu", **scaler) if scaler is not None else None
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(k):
            xs, ys = zip(*(batch(step, micro, r, size, k) for r in range(size)))
            loss = loss_fn(model, torch.cat(xs), torch.cat(ys)) / k
            if step == inf_step:
                loss = loss * float("inf")
            (sc.scale(loss) if sc else loss).backward()
        if sc:
            sc.step(opt)
            sc.update()
        else:
            opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def run_check_worker(scenarios):
    """The entry point of a worker whose scenarios each check on their own
    rank and return what failed (`worker.py SCENARIO OUT_DIR`): inside
    init() and shutdown(); the failures are printed and saved as
    SCENARIO.rank<r>.pt for the test to read."""
    import os
    import sys
    import traceback

    import ronde.torch as rt

    scenario, out = sys.argv[1], sys.argv[2]
    rt.init()
    try:
        failures = scenarios[scenario](out)
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    torch.save(failures, os.path.join(out, f"{scenario}.rank{rt.rank()}.pt"))
    for f in failures:
        print(f"rank {rt.rank()}: {f}", flush=True)
    rt.shutdown()
