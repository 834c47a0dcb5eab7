"""SyncBatchNorm: batch norm whose training statistics are those of the
global batch, every rank's rows together, as one BatchNorm over the
concatenated batch would compute them (Horovod's ``hvd.SyncBatchNorm``,
PyTorch's ``nn.SyncBatchNorm``), over ronde's collectives.

Forward gathers every rank's (count, mean, M2) per channel in one allgather
of float64 and combines them exactly (the parallel form of Chan et al.:
mean = sum(n_r mean_r) / N, M2 = sum(M2_r + n_r (mean_r - mean)^2)), in rank
order, so every rank gets the same bits and ranks of different batch sizes
(a last batch) weigh by their rows; local statistics are float32 at least
(float16/bfloat16 inputs under autocast are promoted). Backward all-reduces
the two per-channel sums the input gradient needs in one call; the weight
and bias gradients stay local (the DistributedOptimizer averages them).
Eval mode, a job of one rank, or a set of one rank use plain batch norm
without communication.
"""
import itertools as _itertools

import torch as _torch
from torch.nn.modules.batchnorm import _BatchNorm

from . import _C

_names = _itertools.count()


def _set(process_set):
    return _C.global_process_set() if process_set is None else process_set


class _SyncBatchNormFunction(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps,
                momentum, process_set, name):
        channels = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        shape = [1, channels] + [1] * (input.dim() - 2)
        x = input if input.dtype in (_torch.float32, _torch.float64) \
            else input.float()
        count = input.numel() // channels if channels else 0
        if count > 0:
            var, mean = _torch.var_mean(x, dim=dims, correction=0)
        else:
            var = mean = _torch.zeros(channels, dtype=x.dtype,
                                      device=x.device)
        mine = _torch.cat([
            _torch.tensor([float(count)], dtype=_torch.float64),
            mean.detach().double().cpu(),
            (var.detach().double() * count).cpu()]).unsqueeze(0)
        every = _C.allgather(mine, name + ".stats", process_set)
        counts = every[:, :1]
        total = float(counts.sum())
        if total == 0:
            raise ValueError(f"ronde: SyncBatchNorm '{name}': no rank has a "
                             "row in this batch")
        means, m2s = every[:, 1:1 + channels], every[:, 1 + channels:]
        g_mean = (counts * means).sum(0) / total
        g_m2 = (m2s + counts * (means - g_mean) ** 2).sum(0)
        g_var = g_m2 / total
        if running_mean is not None:
            unbiased = g_m2 / max(total - 1.0, 1.0)
            with _torch.no_grad():
                running_mean.mul_(1 - momentum).add_(
                    g_mean.to(running_mean), alpha=momentum)
                running_var.mul_(1 - momentum).add_(
                    unbiased.to(running_var), alpha=momentum)
        invstd = (g_var + eps).rsqrt().to(x)
        xhat = (x - g_mean.to(x).view(shape)) * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.to(x).view(shape)
        if bias is not None:
            y = y + bias.to(x).view(shape)
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.total, ctx.dims, ctx.shape = total, dims, shape
        ctx.process_set, ctx.name = process_set, name
        ctx.has_bias = bias is not None
        return y.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        xhat, weight, invstd = ctx.saved_tensors
        dims, shape = ctx.dims, ctx.shape
        dy = grad_output.to(xhat.dtype)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        # The global sums, in one collective, in float64 for the sums of
        # many rows.
        both = _torch.cat([sum_dy, sum_dy_xhat]).double()
        _C.allreduce_(both, _C.ReduceOp.Sum, 1.0, 1.0, ctx.name + ".grad",
                      ctx.process_set)
        channels = sum_dy.numel()
        mean_dy = (both[:channels] / ctx.total).to(xhat).view(shape)
        mean_dy_xhat = (both[channels:] / ctx.total).to(xhat).view(shape)
        scale = invstd if weight is None else invstd * weight.to(invstd)
        grad_input = (dy - mean_dy - xhat * mean_dy_xhat) * scale.view(shape)
        grad_weight = sum_dy_xhat.to(weight) if weight is not None else None
        grad_bias = sum_dy.to(weight if weight is not None else dy) \
            if ctx.has_bias else None
        return (grad_input.to(grad_output.dtype), grad_weight, grad_bias,
                None, None, None, None, None, None)


class SyncBatchNorm(_BatchNorm):
    """``torch.nn.SyncBatchNorm`` over ronde: the same arguments and state
    (``weight``, ``bias``, ``running_mean``, ``running_var``,
    ``num_batches_tracked``), inputs of shape (N, C, ...), statistics of the
    global batch in training mode. ``process_set``: the ranks whose rows
    make the batch (default: the whole job)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=None, device=None,
                 dtype=None):
        super().__init__(num_features, eps, momentum, affine,
                         track_running_stats, device=device, dtype=dtype)
        self.process_set = process_set
        # The same on every rank that builds the same model.
        self._ronde_name = f"ronde.sync_batch_norm.{next(_names)}"

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(
                f"ronde: SyncBatchNorm expects (N, C, ...) input, got "
                f"{input.dim()}-d")

    def forward(self, input):
        self._check_input_dim(input)
        ps = _set(self.process_set)
        if not self.training or not _C.is_initialized() or ps.size() == 1:
            return super().forward(input)
        if input.shape[1] != self.num_features:
            raise ValueError(
                f"ronde: SyncBatchNorm of {self.num_features} features got "
                f"{input.shape[1]} channels")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        track = self.track_running_stats
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias,
            self.running_mean if track else None,
            self.running_var if track else None,
            self.eps, factor, ps, self._ronde_name)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_set=None):
        """Every BatchNorm1d/2d/3d in ``module`` (``module`` itself
        included) replaced by a SyncBatchNorm with its options, parameters
        and running statistics; returns the converted module, as
        ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum,
                      module.affine, module.track_running_stats,
                      process_set=process_set)
            if module.affine:
                with _torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
            if hasattr(module, "qconfig"):
                out.qconfig = module.qconfig
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_set))
        return out
