"""SelfPatch's network: the toolkit's backbone, the aggregation module and two DINO heads.

Keys match SelfPatch's ``MultiCropWrapper`` exactly (``backbone.*``, ``ca_head.*``, ``c_head.*``,
``p_head.*``; alinlab/SelfPatch ``main_selfpatch.py`` and ``vision_transformer.py``), so released heads load and what this
trainer saves loads in SelfPatch's code. The backbone is ``probe_toolkit.store.backbone.Backbone``
(timm's ViT, no class token, no final norm); nothing here is a second ViT.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from timm.layers import DropPath, Mlp
from torch import nn
from torch.nn.utils import parametrizations

from probe_toolkit.store.architectures import Arch
from probe_toolkit.store.backbone import Backbone

from .config import ModelCfg

EPS = 1e-6  # every LayerNorm of DINO and SelfPatch


def layer_norm(width: int) -> nn.LayerNorm:
    return nn.LayerNorm(width, eps=EPS)


class ClassAttention(nn.Module):
    """Attention in which only the query (row 0) asks: separate q, k, v Linears, as SelfPatch's ``Class_Attention``.

    ``valid`` (M, K) masks set members out (the threshold rule gives anchors 0..8 positives); the
    query always attends to itself, as in SelfPatch's masked path.
    """

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)

    def forward(self, u: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        m, t, d = u.shape
        split = lambda x: x.reshape(m, -1, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        mask = None
        if valid is not None:
            mask = torch.cat([valid.new_ones(m, 1), valid], dim=1)[:, None, None, :]
        out = F.scaled_dot_product_attention(split(self.q(u[:, :1])), split(self.k(u)), split(self.v(u)), attn_mask=mask)
        return self.proj(out.transpose(1, 2).reshape(m, 1, d))


class ClassAttentionBlock(nn.Module):
    """CaiT's class-attention block as SelfPatch uses it: no LayerScale gammas, only the query moves.

    ``u = norm1([query; tokens])``; the query asks (scaled by head_dim^-0.5), every row answers;
    ``query += proj(attn)``, then ``query += mlp(norm2(query))``. The tokens are never updated.
    Keys: ``norm1``, ``attn.{q,k,v,proj}``, ``norm2``, ``mlp.fc1/fc2``.
    """

    def __init__(self, width: int, heads: int, mlp_hidden: int):
        super().__init__()
        self.norm1 = layer_norm(width)
        self.attn = ClassAttention(width, heads)
        self.norm2 = layer_norm(width)
        self.mlp = Mlp(width, hidden_features=mlp_hidden, act_layer=nn.GELU)

    def forward(self, tokens: torch.Tensor, query: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """tokens (M, K, D), query (M, 1, D), valid (M, K) or None → refined query (M, 1, D)."""
        query = query + self.attn(self.norm1(torch.cat([query, tokens], dim=1)), valid)
        return query + self.mlp(self.norm2(query))


class AggregationModule(nn.Module):
    """SelfPatch's ``SelfPatchHead``: a learned query summarises a set of tokens in 2 class-attention blocks.

    Run on all of a crop's tokens it makes the image token (in place of DINO's class token); run
    on an anchor's positives it makes that anchor's patch target. A final LayerNorm closes both.
    3,550,080 parameters at ViT-S.
    """

    def __init__(self, width: int, heads: int, mlp_hidden: int, blocks: int = 2):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.cls_blocks = nn.ModuleList(ClassAttentionBlock(width, heads, mlp_hidden) for _ in range(blocks))
        self.norm = layer_norm(width)

    def summarise(self, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """(M, K, D) sets → (M, D) summaries, before the final norm; both blocks read the same set."""
        query = self.cls_token.expand(tokens.shape[0], -1, -1)
        for block in self.cls_blocks:
            query = block(tokens, query, valid)
        return query[:, 0]

    def forward(self, tokens: torch.Tensor, positives: torch.Tensor | None = None, valid: torch.Tensor | None = None) -> torch.Tensor:
        """``norm([image token; patch part])``: (B, 1 + N, D).

        ``positives`` None (the student, SelfPatch's ``loc=False``): the patch part is each patch's
        own token. ``positives`` (B, N, k) indices (the teacher, ``loc=True``): the patch part is the
        summary of each anchor's positives (un-normalised tokens), from the shared learned query;
        ``valid`` (B, N, k) masks padding out (variable-size sets of the threshold rule).
        """
        image = self.summarise(tokens)[:, None]
        if positives is None:
            return self.norm(torch.cat([image, tokens], dim=1))
        b, n, d = tokens.shape
        sets = gather_tokens(tokens, positives.clamp(min=0))  # (B, N, k, D); -1 padding reads patch 0, masked
        mask = valid.reshape(b * n, -1) if valid is not None else None
        targets = self.summarise(sets.reshape(b * n, -1, d), mask).reshape(b, n, d)
        return self.norm(torch.cat([image, targets], dim=1))


def gather_tokens(tokens: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """tokens (B, N, D), index (B, N, k) patch indices → (B, N, k, D)."""
    b, n, k = index.shape
    flat = torch.gather(tokens, 1, index.reshape(b, n * k, 1).expand(-1, -1, tokens.shape[-1]))
    return flat.reshape(b, n, k, tokens.shape[-1])


class DINOHead(nn.Module):
    """DINO's projection head: MLP (Linear, GELU, Linear, GELU, Linear), L2-normalise, weight-normed prototypes.

    Keys ``mlp.0/2/4`` and ``last_layer.weight_g`` (P, 1) / ``last_layer.weight_v`` (P, bottleneck)
    in checkpoints (see ``training.state`` for the one place the names are mapped); inside, torch's
    ``parametrizations.weight_norm`` holds g as ``original0`` and v as ``original1``.
    """

    def __init__(self, width: int, prototypes: int, hidden: int = 2048, bottleneck: int = 256, norm_last_layer: bool = True):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, bottleneck))
        self.last_layer = parametrizations.weight_norm(nn.Linear(bottleneck, prototypes, bias=False), dim=0)
        with torch.no_grad():
            self.last_layer.parametrizations.weight.original0.fill_(1.0)
        if norm_last_layer:
            self.last_layer.parametrizations.weight.original0.requires_grad_(False)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The L2-normalised bottleneck (…, bottleneck): the point on the sphere the prototypes score."""
        return F.normalize(self.mlp(x), dim=-1, p=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last_layer(self.embed(x))


@dataclass
class Output:
    """One network's outputs for one group of crops of the same size (B crops of N patches)."""

    image: torch.Tensor  # (B, image_prototypes) scores of the image token
    patch: torch.Tensor | None = None  # (B, N, patch_prototypes) scores, or (B, N, bottleneck) embeddings


class Network(nn.Module):
    """Backbone + ``ca_head`` + ``c_head`` + ``p_head``, SelfPatch's ``MultiCropWrapper``.

    ``forward`` takes crops grouped by size (one batched backbone pass per size) and returns one
    ``Output`` per group. ``patch`` selects what the patch side returns: ``"logits"`` (SelfPatch's
    patch head scores), ``"embedding"`` (the patch head's L2-normalised bottleneck: the contrastive
    rule's embedding) or ``None``. The student runs ``forward`` (each patch from its own token);
    the teacher runs ``tokens`` then ``heads`` with the rule's ``positives`` (B, N, k).
    """

    def __init__(self, arch: Arch, model: ModelCfg):
        super().__init__()
        self.arch = arch
        self.backbone = Backbone(arch)
        self.ca_head = AggregationModule(arch.width, arch.heads, arch.mlp_hidden, model.aggregation_blocks)
        self.c_head = DINOHead(arch.width, model.image_prototypes, model.head_hidden, model.bottleneck, model.norm_last_layer)
        self.p_head = DINOHead(arch.width, model.patch_prototypes, model.head_hidden, model.bottleneck, model.norm_last_layer)

    def tokens(self, crops: torch.Tensor) -> torch.Tensor:
        return self.backbone(crops)

    def heads(self, tokens: torch.Tensor, patch: str | None = "logits", positives: torch.Tensor | None = None, valid: torch.Tensor | None = None) -> Output:
        """Image scores and the patch side from backbone tokens (B, N, D); see the class docstring."""
        summary = self.ca_head(tokens, positives, valid)
        image = self.c_head(summary[:, 0])
        if patch == "logits":
            return Output(image, self.p_head(summary[:, 1:]))
        if patch == "embedding":
            return Output(image, self.p_head.embed(summary[:, 1:]))
        return Output(image)

    def forward(self, groups: list[torch.Tensor], patch: str | None = "logits") -> list[Output]:
        """The student's pass: each group of same-size crops through the backbone and the heads."""
        return [self.heads(self.tokens(crops), patch) for crops in groups]


def training_arch(model: ModelCfg) -> Arch:
    """The backbone shape for a random start: SelfPatch-style, no class token, no final norm."""
    return Arch(width=model.width, depth=model.depth, heads=model.heads, patch=model.patch, class_token=False, final_norm=False, pos_grid=14, mlp_hidden=model.mlp_hidden)


def selfpatch_arch(arch: Arch) -> Arch:
    return replace(arch, class_token=False, final_norm=False)


def set_drop_path(backbone: Backbone, rate: float) -> None:
    """Stochastic depth on the student, DINO's linear rule ``linspace(0, rate, depth)``.

    DropPath modules hold no parameters, so the student's and teacher's state dicts stay equal.
    """
    rates = torch.linspace(0, rate, len(backbone.vit.blocks)).tolist()
    for block, r in zip(backbone.vit.blocks, rates):
        block.drop_path1 = DropPath(r) if r > 0 else nn.Identity()
        block.drop_path2 = DropPath(r) if r > 0 else nn.Identity()


@torch.no_grad()
def init_random(network: Network) -> None:
    """DINO's and SelfPatch's init: trunc-normal(0.02) for Linear weights, position table and query; 0 biases; LayerNorm 1/0.

    The patch-embedding convolution keeps PyTorch's default, as in both codes. Prototype lengths
    g are 1 and their directions v keep ``nn.Linear``'s default (Kaiming-uniform, a = √5): both
    codes apply their init before the weight-normed last layer exists (DINO's and SelfPatch's
    ``DINOHead.__init__``), so it never reaches v; a trunc-normal(0.02) v would be about half as
    long and take steps about 1.8 times larger under weight norm.
    """
    for module in network.modules():
        if isinstance(module, nn.Linear) and not parametrizations_of(module):
            nn.init.trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    nn.init.trunc_normal_(network.backbone.vit.pos_embed, std=0.02)
    nn.init.trunc_normal_(network.ca_head.cls_token, std=0.02)
    for head in (network.c_head, network.p_head):
        weight = head.last_layer.parametrizations.weight
        nn.init.kaiming_uniform_(weight.original1, a=math.sqrt(5))  # nn.Linear.reset_parameters
        weight.original0.fill_(1.0)


def parametrizations_of(module: nn.Module) -> bool:
    return hasattr(module, "parametrizations")


def last_layer_parameters(network: nn.Module) -> list[nn.Parameter]:
    """The prototype layers of both heads (frozen during ``freeze_last_layer`` epochs)."""
    return [p for name, p in network.named_parameters() if ".last_layer." in f".{name}"]
