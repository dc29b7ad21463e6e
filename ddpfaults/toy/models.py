"""Tiny seeded models for the scenarios: a DETR/Mask3D-style set-prediction toy, its criterion, and an MLP.

Weights are drawn inside ``torch.random.fork_rng`` after ``torch.manual_seed(seed)``: the same seed
gives bit-identical weights in every process, and the caller's global RNG is left untouched.
:func:`state_digest` and :func:`parameters_equal` let a scenario check that replicas are bit-equal.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from ddpfaults.rank import digest


@contextlib.contextmanager
def _seeded(seed: int):
    """Run the body with the global CPU RNG seeded to ``seed``, restoring the caller's RNG afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class SetPredictionModel(nn.Module):
    """A Mask3D-shaped toy: point MLP backbone, per-segment pooling, learned queries, two heads.

    ``forward(points [B, P, feat_dim], point2segment [B, P] int64)`` returns
    ``{"pred_logits": [B, Q, num_classes + 1], "pred_masks": [B, Q, num_segments]}``; the last class
    is "no object". Parameters: ``backbone``, ``queries``, ``class_head``, ``mask_embed``. A loss built
    from ``pred_logits`` alone leaves ``mask_embed`` unused (the early-return failure of report 000).
    """

    def __init__(
        self,
        *,
        feat_dim: int = 6,
        num_queries: int = 8,
        num_classes: int = 4,
        hidden: int = 32,
        num_segments: int = 16,
        seed: int = 0,
    ):
        super().__init__()
        self.num_segments = num_segments
        with _seeded(seed):
            self.backbone = nn.Sequential(nn.Linear(feat_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
            self.queries = nn.Parameter(torch.randn(num_queries, hidden) * 0.1)
            self.class_head = nn.Linear(hidden, num_classes + 1)
            self.mask_embed = nn.Linear(hidden, hidden)

    def forward(self, points: Tensor, point2segment: Tensor) -> dict:
        """The model applied to a batch."""
        feats = self.backbone(points)  # [B, P, H]
        index = point2segment.unsqueeze(-1).expand_as(feats)
        segments = feats.new_zeros(feats.shape[0], self.num_segments, feats.shape[-1])
        segments = segments.scatter_reduce(1, index, feats, reduce="mean", include_self=False)  # [B, S, H]
        queries = self.queries.unsqueeze(0) + feats.mean(dim=1, keepdim=True)  # [B, Q, H]
        return {
            "pred_logits": self.class_head(queries),
            "pred_masks": torch.einsum("bqh,bsh->bqs", self.mask_embed(queries), segments),
        }


class SetCriterion:
    """DETR/Mask3D-style loss: greedy matching, then class CE + mask BCE + dice, normalised by ``num_masks``.

    ``criterion(outputs, targets)`` returns a scalar loss. Like the real thing it

    * matches predictions to ``targets[b]["segment_mask"]`` / ``targets[b]["labels"]`` (a target
      without ``segment_mask`` raises ``KeyError: 'segment_mask'`` in :meth:`match`);
    * then, in :meth:`_reduce_num_masks`, calls ``dist.all_reduce(num_masks)`` whenever a process
      group is initialised: a rank that skips the criterion skips that collective.

    With zero-instance targets the loss is finite and still reaches every parameter of both heads.
    """

    def __init__(self, *, num_classes: int = 4, eos_coef: float = 0.1):
        self.num_classes = num_classes
        self.class_weight = torch.ones(num_classes + 1)
        self.class_weight[-1] = eos_coef

    @torch.no_grad()
    def match(self, outputs: dict, targets: list[dict]) -> list[tuple[Tensor, Tensor]]:
        """Greedy matching (no scipy): per batch item, ``(query indices, target indices)``."""
        indices = []
        for b, target in enumerate(targets):
            tgt_masks = target["segment_mask"].float()  # [K, S]; KeyError here for a hand-made target
            labels = target["labels"]
            probs = outputs["pred_logits"][b].softmax(-1)  # [Q, C+1]
            logits = outputs["pred_masks"][b]  # [Q, S]
            cost_class = -probs[:, labels]
            pos = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits), reduction="none")
            neg = F.binary_cross_entropy_with_logits(logits, torch.zeros_like(logits), reduction="none")
            cost_bce = (pos @ tgt_masks.T + neg @ (1 - tgt_masks).T) / logits.shape[-1]
            cost = cost_class + cost_bce + _dice(logits.sigmoid(), tgt_masks, pairwise=True)  # [Q, K]
            rows, cols = [], []
            for _ in range(min(cost.shape)):
                q, k = divmod(int(cost.argmin()), cost.shape[1])
                rows.append(q)
                cols.append(k)
                cost[q, :], cost[:, k] = float("inf"), float("inf")
            indices.append((torch.tensor(rows, dtype=torch.int64), torch.tensor(cols, dtype=torch.int64)))
        return indices

    def _reduce_num_masks(self, num_masks: Tensor) -> Tensor:
        """Average the instance count over ranks (the criterion's own collective), at least 1."""
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(num_masks)  # THE criterion collective: every rank must reach this line
            return torch.clamp(num_masks / dist.get_world_size(), min=1)
        return torch.clamp(num_masks, min=1)

    def __call__(self, outputs: dict, targets: list[dict]) -> Tensor:
        indices = self.match(outputs, targets)
        num_masks = self._reduce_num_masks(torch.tensor([float(sum(len(t["labels"]) for t in targets))]))

        logits = outputs["pred_logits"]  # [B, Q, C+1]
        target_classes = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64)
        for b, (rows, cols) in enumerate(indices):
            target_classes[b, rows] = targets[b]["labels"][cols]
        loss_ce = F.cross_entropy(logits.transpose(1, 2), target_classes, self.class_weight)

        # gather matched pairs; with no instances these are [0, S] tensors that still sit in the graph
        batch_idx = torch.cat([torch.full_like(rows, b) for b, (rows, _) in enumerate(indices)])
        query_idx = torch.cat([rows for rows, _ in indices])
        src = outputs["pred_masks"][batch_idx, query_idx]  # [N, S]
        tgt = torch.cat([t["masks"][cols].float() for t, (_, cols) in zip(targets, indices, strict=True)])  # [N, S]
        loss_bce = F.binary_cross_entropy_with_logits(src, tgt, reduction="none").mean(-1).sum() / num_masks
        loss_dice = _dice(src.sigmoid(), tgt).sum() / num_masks
        return loss_ce + (loss_bce + loss_dice).squeeze(0)


