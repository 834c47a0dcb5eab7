"""ronde.torch on 2 real ranks over loopback, checked against one process
training on every rank's data (tests/python/common.py)."""
import json
import os

import pytest
import torch

from common import reference


def assert_params_close(got, want, atol=1e-5, rtol=1e-4):
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=atol, rtol=rtol,
                                   msg=lambda m: f"{name}: {m}")


def check_training(ranks, ref, *args, atol=1e-5, rtol=1e-4):
    ranks.run("train", *args)
    p0, p1 = ranks.load("params", 0), ranks.load("params", 1)
    for name in p0:  # replicas identical, bit for bit
        assert torch.equal(p0[name], p1[name]), name
    assert_params_close(p0, ref, atol=atol, rtol=rtol)
    return ranks.load("info", 0)


@pytest.mark.parametrize("optimizer", [
    pytest.param("sgd", marks=pytest.mark.installed), "adam", "adamw",
    "rmsprop", "adagrad"])
def test_matches_single_process(ranks, optimizer):
    # RMSprop divides by the root of a running mean of squared gradients:
    # the last-digit differences of a two-rank sum grow more there.
    tol = {"atol": 1e-4, "rtol": 1e-3} if optimizer == "rmsprop" else {}
    check_training(ranks, reference(optimizer), f"optimizer={optimizer}",
                   **tol)


def test_reference_differs_from_local_training():
    # The comparison can fail: each rank on its own data alone ends
    # elsewhere than the global-batch reference.
    a, b = reference("sgd", size=2), reference("sgd", size=1)
    assert any(not torch.allclose(a[n], b[n], atol=1e-4) for n in a)


def test_backward_passes_per_step(ranks):
    check_training(ranks, reference("sgd", k=2), "k=2")


def test_zero_grad_keeps_bucket_views(ranks):
    check_training(ranks, reference("adam"), "optimizer=adam", "zero=keep")


def test_without_bucket_views_and_small_buckets(ranks):
    info = check_training(ranks, reference("sgd"), "bucket_view=0",
                          "fusion=0.0005")
    assert len(info["buckets"]) > 1
    # Reverse registration order: the last layer's gradients go first.
    assert info["buckets"][0][0].startswith("4.")


def test_rebuild_and_autotune_options(ranks):
    # Rebuilt (the default), kept, and tuned layouts all train alike; the
    # bucket sizing travels in state_dict().
    info = check_training(ranks, reference("sgd"), "fusion=0.0005",
                          "rebuild=0")
    assert len(info["buckets"]) > 1
    assert info["buckets"][0][0].startswith("4.")
    info = check_training(ranks, reference("sgd"), "fusion=0.0005",
                          "autotune=1")
    assert info["saved_sizing"] == info["sizing"]
    # The search's first trial (0.5 MiB) runs; it needs more steps than this
    # run has to choose.
    assert info["sizing"][0] == 0.5 and info["sizing"][2] is False


def test_lr_scaling_linear(ranks):
    info = check_training(ranks, reference("sgd", lr=0.1), "lr=0.05",
                          "lr_scaling=linear")
    assert info["lr"] == [pytest.approx(0.1)]


def test_fp16_compression_close(ranks):
    check_training(ranks, reference("sgd"), "compression=fp16", atol=2e-3,
                   rtol=1e-2)


@pytest.mark.parametrize("hook", ["class", "callable", "powersgd_late"])
def test_comm_hooks_equal_plain_training(ranks, hook):
    # A hook written in Python (a CommHook subclass, a function) doing the
    # engine's all-reduce, and PowerSGD before its start_iter, train as the
    # default path does.
    check_training(ranks, reference("sgd"), f"hook={hook}")


