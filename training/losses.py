"""The three losses: DINO's image loss, SelfPatch's patch loss (both centred and sharpened), our contrastive loss.

``CentredLoss`` is SelfPatch's ``DINOLoss``: the two centres live beside the computation that
uses them, and its state dict is exactly ``{"center": (1, 1, P), "patch_center": (1, Q)}``, the
``dino_loss`` entry of a SelfPatch checkpoint. With micro-batches the centres are updated once
per optimiser step from the teacher outputs of the whole step (all micro-batches, all
processes), which is what one batch of 256 on one card would do.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .rules import Selection


def cross_entropy(target: torch.Tensor, scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """Σ −q · log_softmax(s / τ) over the last axis."""
    return torch.sum(-target * F.log_softmax(scores / temperature, dim=-1), dim=-1)


class CentredLoss(nn.Module):
    """DINO's image loss and SelfPatch's patch loss, with their centres (EMA 0.9 of the teacher's scores)."""

    def __init__(self, image_prototypes: int, patch_prototypes: int, teacher_temp: float = 0.04, student_temp: float = 0.1, center_momentum: float = 0.9):
        super().__init__()
        self.teacher_temp = teacher_temp
        self.student_temp = student_temp
        self.center_momentum = center_momentum
        self.register_buffer("center", torch.zeros(1, 1, image_prototypes))
        self.register_buffer("patch_center", torch.zeros(1, patch_prototypes))
        self.reset_sums()

    def reset_sums(self) -> None:
        self._sums: dict[str, list] = {"center": [0.0, 0], "patch_center": [0.0, 0]}

    def _observe(self, name: str, rows: torch.Tensor) -> None:
        entry = self._sums[name]
        entry[0] = entry[0] + rows.detach().float().sum(0)
        entry[1] += rows.shape[0]

    def image(self, student: list[torch.Tensor], teacher: list[torch.Tensor]) -> torch.Tensor:
        """Mean over pairs of the teacher's global views iq ∈ {0, 1} and every student view v ≠ iq (18 with 10 crops).

        ``student``: one (B, P) score tensor per crop, globals first; ``teacher``: the teacher's
        views (the 2 globals, or all 10 as SelfPatch's teacher sees them); the centre averages
        every teacher view given.
        """
        center = self.center.reshape(1, -1)
        targets = [F.softmax((t.float() - center) / self.teacher_temp, dim=-1).detach() for t in teacher[:2]]
        terms = [cross_entropy(q, s.float(), self.student_temp).mean() for iq, q in enumerate(targets) for v, s in enumerate(student) if v != iq]
        for t in teacher:
            self._observe("center", t)
        return torch.stack(terms).mean()

    def patch(self, student: list[torch.Tensor], teacher: list[torch.Tensor], used: list[torch.Tensor] | None = None) -> torch.Tensor:
        """SelfPatch's patch loss: per crop, the mean over anchors of CE(teacher target of the aggregated positives, student's own token); then the mean over crops.

        ``student`` / ``teacher``: one (B, N, Q) tensor per crop. ``used`` (B, N) bool per crop
        leaves out anchors with no positive (the threshold rule); they enter neither the loss
        nor the patch centre.
        """
        center = self.patch_center.reshape(1, 1, -1)
        terms = []
        for i, (s, t) in enumerate(zip(student, teacher)):
            q = F.softmax((t.float() - center) / self.teacher_temp, dim=-1).detach()
            loss = cross_entropy(q, s.float(), self.student_temp)
            keep = used[i] if used is not None else torch.ones_like(loss, dtype=torch.bool)
            if keep.any():
                terms.append(loss[keep].mean())
            self._observe("patch_center", t[keep])
        return torch.stack(terms).mean() if terms else student[0].sum() * 0.0

    @torch.no_grad()
    def update_centres(self, distributed: bool = False) -> None:
        """EMA of each centre towards the mean teacher score of the step (summed over processes)."""
        for name, (total, count) in self._sums.items():
            if count == 0:
                continue
            stats = torch.cat([total.reshape(-1), total.new_tensor([count])])
            if distributed:
                dist.all_reduce(stats)
            mean = (stats[:-1] / stats[-1]).reshape(getattr(self, name).shape)
            setattr(self, name, getattr(self, name) * self.center_momentum + mean * (1 - self.center_momentum))
        self.reset_sums()


def contrastive(student: torch.Tensor, teacher: torch.Tensor, sets: Selection, temperature: float = 0.2) -> torch.Tensor:
    """InfoNCE of each anchor's student embedding against the teacher embeddings of its positives and negatives.

    student, teacher: (B, N, E) L2-normalised embeddings of the same crop (``training.model``:
    the patch head's bottleneck of LN(token)). For anchor i and each positive p,
    ``ℓ(i, p) = −log exp(s_i·t_p/τ) / (exp(s_i·t_p/τ) + Σ_n exp(s_i·t_n/τ))`` over i's valid
    negatives n (other positives are not in the denominator); the loss is the mean over valid
    (anchor, positive) pairs. An anchor with no negative contributes 0.
    """
    scores = torch.bmm(student.float(), teacher.float().transpose(1, 2)) / temperature  # (B, N, N)
    positive = torch.gather(scores, 2, sets.positive.clamp(min=0))
    negative = torch.gather(scores, 2, sets.negative.clamp(min=0)).masked_fill(~sets.negative_valid, float("-inf"))
    denominator = torch.logaddexp(positive, torch.logsumexp(negative, dim=-1, keepdim=True))
    return (denominator - positive)[sets.positive_valid].mean()
