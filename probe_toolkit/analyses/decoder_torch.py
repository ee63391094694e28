"""The decoder on torch: a batch of images at once, on the CPU or a GPU (``--backend torch``).

Same procedure, same certification as ``decoder.decode_image`` (read its docstring first); only
the two costly steps run batched on the device:

- The graph. Cosines of the unit keys in float32 (one ``bmm`` per batch); every entry within the
  float32 error band of τ is recomputed in float64, so the graph is float64's. An image with a
  float64 cosine within float64's own error band of τ (about 1e-13) could be decided otherwise
  by another summation order (the scipy path's ``einsum``), so it is flagged ``degenerate``.
- The Fiedler vector: the second eigenvector y of 𝒩 = D^-½ W D^-½, whose top eigenvector D^½1
  is known. Graphs up to ``DENSE_UP_TO`` patches (a 480 view at /16 has 900), and any image whose
  iteration does not settle, get a batched dense float64 ``eigh`` of 𝒩 (what a GPU does fastest
  at that size); larger ones (MaskCut's 3,600) a batched LOBPCG on 𝒩 − ttᵀ (block of 8, float64,
  Rayleigh–Ritz on [X, R, P]) run until every image's residual of y is small and that of the
  next vector sizes the eigengap. x = D^-½ y.

Orientation, threshold, foreground rule, component, score and the certificate are decoder.py's
own functions on the CPU, so a certified mask here is the exact mask, as the scipy path's is.
LOST and DSM (no cut) run batched in ``decoder_single_torch``.
Runs with one CPU thread by default so results do not depend on how many processes share a
machine. The own-size views (a grid per image) batch the images of each grid together
(``decode_grids``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from ..infra.errors import ProbeError
from .decoder import ImageMasks, decode_image, grid_of
from .decoder_cut import Cut
from .decoder_masks import certified_cut, iou, mask_score, shape_of
from .decoder_settings import SINGLE, Settings

DENSE_UP_TO = 1024  # up to this many patches a dense eigh beats LOBPCG on the clustered spectra of key graphs
MEMORY = 2**29  # bytes of float64 N × N matrices one sub-batch may hold on the device
TOL = 1e-9  # LOBPCG: residual of y at which an image stops (‖𝒩‖ ≤ 1); the certificate takes the rest
SETTLED = 1e-8  # larger residuals than this go to the dense solver, as on the scipy path
MAX_ITER = 400
BLOCK = 8  # vectors per image: the gap to the 9th eigenvalue, not the 3rd, sets the rate


@contextmanager
def cpu_threads(n: int | None) -> Iterator[None]:
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def unit_keys(keys: torch.Tensor, center: bool) -> torch.Tensor:
    """(B, N, C) float64: centred (optionally) and L2-normalised; a zero key stays zero."""
    if center:
        keys = keys - keys.mean(dim=1, keepdim=True)
    norm = keys.norm(dim=2, keepdim=True)
    return torch.where(norm > 0, keys / torch.where(norm > 0, norm, 1.0), 0.0)


class Graphs:
    """The float32 cosines of a batch, decided exactly near τ on each round's painted set."""

    def __init__(self, unit: torch.Tensor):
        self.unit = unit
        f32 = unit.float()
        self.approx = torch.bmm(f32, f32.transpose(1, 2))
        c = unit.shape[2]
        self.band32 = 2.0 * (c + 2) * float(np.finfo(np.float32).eps)
        self.band64 = 2.0 * (c + 2) * float(np.finfo(np.float64).eps)

    def adjacency(self, which: torch.Tensor, tau: float, painted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(adjacency (b, N, N) bool, tie (b,) bool) for images ``which`` with ``painted`` (b, N)."""
        approx = self.approx[which]
        a = approx > tau
        near = (approx - tau).abs() <= self.band32
        if painted.any():
            out = painted[:, :, None] | painted[:, None, :]
            a = torch.where(out, torch.tensor(0.0 > tau, device=a.device), a)
            near &= ~out
        b, i, j = torch.nonzero(near, as_tuple=True)
        tie = torch.zeros(len(which), dtype=torch.bool, device=a.device)
        if b.numel():
            unit = self.unit[which]
            exact = (unit[b, i] * unit[b, j]).sum(dim=1)
            a[b, i, j] = exact > tau
            close = (exact - tau).abs() <= self.band64
            tie[b[close]] = True
        return a, tie


def normalized(a: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(𝒩 dense (b, N, N) float64, D^-½ (b, N), unit top vector D^½1/‖·‖ (b, N))."""
    n = a.shape[1]
    count = a.sum(dim=2, dtype=torch.float64)
    degree = count + eps * (n - count)
    scale = degree.rsqrt()
    w = torch.where(a, 1.0, eps).to(torch.float64)
    normal = scale[:, :, None] * w * scale[:, None, :]
    top = degree.sqrt()
    return normal, scale, top / top.norm(dim=1, keepdim=True)


def _dense(normal: torch.Tensor) -> list[tuple[float, float, float, float, np.ndarray]]:
    """(μ2, μ3, residual, r3 = residual, y) per image from a full ``eigh`` (TokenCut's exact solve)."""
    values, vectors = torch.linalg.eigh(normal)
    y = vectors[:, :, -2]
    mu2, mu3 = values[:, -2], values[:, -3]
    residual = (torch.bmm(normal, y[:, :, None])[:, :, 0] - mu2[:, None] * y).norm(dim=1)
    return [(float(mu2[k]), float(mu3[k]), float(residual[k]), float(residual[k]), y[k].cpu().numpy()) for k in range(len(y))]


def _orthonormal(basis: torch.Tensor, against: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis of ``basis`` with ``against``'s span removed (twice, for rounding)."""
    for _ in range(2):
        basis = basis - against @ (against.transpose(1, 2) @ basis)
        basis = torch.linalg.qr(basis).Q
    return basis


def _lobpcg(normal: torch.Tensor, top: torch.Tensor, start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Largest eigenpairs of 𝒩 − ttᵀ by a batched LOBPCG: (θ (b, k) descending, X (b, N, k), ‖r‖ (b, k)).

    ttᵀ moves the known eigenvalue 1 to 0, inside the bulk (not to −1: a wider spectrum slows
    LOBPCG, whose rate is set by the gap relative to the spectrum's width).
    """

    def apply(v: torch.Tensor) -> torch.Tensor:
        return torch.bmm(normal, v) - top[:, :, None] * (top[:, None, :] @ v)

    x = start.expand(normal.shape[0], -1, -1).clone()
    x = x - top[:, :, None] * (top[:, None, :] @ x)
    x = torch.linalg.qr(x).Q
    ax = apply(x)
    p = None
    k = x.shape[2]
    for _ in range(MAX_ITER):
        theta, c = torch.linalg.eigh(x.transpose(1, 2) @ ax)
        theta, c = theta.flip(-1), c.flip(-1)
        x, ax = x @ c, ax @ c
        r = ax - x * theta[:, None, :]
        rnorm = r.norm(dim=1)
        gap = theta[:, 0] - theta[:, 1]
        if bool(((rnorm[:, 0] <= TOL) & (rnorm[:, 1] <= torch.clamp(0.25 * gap, min=TOL))).all()):
            break
        extra = _orthonormal(r if p is None else torch.cat([r, p], dim=2), x)
        q = torch.cat([x, extra], dim=2)
        aq = torch.cat([ax, apply(extra)], dim=2)
        t = q.transpose(1, 2) @ aq
        w, z = torch.linalg.eigh(0.5 * (t + t.transpose(1, 2)))
        z = z.flip(-1)[:, :, :k]
        p = extra @ z[:, k:, :]
        x, ax = q @ z, aq @ z
    theta, c = torch.linalg.eigh(x.transpose(1, 2) @ ax)
    theta, c = theta.flip(-1), c.flip(-1)
    x, ax = x @ c, ax @ c
    return theta, x, (ax - x * theta[:, None, :]).norm(dim=1)


def cuts(normal: torch.Tensor, scale: torch.Tensor, top: torch.Tensor, seed: int, dense_up_to: int = DENSE_UP_TO) -> list[Cut]:
    """The Fiedler cut of every graph of the batch (see the module docstring)."""
    n = normal.shape[1]
    solved: list[tuple | None] = [None] * normal.shape[0]
    names = ["dense"] * normal.shape[0]
    if n > dense_up_to:
        start = torch.from_numpy(np.random.default_rng(seed).standard_normal((n, BLOCK))).to(normal)
        theta, x, rnorm = _lobpcg(normal, top, start)
        y = x[:, :, 0]
        off = (y * top).sum(dim=1).abs()
        for k in range(normal.shape[0]):
            if float(rnorm[k, 0]) <= SETTLED and float(off[k]) <= 1e-6:
                solved[k] = (float(theta[k, 0]), float(theta[k, 1]), float(rnorm[k, 0]), float(rnorm[k, 1]), y[k].cpu().numpy())
                names[k] = "lobpcg"
    rest = [k for k, s in enumerate(solved) if s is None]
    if rest:
        for k, s in zip(rest, _dense(normal[rest])):
            solved[k] = s
    scale_np = scale.cpu().numpy()
    out = []
    for k, (mu2, mu3, residual, r3, y) in enumerate(solved):
        out.append(Cut(x=scale_np[k] * y, lambda2=1.0 - mu2, lambda3=1.0 - mu3, lambda3_low=1.0 - mu3 - r3, residual=residual, solver=names[k]))
    return out


def _ncut(a: torch.Tensor, eps: float, degree: np.ndarray, mask: np.ndarray) -> float:
    """decoder.ncut_value on the device's adjacency: cut/vol(M) + cut/vol(M̄), 2 when either is empty."""
    m = mask.astype(np.float64)
    vol = float(degree @ m)
    rest = float(degree.sum()) - vol
    if vol <= 0 or rest <= 0 or not mask.any() or mask.all():
        return 2.0
    mt = torch.from_numpy(m).to(a.device)
    wm = (1.0 - eps) * (a.to(torch.float64) @ mt) + eps * mt.sum()
    cut = vol - float(mt @ wm)
    return max(cut, 0.0) / vol + max(cut, 0.0) / rest


def _check(keys: np.ndarray) -> None:
    if keys.ndim != 3 or keys.shape[1] < 4:
        raise ProbeError(None, f"keys of shape {keys.shape} are not (image, patch ≥ 4, channel)", "pass keys_480")
    if not np.isfinite(keys).all():
        raise ProbeError(None, "keys hold NaN or inf", "re-extract the image (its row in the store is unfinished?)")


def decode_batch(
    keys: np.ndarray,
    settings: Settings = Settings(),
    *,
    device: str = "cpu",
    threads: int | None = 1,
    dense_up_to: int = DENSE_UP_TO,
    grid: tuple[int, int] | None = None,
) -> list[ImageMasks]:
    """Masks of every image of ``keys`` (image, patch, channel), as ``decoder.decode_image`` would.

    ``dense_up_to``: the largest graph solved by dense ``eigh`` (larger: LOBPCG). ``grid``: the
    (rows, cols) every image of the batch lies on (square from the patch count by default).
    """
    keys = np.asarray(keys)
    _check(keys)
    b, n, _ = keys.shape
    per = max(1, MEMORY // (8 * n * n))
    shape = grid or grid_of(n)
    with cpu_threads(threads if device == "cpu" else None), torch.no_grad():
        out: list[ImageMasks] = []
        for start in range(0, b, per):
            if settings.rule in SINGLE:  # LOST and DSM: no cut (decoder_single_torch)
                from .decoder_single_torch import decode_single_batch

                out += decode_single_batch(keys[start : start + per], settings, torch.device(device), shape_of(shape))
            else:
                out += _decode(keys[start : start + per], settings, torch.device(device), dense_up_to, shape)
        return out


def decode_grids(
    keys: np.ndarray, rows: np.ndarray, cols: np.ndarray, settings: Settings = Settings(), *, device: str = "cpu", threads: int | None = 1
) -> list[ImageMasks]:
    """The own-size views (a grid per image, keys padded past rows·cols): images of one grid are
    batched together, each on its first rows·cols patches; results in image order."""
    keys = np.asarray(keys)
    out: list[ImageMasks | None] = [None] * len(keys)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (r, c) in enumerate(zip(rows, cols)):
        groups.setdefault((int(r), int(c)), []).append(i)
    for (r, c), where in groups.items():
        if r * c < 4:  # too few patches for a batched solve: the scipy path's own function
            found = [decode_image(keys[i, : r * c], settings, grid=(r, c)) for i in where]
        else:
            found = decode_batch(keys[where, : r * c], settings, device=device, threads=threads, grid=(r, c))
        for i, result in zip(where, found):
            out[i] = result
    return out


def _decode(keys: np.ndarray, settings: Settings, device: torch.device, dense_up_to: int, grid: int | tuple[int, int]) -> list[ImageMasks]:
    b, n, _ = keys.shape
    graphs = Graphs(unit_keys(torch.from_numpy(keys.astype(np.float64)).to(device), settings.center))
    painted = np.zeros((b, n), dtype=bool)
    rows: list[list[tuple]] = [[] for _ in range(b)]
    previous: list[np.ndarray | None] = [None] * b
    degenerate = np.zeros(b, dtype=bool)
    stop = ["count"] * b
    solved = np.zeros(b, dtype=int)
    active = list(range(b))
    firsts: list[tuple[np.ndarray, int] | None] = [None] * b
    for t in range(settings.masks):
        if t > 0:
            for i in [i for i in active if (~painted[i]).sum() <= settings.min_area * n]:
                stop[i] = "exhausted"
                active.remove(i)
        if not active:
            break
        which = torch.tensor(active, device=device)
        a, tie = graphs.adjacency(which, settings.tau, torch.from_numpy(painted[active]).to(device))
        normal, scale, top = normalized(a, settings.eps)
        found_cuts = cuts(normal, scale, top, settings.seed, dense_up_to)
        del normal
        degree = 1.0 / scale.cpu().numpy() ** 2
        tie = tie.cpu().numpy()
        for slot, i in enumerate(list(active)):
            cut = found_cuts[slot]
            solved[i] += 1
            x, seed, found, ok = certified_cut(cut, scale[slot].cpu().numpy(), grid, settings)
            firsts[i] = firsts[i] or (x, seed)  # the first cut's vector and seed, as the scipy path keeps them
            degenerate[i] |= bool(tie[slot]) or not ok
            reason = None
            if previous[i] is not None:
                if iou(found, previous[i]) > settings.overlap:
                    reason = "overlap"
                elif found.sum() <= settings.min_area * n:
                    reason = "small"
            mask = found & ~painted[i]
            if reason is None and not mask.any():
                reason = "covered"
            if reason is not None:
                stop[i] = reason
                active.remove(i)
                continue
            ncut = _ncut(a[slot], settings.eps, degree[slot], mask)
            rows[i].append((mask, mask_score(cut, ncut), cut.lambda2, cut.lambda3, cut.gap, ncut, cut.solver))
            previous[i] = found
            painted[i] |= found
    out = []
    for i in range(b):
        masks, score, lam2, lam3, gap, ncut, solver = zip(*rows[i])
        out.append(
            ImageMasks(
                masks=np.stack(masks),
                score=np.array(score),
                lambda2=np.array(lam2),
                lambda3=np.array(lam3),
                gap=np.array(gap),
                ncut=np.array(ncut),
                solver=list(solver),
                degenerate=bool(degenerate[i]),
                stop=stop[i],
                cuts=int(solved[i]),
                fiedler=None if firsts[i] is None else firsts[i][0].astype(np.float32),
                seed=-1 if firsts[i] is None else int(firsts[i][1]),
            )
        )
    return out