def test_powersgd_replicas_equal(ranks):
    # Compressing from the second step: far from plain SGD at rank 1 on
    # this small model, but every replica bitwise equal (check_training's
    # first check) and finite.
    ranks.run("train", "hook=powersgd")
    p0, p1 = ranks.load("params", 0), ranks.load("params", 1)
    for name in p0:
        assert torch.equal(p0[name], p1[name]), name
        assert torch.isfinite(p0[name]).all(), name


@pytest.mark.parametrize("amp", ["torch", "ronde"])
def test_grad_scaler_skips_overflow_on_every_rank(ranks, amp):
    # Step 2's loss is infinite on rank 1 only: the averaged gradients
    # overflow on both ranks, both skip the step and back the scale off.
    ref = reference("sgd", scaler={"init_scale": 1024.0}, inf_step=2)
    info = check_training(ranks, ref, f"amp={amp}", "inf_step=2")
    assert info["scales"][2] == 512.0
    assert ranks.load("info", 1)["scales"] == info["scales"]


def test_grad_scaler_clean_run(ranks):
    check_training(ranks, reference("adam", scaler={"init_scale": 1024.0}),
                   "optimizer=adam", "amp=torch")


def test_collectives_and_async_handles(ranks):
    ranks.run("collectives")
    for r in range(2):
        res = ranks.load("collectives", r)
        assert (res["rank"], res["size"], res["local_rank"]) == (r, 2, r)
        # Two ranks of one host: shared memory.
        assert res["host_backend"] == "shm"
        torch.testing.assert_close(res["allreduce"], torch.full((3,), 1.5))
        torch.testing.assert_close(res["allreduce_sum"], torch.full((3,), 3.0))
        torch.testing.assert_close(res["allreduce_max"], torch.full((3,), 2.0))
        torch.testing.assert_close(res["allreduce_"], torch.full((3,), 3.0))
        for i, t in enumerate(res["async"]):
            torch.testing.assert_close(t, torch.full((2,), 0.5 + i))
        torch.testing.assert_close(res["async_"], torch.full((2,), 1.0))
        assert res["poll"]
        torch.testing.assert_close(
            res["allgather"], torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]))
        torch.testing.assert_close(res["allgather_async"], torch.tensor([0, 1]))
        torch.testing.assert_close(res["broadcast_"], torch.full((2,), 1.0))
        torch.testing.assert_close(res["broadcast"], torch.tensor([0.0]))
        # Rank r receives rows 2r, 2r+1 of every rank's 4 rows.
        want = torch.tensor([2.0 * r, 2.0 * r + 1, 100 + 2.0 * r, 101 + 2.0 * r])
        torch.testing.assert_close(res["alltoall"], want)
        torch.testing.assert_close(res["alltoall_async"],
                                   torch.tensor([float(r), 100.0 + r]))
        assert list(res["received_splits"]) == [1, 1]
        # Sum of (arange(4) + 0) and (arange(4) + 1), rows 2r and 2r+1.
        torch.testing.assert_close(
            res["reducescatter"], torch.tensor([4.0 * r + 1, 4.0 * r + 3]))
        # out=: the same results, written into the given tensors.
        assert res["into_same"] == [True, True, True]
        torch.testing.assert_close(res["into"]["allgather"], res["allgather"])
        torch.testing.assert_close(res["into"]["alltoall"], want)
        torch.testing.assert_close(res["into"]["reducescatter"],
                                   res["reducescatter"])
        torch.testing.assert_close(res["into_async"], res["reducescatter"])
        # Rows that do not fit `out` fail on the rank, after the collective.
        assert "out has 3 rows, but 2 came" in res["into_error"]