def _dice(probs: Tensor, targets: Tensor, *, pairwise: bool = False) -> Tensor:
    """Dice loss per row (``[N]``), or for every pair of rows (``[N, M]``) when ``pairwise``."""
    if pairwise:
        inter = probs @ targets.T
        total = probs.sum(-1)[:, None] + targets.sum(-1)[None, :]
    else:
        inter = (probs * targets).sum(-1)
        total = probs.sum(-1) + targets.sum(-1)
    return 1 - (2 * inter + 1) / (total + 1)


class MLP(nn.Module):
    """A plain seeded MLP ``in_dim -> hidden -> out_dim`` (ReLU), for regression scenarios."""

    def __init__(self, *, in_dim: int = 8, hidden: int = 16, out_dim: int = 2, seed: int = 0):
        super().__init__()
        with _seeded(seed):
            self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))

    def forward(self, x: Tensor) -> Tensor:
        """The model applied to a batch."""
        return self.net(x)


def _state(model_or_state) -> dict:
    """The state dict of a module (unwrapping DDP's ``.module``) or a state dict itself."""
    if isinstance(model_or_state, nn.parallel.DistributedDataParallel):
        model_or_state = model_or_state.module
    if isinstance(model_or_state, nn.Module):
        return model_or_state.state_dict()
    return dict(model_or_state)


def _raw(tensor: Tensor) -> Tensor:
    """The raw bytes of a tensor, as a flat uint8 tensor (so NaNs and -0.0 compare bit-exactly)."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def parameters_equal(a, b) -> bool:
    """True if two models (or DDP wrappers, or state dicts) have bit-identical state dicts."""
    sa, sb = _state(a), _state(b)
    if list(sa) != list(sb):
        return False
    return all(
        sa[k].dtype == sb[k].dtype and sa[k].shape == sb[k].shape and torch.equal(_raw(sa[k]), _raw(sb[k])) for k in sa
    )


def state_digest(model) -> str:
    """A stable SHA-256 hex digest of a model's state dict (or of a dict of tensors): names, dtypes, shapes and raw
    bytes, in order."""
    return digest.hexdigest(_state(model), digest.SHA256)


def regression_step(ctx, ddp_model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> Tensor:
    """Announce ``step`` on ``ctx`` and train one SGD step of the MLP on this rank's seeded regression batch."""
    from ddpfaults.toy.data import make_regression

    ctx.step(step)
    x, y = make_regression(seed=ctx.seed, rank=ctx.rank, step=step)
    loss = F.mse_loss(ddp_model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach()
