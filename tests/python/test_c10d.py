"""ronde as a torch.distributed backend (backend="ronde"): every operation
against local references at 2, 3 and 4 ranks; DDP, ZeroRedundancyOptimizer
and FSDP equal to the same on gloo; clear errors for mismatches and a dead
peer; the process group beside ronde's DistributedOptimizer."""
import pytest
import torch

from conftest import C10D_WORKER


def run(ranks, scenario, *args, np=2, **kw):
    return ranks.run(scenario, *args, np=np, launcher="torchrun",
                     worker=C10D_WORKER, **kw)


@pytest.mark.parametrize("np", [2, 3, 4])
def test_every_operation_against_a_local_reference(ranks, np):
    run(ranks, "ops", np=np)
    for r in range(np):
        assert ranks.load("ops_ok", r) is True


@pytest.mark.installed
def test_ddp_zero_and_fsdp_equal_gloo(ranks):
    run(ranks, "ddp", timeout=400)
    got = ranks.load("ddp", 0)
    other = ranks.load("ddp", 1)
    for name, runs in got.items():
        for a, b in zip(runs["ronde"], runs["gloo"]):
            assert torch.equal(a, b), f"{name}: ronde differs from gloo"
        for a, b in zip(runs["ronde"], other[name]["ronde"]):
            assert torch.equal(a, b), f"{name}: the ranks differ"
        if "reference" in runs:
            for a, b in zip(runs["ronde"], runs["reference"]):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert {"plain", "unused", "static", "no_sync", "fp16_hook", "powersgd",
            "join", "zero", "fsdp"} <= set(got)


def test_mismatches_fail_on_every_rank_and_the_group_goes_on(ranks):
    run(ranks, "errors")
    for r in range(2):
        shape, dtype, gather, after, a2a, untouched = ranks.load("errors", r)
        assert "ranks disagree" in shape, shape
        assert "Float[4]" in shape and "Float[5]" in shape, shape
        assert "ranks disagree" in dtype, dtype
        assert "Float[4]" in dtype and "Double[4]" in dtype, dtype
        assert "ranks disagree" in gather, gather
        assert after == [2.0, 2.0, 2.0]
        assert "where this rank expects [2, 2]" in a2a, a2a
        assert untouched == [-7.0] * 4, untouched


def test_a_dead_peer_fails_the_others_within_the_timeout(ranks):
    run(ranks, "peer_dies", "timeout=8", np=3, check=False, timeout=120)
    for r in range(2):
        got = ranks.load("peer_dies", r)
        assert "rank 2" in got["message"], got["message"]
        assert got["seconds"] < 30, got


def test_tagged_messages_match_their_receives_as_on_gloo(ranks):
    run(ranks, "p2p_tags")
    got = ranks.load("p2p_tags", 1)
    want = [[2.0], [1.0], [4.0], [3.0], [5.0], [6.0]]
    assert got["gloo"] == want
    assert got["ronde"] == want
    msg = got["mismatch"]
    assert "tag 9" in msg and "rank 0" in msg and "rank 1" in msg, msg
    assert "200 Float" in msg and "100 Float" in msg, msg
    assert got["after"] == [8.0] * 3
    sender = ranks.load("p2p_tags", 0)
    assert sender["mismatch"] == "", sender["mismatch"]


def test_a_refused_any_source_recv_fails_the_sender_at_once(ranks):
    # The group's timeout is 20 s: the sender must not wait for it.
    run(ranks, "p2p_any_source", "timeout=20", check=False, timeout=120)
    receiver = ranks.load("p2p_any_source", 1)
    assert "without a source rank" in receiver["message"], receiver
    sender = ranks.load("p2p_any_source", 0)
    assert "refused a receive from any source" in sender["message"], sender
    assert sender["seconds"] < 10, sender


@pytest.mark.parametrize("order", ["c10d_first", "ronde_first"])
def test_process_group_beside_distributed_optimizer(ranks, order):
    run(ranks, "mixed", f"order={order}")
    for r in range(2):
        assert ranks.load(f"mixed_{order}", r) is True
