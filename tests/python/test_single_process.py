"""ronde.torch in this process, as a job of one rank (no launcher)."""
import os

import pytest
import torch

for _var in ("RONDE_RANK", "RONDE_SIZE", "RANK", "WORLD_SIZE",
             "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
    os.environ.pop(_var, None)

import ronde.torch as rt  # noqa: E402
from common import make_model  # noqa: E402


# In-process and quick: all of it runs against the pip-installed package.
pytestmark = pytest.mark.installed


@pytest.fixture(scope="module", autouse=True)
def job():
    rt.init()
    yield
    rt.shutdown()


def test_one_rank():
    assert (rt.rank(), rt.size(), rt.local_rank()) == (0, 1, 0)
    assert issubclass(rt.CommError, RuntimeError)
    assert isinstance(rt.nccl_built(), bool)


def test_warmup_scheduler_is_the_cpp_schedule():
    model = make_model()
    opt = rt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters())
    sched = rt.WarmupScheduler(opt, warmup_steps=4, multiplier=4,
                               then=rt.Decay.step(2, 0.5))
    lrs = []
    for _ in range(8):
        lrs.append(sched.get_last_lr()[0])
        sched.step()
    # Linear warmup from 0.1 / 4 to 0.1 over 4 steps, then halved every 2.
    want = [0.025, 0.04375, 0.0625, 0.08125, 0.1, 0.1, 0.05, 0.05]
    assert lrs == pytest.approx(want)
    state = sched.state_dict()
    again = rt.WarmupScheduler(opt, warmup_steps=4, multiplier=4,
                               then=rt.Decay.step(2, 0.5))
    again.load_state_dict(state)
    assert again.get_last_lr() == pytest.approx(sched.get_last_lr())


def test_wrapping_keeps_the_optimizer_and_its_base_lr():
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = rt.DistributedOptimizer(sgd, named_parameters=model.named_parameters(),
                                  lr_scaling="linear")
    assert opt is sgd and isinstance(opt, torch.optim.SGD)
    assert opt.base_lrs == [0.1] and opt.lr_scale_factor == 1.0
    again = rt.DistributedOptimizer(opt, model.named_parameters())
    assert again.param_groups[0]["lr"] == 0.1
    assert "ronde_base_lr" in again.state_dict()["param_groups"][0]


def test_skip_synchronize_needs_synchronize_first():
    model = make_model()
    opt = rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  model.named_parameters())
    model(torch.ones(2, 8)).sum().backward()
    with pytest.raises(RuntimeError, match="before synchronize"):
        with opt.skip_synchronize():
            opt.step()
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()


def test_lbfgs_closure_matches_plain_lbfgs():
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    results = []
    for wrap in (False, True):
        model = make_model()
        opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
        if wrap:
            opt = rt.DistributedOptimizer(opt, model.named_parameters())

        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        for _ in range(3):
            opt.step(closure)
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)


def test_patched_step_is_refused():
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.optim.lr_scheduler.StepLR(sgd, 1)
    with pytest.raises(RuntimeError, match="create LR schedulers after"):
        rt.DistributedOptimizer(sgd, model.named_parameters())


def test_bad_option_message():
    model = make_model()
    with pytest.raises(RuntimeError) as e:
        rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                model.named_parameters(), first_bucket_mb=0)
    assert str(e.value) == "ronde: first_bucket_mb must be positive, got 0"