def test_process_sets(ranks):
    ranks.run("process_sets", np=4)
    ref = reference("sgd", size=2)
    want = {"allreduce": ([3.0] * 3, [7.0] * 3), "allgather": ([0, 1], [2, 3]),
            "broadcast": ([1.0], [3.0])}
    for r in range(4):
        res = ranks.load("sets", r)
        half, sr = r // 2, r % 2
        assert res["ids"] == (1, 2)
        assert res["included"] and not res["other_included"]
        assert (res["set_rank"], res["set_size"]) == (sr, 2)
        assert res["ranks"] == [2 * half, 2 * half + 1]
        assert res["repr"] == f"ProcessSet(id={half + 1}, ranks={res['ranks']})"
        assert res["global"] and res["sets"] == 3 and res["sets_after"] == 2
        for key, values in want.items():
            assert res[key].tolist() == values[half], (r, key)
        base = 20.0 * half + sr
        assert res["alltoall"].tolist() == [base, base + 10]
        assert res["reducescatter"].tolist() == [[1.0, 3.0], [5.0, 7.0]][half][sr:sr + 1]
        assert res["async"].tolist() == [2.0, 2.0]
        assert res["object"] == {"from": 2 * half + 1}
        assert "not in the set" in res["outside"]
        # Each half trained its own replica of the two-rank run.
        assert_params_close(ranks.load("params", r), ref)


@pytest.mark.parametrize("divide", ["contrib", "size"])
def test_join_uneven_inputs(ranks, divide):
    # One process over the same batches: both ranks' for 3 steps, then rank
    # 0's alone, averaged over the ranks that had data (or over both).
    from common import STEPS, batch, loss_fn, make_model, make_optimizer
    assert STEPS == 5
    model = make_model()
    opt = make_optimizer("sgd", model.parameters(), 0.05)
    for step in range(5):
        active = [0, 1] if step < 3 else [0]
        opt.zero_grad()
        losses = [loss_fn(model, *batch(step, 0, r, 2, 1)) for r in active]
        (sum(losses) / (2 if divide == "size" else len(active))).backward()
        opt.step()
    ref = {n: p.detach().clone() for n, p in model.named_parameters()}
    ranks.run("uneven", f"divide={divide}")
    for r in range(2):
        res = ranks.load("uneven", r)
        assert res["last"] == 0
        assert_params_close(ranks.load("params", r), ref)
    # Rank 1's loss counted while it trained, zero once it joined.
    s0, s1 = ranks.load("uneven", 0)["sums"], ranks.load("uneven", 1)["sums"]
    assert len(s0) == 5 and s0[:3] == s1


def test_errors_are_python_exceptions_with_the_cpp_messages(ranks):
    ranks.run("errors")
    for r in range(2):
        res = ranks.load("errors", r)
        kind, msg = res["collective"]
        assert kind == "RuntimeError"
        assert msg.startswith(
            f"ronde: ranks disagree on a collective (seen on rank {r}): "), msg
        assert "mismatched" in msg
        assert "Exception raised from" not in msg  # no C++ backtrace
        kind, msg = res["optimizer"]
        assert kind == "RuntimeError"
        assert msg == (
            "ronde: DistributedOptimizer parameters: ranks disagree (seen on "
            f"rank {r}): at position 0 rank 0 has 'weight' Float[2, 3] on cpu "
            "but rank 1 has 'weight' Float[2, 4] on cpu (rank 0 has 2, rank 1 "
            "has 2 in all)"), msg
        kind, msg = res["unnamed"]
        assert kind == "ValueError"
        assert msg.startswith(
            f"ronde: rank {r}: the wrapped optimizer's param group 0 holds "
            f"a parameter Float[2, {3 + r}] that is not among "
            "named_parameters"), msg
        kind, msg = res["passes"]
        assert msg == "ronde: backward_passes_per_step must be >= 1, got 0"
        kind, msg = res["count"]
        assert msg.startswith(f"ronde: step() after 1 backward passes on rank {r}"), msg


def test_peer_death_raises_comm_error(ranks):
    ranks.run("peer_dies", check=False)
    res = ranks.load("peer", 0)
    assert res is not None, "rank 0 did not notice its peer's death"
    assert res["type"] == "CommError" and res["is_runtime"]
    assert res["kind"] in ("peer failure", "timeout",
                           "broken communicator"), res


@pytest.mark.installed
def test_torchrun_launch(ranks):
    check_training_torchrun = reference("sgd")
    ranks.run("train", launcher="torchrun")
    assert_params_close(ranks.load("params", 0), check_training_torchrun)
    assert_params_close(ranks.load("params", 1), check_training_torchrun)


@pytest.mark.installed
def test_single_process_without_launcher():
    import subprocess
    import sys

    from conftest import _env
    code = ("import ronde.torch as rt, torch; rt.init(); "
            "assert (rt.rank(), rt.size(), rt.local_rank()) == (0, 1, 0); "
            "print(rt.allreduce(torch.ones(2)).tolist()); rt.shutdown()")
    env = {k: v for k, v in _env().items()
           if not k.startswith(("RONDE_RANK", "RONDE_SIZE", "RANK", "WORLD_SIZE"))}
    p = subprocess.run([sys.executable, "-c", code], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[1.0, 1.0]"


def sync_bn_reference(size, steps=3, offset=0):
    """One torch.nn.BatchNorm2d on every rank's rows at once."""
    from worker import make_sync_bn_params, sync_bn_data, sync_bn_steps
    bn = torch.nn.BatchNorm2d(3, momentum=0.2)
    weight, bias = make_sync_bn_params()
    with torch.no_grad():
        bn.weight.copy_(weight)
        bn.bias.copy_(bias)
    out = sync_bn_steps(bn, steps, size, offset)
    bn.eval()
    _, x, _ = sync_bn_data(9, size)
    return out, bn, bn(x[:4]).detach()


def check_sync_bn(got, np_, offset=0):
    from worker import make_sync_bn_params, sync_bn_data
    ref, bn, ref_eval = sync_bn_reference(np_, offset=offset)
    tol = {"rtol": 1e-6, "atol": 1e-6}
    # What the worker's autocast forward should give: batch norm of the
    # step-0 rows as bfloat16 (an identity convolution made them so).
    _, x, _ = sync_bn_data(0, np_)
    xin = x.to(torch.bfloat16).float()
    weight, bias = make_sync_bn_params()
    var, mean = torch.var_mean(xin, dim=(0, 2, 3), correction=0)
    amp_want = ((xin - mean.view(1, 3, 1, 1)) * (var.view(1, 3, 1, 1) + 1e-5)
                .rsqrt() * weight.view(1, 3, 1, 1) + bias.view(1, 3, 1, 1))
    for s, want in enumerate(ref):
        sizes = want["sizes"]
        for r in range(np_):
            lo = sum(sizes[:r])
            step = got[r]["steps"][s]
            torch.testing.assert_close(step["y"], want["y"][lo:lo + sizes[r]],
                                       **tol)
            torch.testing.assert_close(step["dx"], want["dx"][lo:lo + sizes[r]],
                                       **tol)
        # Weight and bias gradients are local sums: the optimizer's
        # all-reduce (a sum here) makes the global one.
        torch.testing.assert_close(
            sum(g["steps"][s]["dweight"] for g in got), want["dweight"], **tol)
        torch.testing.assert_close(
            sum(g["steps"][s]["dbias"] for g in got), want["dbias"], **tol)
    for r in range(np_):
        torch.testing.assert_close(got[r]["running_mean"], bn.running_mean,
                                   **tol)
        torch.testing.assert_close(got[r]["running_var"], bn.running_var,
                                   **tol)
        assert got[r]["tracked"] == 3
        torch.testing.assert_close(got[r]["eval"], ref_eval, **tol)
        # bfloat16 under autocast: the output's dtype, and batch norm of the
        # bfloat16 inputs within bfloat16's precision.
        assert got[r]["amp"].dtype == torch.bfloat16
        torch.testing.assert_close(got[r]["amp"].float(),
                                   amp_want[8 * r:8 * r + 8],
                                   atol=0.03, rtol=0.02)


@pytest.mark.parametrize("np_", [2, 4])
def test_sync_batch_norm_matches_one_batch_norm_on_the_global_batch(ranks, np_):
    # Per-replica batches of 8, then a ragged last one (8/5 or 8/5/3/8).
    ranks.run("sync_bn", np=np_)
    check_sync_bn([ranks.load("sync_bn", r) for r in range(np_)], np_)


def test_sync_batch_norm_over_process_sets(ranks):
    # 4 ranks, two sets of 2: each set's rows are its own global batch.
    ranks.run("sync_bn", "sets=1", np=4)
    got = [ranks.load("sync_bn", r) for r in range(4)]
    check_sync_bn(got[:2], 2, offset=0)
    check_sync_bn(got[2:], 2, offset=100)


@pytest.mark.installed
def test_a_horovod_script_runs_with_only_its_import_changed(ranks):
    ranks.run("horovod_api")
    want = reference("sgd")
    for r in range(2):
        res = ranks.load("horovod_api", r)
        assert_params_close(res["params"], want)
        torch.testing.assert_close(res["average_true"], torch.tensor([1.5]))
        torch.testing.assert_close(res["average_false"], torch.tensor([3.0]))
        assert res["deprecation"] == ["DeprecationWarning"] * 2
        torch.testing.assert_close(res["op_sum"], torch.tensor([3.0]))
        torch.testing.assert_close(res["op_max"], torch.tensor([2.0]))
        torch.testing.assert_close(res["fp16"], torch.tensor([1.5]))
        assert res["fp16"].dtype == torch.float32
        assert "exclusive" in res["both"]
        torch.testing.assert_close(res["allgather"],
                                   torch.tensor([[0.0], [1.0], [1.0]]))
        torch.testing.assert_close(res["broadcast"], torch.tensor([1.0]))
        assert res["broadcast_object"] == {"from": 1}
        assert res["allgather_object"] == [("rank", 0, []), ("rank", 1, [1])]
        # Each rank sends 1 row to rank 0 and 3 to rank 1.
        want_a2a = (torch.tensor([0.0, 10.0]) if r == 0 else
                    torch.tensor([1.0, 2.0, 3.0, 11.0, 12.0, 13.0]))
        torch.testing.assert_close(res["alltoall"], want_a2a)
        want_list = (torch.tensor([0.0, 1.0, 10.0, 11.0]) if r == 0 else
                     torch.tensor([2.0, 3.0, 12.0, 13.0]))
        torch.testing.assert_close(res["alltoall_list"], want_list)
        # As in Horovod, with splits: how many rows came from each rank, a
        # tensor of the splits' type (int32 for a list).
        want_recv = [1, 1] if r == 0 else [3, 3]
        assert res["alltoall_received"].tolist() == want_recv
        assert res["alltoall_received"].dtype == torch.int64
        assert res["alltoall_list_received"].tolist() == [2, 2]
        assert res["alltoall_list_received"].dtype == torch.int32
        g = res["grouped"]
        torch.testing.assert_close(g[0], torch.full((2,), 3.0))
        torch.testing.assert_close(g[1], torch.full((3,), 5.0,
                                                    dtype=torch.float64))
        torch.testing.assert_close(g[2], torch.full((1,), 7.0))
        # Not in place: the inputs kept their values.
        torch.testing.assert_close(res["grouped_inputs"][0],
                                   torch.full((2,), r + 1.0))
        torch.testing.assert_close(res["grouped_"][0], torch.full((2,), 1.5))
        torch.testing.assert_close(res["grouped_"][2], torch.full((1,), 3.5))
        assert res["converted"] == "SyncBatchNorm"
        torch.testing.assert_close(res["converted_running_mean"],
                                   torch.full((3,), 0.5))
        assert res["sync_bn_out_shape"] == (4, 3, 2, 2)
        assert res["caps"] == (False, False, True, False)


def test_ranges_in_torch_profiler_and_merged_timeline(ranks):
    # torch.profiler sees ronde's work beside the model's ops, the
    # all-reduces on ronde's own thread; ronderun --timeline merges the
    # ranks' own timelines into one file with a process per rank.
    tl = os.path.join(ranks.out, "tl")
    p = ranks.run("profile", launcher_args=("--timeline", tl))
    assert f"timeline of 2 rank(s) in {tl}/timeline.json" in p.stderr
    for rank in range(2):
        names = set(ranks.load("profile", rank))
        for want in ("ronde::launch", "ronde::pack", "ronde::allreduce",
                     "ronde::wait", "ronde::step", "load batch", "aten::mm"):
            assert want in names, (rank, want, sorted(names))
        with open(os.path.join(ranks.out, f"trace.{rank}.json")) as f:
            events = json.load(f)["traceEvents"]
        tids = {name: {e["tid"] for e in events if e.get("name") == name}
                for name in ("ronde::allreduce", "ronde::step")}
        assert tids["ronde::allreduce"] and tids["ronde::step"]
        assert not tids["ronde::allreduce"] & tids["ronde::step"]
    with open(os.path.join(tl, "timeline.json")) as f:
        merged = json.load(f)["traceEvents"]
    names = {e["args"]["name"] for e in merged
             if e.get("ph") == "M" and e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    spans = [e for e in merged if e.get("ph") == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    assert all(e["dur"] >= 0 and e["ts"] > 0 for e in spans)
    for rank in (0, 1):
        mine = {e["name"].split(" ")[0] for e in spans if e["pid"] == rank}
        assert {"allreduce", "pack", "optimizer"} <= mine, (rank, mine)


def elastic_reference(eras, samples=24, epochs=2, lr=0.02, seed=7):
    """One process, the global batches of the elastic worker: one sample
    per rank of the world in force, from the rest of each epoch's
    permutation (ElasticSampler's rule)."""
    from worker import elastic_data
    x, y = elastic_data()
    model = torch.nn.Linear(4, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
        model.bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    step = 0
    for epoch in range(epochs):
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(samples, generator=g)
        at = 0
        while at < samples:
            n = [size for start, size in eras if start <= step][-1]
            idx = order[at:at + n]
            at += n
            opt.param_groups[0]["lr"] = lr * n
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[idx]), y[idx]).backward()
            opt.step()
            step += 1
    return torch.cat([model.weight.flatten(), model.bias]).detach()


@pytest.mark.installed
def test_a_horovod_elastic_script_survives_a_lost_rank(ranks):
    # Launch rank 2 of 3 dies at step 5; the last commit was at step 4.
    p = ranks.run("elastic_horovod", "kill_rank=2", "kill_step=5", np=3,
                  launcher_args=("--min-np", "2"))
    assert "the job is elastic" in p.stderr + p.stdout
    res = ranks.load("elastic", 0)
    assert res["eras"] == [(0, 3), (4, 2)], res["eras"]
    assert res["size"] == 2
    assert torch.equal(res["seen"], torch.ones(2, 24)), res["seen"]
    assert res["lr"] == pytest.approx(0.02 * 2)
    torch.testing.assert_close(res["params"], elastic_reference(res["eras"]),
                               atol=1e-5, rtol=1e-4)
    other = ranks.load("elastic", 1)
    assert torch.equal(other["params"], res["params"])


def test_a_replacement_joins_the_horovod_elastic_script(ranks):
    # Launch rank 2 of 3 dies at step 5; ronderun starts a replacement,
    # which joins at a later commit and takes rank 0's state.
    # The steps are slowed so that the replacement (a fresh Python that
    # imports torch) is up and admitted well before training ends, also
    # on a loaded machine.
    p = ranks.run("elastic_horovod", "kill_rank=2", "kill_step=5",
                  "step_sleep=0.6", np=3,
                  launcher_args=("--min-np", "2", "--restart-failed"))
    assert "starting a replacement for rank 2" in p.stderr + p.stdout
    res = ranks.load("elastic", 0)
    assert res["eras"][:2] == [(0, 3), (4, 2)], res["eras"]
    assert len(res["eras"]) == 3 and res["eras"][2][1] == 3, res["eras"]
    assert res["size"] == 3
    assert torch.equal(res["seen"], torch.ones(2, 24)), res["seen"]
    assert res["lr"] == pytest.approx(0.02 * 3)
    torch.testing.assert_close(res["params"], elastic_reference(res["eras"]),
                               atol=1e-5, rtol=1e-4)
    for r in (1, 2):  # the survivor and the replacement
        assert torch.equal(ranks.load("elastic", r)["params"], res["params"])


def test_the_documented_elastic_loop_uses_every_sample_once(ranks):
    # The loop of ronde.torch.elastic's docstring (enumerate(loader,
    # state.batch), record_batch(state.batch, ...)) at 4 ranks over 92
    # samples, batch 5, a commit every 2nd batch. Launch rank 2 dies at
    # batch 3 (the commit at batch 2 leaves 52 samples, not a multiple of
    # 3), then launch rank 1 at batch 4 of the 3-rank world. The counts
    # of trained samples live in the state, so what a roll-back undoes is
    # not counted. Only the final split's padding (fewer samples than
    # ranks) may be read twice.
    p = ranks.run("elastic_doc_loop", "samples=92", "batch=5", "every=2",
                  "kills=2:4:3,1:3:4", np=4, timeout=300,
                  launcher_args=("--min-np", "2"))
    res = ranks.load("elastic_doc", 0)
    assert [size for _, size in res["eras"]] == [4, 3, 2], (
        res["eras"], p.stderr)
    seen = res["seen"]
    used = int(seen.sum())
    twice = int((seen > 1).sum())
    missing = int((seen == 0).sum())
    assert (missing == 0 and int(seen.max()) <= 2 and
            used - 92 < res["size"]), (
        f"{used} samples used of 92, {twice} more than once "
        f"(max {int(seen.max())}), {missing} never; eras {res['eras']}")
    # The padding is the epoch's first samples (the worker's seed is 3).
    g = torch.Generator()
    g.manual_seed(3)
    first = set(torch.randperm(92, generator=g)[:res["size"] - 1].tolist())
    assert set(torch.nonzero(seen > 1).flatten().tolist()) <= first
    assert torch.equal(ranks.load("elastic_doc", 1)["seen"], seen)


@pytest.mark.parametrize("optimizer,stage,amp", [
    pytest.param("adam", "1", "0", marks=pytest.mark.installed),
    ("sgd", "2", "0"), ("adamw", "1", "1")])
def test_sharded_equals_unsharded(ranks, optimizer, stage, amp):
    ranks.run("zero", f"optimizer={optimizer}", f"stage={stage}",
              f"amp={amp}", np=3)
    for r in range(3):
        got = ranks.load("zero", r)
        assert got["differ"] == [], got
        if amp == "1":
            assert got["scales"][0] == got["scales"][1] < 256.0, got
    assert ranks.load("zero", 0)["same_state"] is True


def test_zero_redundancy_optimizer_script(ranks):
    ranks.run("torch_zero", "impl=torch", launcher="torchrun")
    ranks.run("torch_zero", "impl=ronde", launcher="torchrun")
    want = ranks.load("zero_params_torch", 0)
    for r in range(2):
        assert_params_close(ranks.load("zero_params_ronde", r), want,
                            atol=1e-6, rtol=1e-5)
    a = ranks.load("zero_state_torch", 0)
    b = ranks.load("zero_state_ronde", 0)
    assert a["state"].keys() == b["state"].keys()
    for i in a["state"]:
        for k in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(b["state"][i][k], a["state"][i][k],
                                       atol=1e-6, rtol=1e-5)
