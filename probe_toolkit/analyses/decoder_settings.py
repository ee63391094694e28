"""The decoder's settings: one frozen ``Settings`` per run, filled from a named preset (the
published method it reproduces), and the view each preset's numbers were published with.
The procedure they drive is described in ``decoder.py``'s docstring."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ..infra.errors import ProbeError
from ..infra.settings import SettingError

RULES = ("tokencut", "maskcut", "lost", "dsm")
TIES = ("argsort", "lowest-index")  # LOST: how equal degrees rank: its torch.argsort's order on the CPU, or by patch index (analyses/lost.py)
SINGLE = ("lost", "dsm")  # rules that are not a cut: one mask, τ, ε and the mask count unused
PRESETS: dict[str, dict] = {
    # centred keys (each image's mean key subtracted), otherwise TokenCut's graph and rule, τ = 0.2
    "centred": dict(center=True, rule="tokencut", tau=0.2, eps=1e-5, masks=1),
    # TokenCut exactly: uncentred keys, τ = 0.2, ε = 1e-5 (TokenCut README and argparse)
    "tokencut": dict(center=False, rule="tokencut", tau=0.2, eps=1e-5, masks=1),
    # MaskCut: τ = 0.15 (README, submitit script; maskcut.py's argparse says 0.2), N = 3
    "maskcut": dict(center=False, rule="maskcut", tau=0.15, eps=1e-5, masks=3),
    # LOST: raw keys, k = 100, equal degrees ranked as its torch.argsort ranks them on the CPU (valeoai/LOST main_lost.py,
    # object_discovery.py); analyses/lost.py
    "lost": dict(center=False, rule="lost", tau=0.0, eps=1e-5, masks=1, k_patches=100, ties="argsort"),
    # Deep Spectral Methods: unit keys, positive affinity, Fiedler vector > 0 (extract.py, object_discovery.py)
    "dsm": dict(center=False, rule="dsm", tau=0.0, eps=1e-5, masks=1),
}
# the view each preset's numbers were published with (TokenCut/LOST: the image at its own size,
# zero-padded to whole patches, main_tokencut.py / main_lost.py; DSM: cut to whole patches,
# extract/extract.py and object-localization/main.py --eigenseg; MaskCut: squashed to 480 × 480 with LANCZOS)
# TokenCut's saliency table was computed on another view, the whole image resized with LANCZOS to
# round(side/p) patches (unsupervised_saliency_detection/get_saliency.py): native_resized, which
# commands.decode.published_view names for saliency panels
PUBLISHED_VIEW = {"centred": "480", "tokencut": "native", "maskcut": "480 lanczos", "lost": "native", "dsm": "native_crop"}


@dataclass(frozen=True)
class Settings:
    """One decoder setting; ``Settings.from_preset`` fills the preset's defaults."""

    preset: str = "centred"
    center: bool = True
    rule: str = "tokencut"
    tau: float = 0.2
    eps: float = 1e-5
    masks: int = 1
    overlap: float = 0.5  # MaskCut: stop when IoU(new, previous) > 0.5
    min_area: float = 0.01  # MaskCut: stop when a new mask covers ≤ 1 % of the patches
    gap_tol: float = 1e-6  # flag an image whose eigengap (on λ ∈ [0, 2]) is below this
    seed: int = 0  # ARPACK's start vector
    k_patches: int = 100  # LOST: lowest-degree patches of the seed expansion
    ties: str = "argsort"  # LOST: how equal degrees rank (TIES)
    color_lambda: float = 0.0  # DSM: weight of the KNN colour affinity (0 as published in extract_eigs)

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise _unknown_preset(self.preset)
        if self.rule not in RULES:
            raise ProbeError(None, f"rule {self.rule!r} is not one of {', '.join(RULES)}", "use tokencut or maskcut")
        if not -1.0 <= self.tau < 1.0:
            raise SettingError("tau", f"tau must lie in [-1, 1), got {self.tau!r}", "use e.g. tau=0.2 (a cosine)")
        if not 0.0 < self.eps < 1.0:
            raise SettingError("eps", f"eps must lie in (0, 1), got {self.eps!r}", "use eps=1e-5 (ε keeps the graph connected)")
        if self.masks < 1:
            raise SettingError("masks", f"masks must be at least 1, got {self.masks!r}", "use masks=1")
        if self.color_lambda and self.rule != "dsm":
            raise SettingError("color_lambda", f"color_lambda applies to the dsm preset, not {self.preset}", "drop color_lambda")
        if self.ties not in TIES:
            raise SettingError("ties", f"ties must be one of {', '.join(TIES)}, got {self.ties!r}", "use ties='argsort' (LOST's order)")
        if self.rule in SINGLE and self.masks != 1:
            raise SettingError("masks", f"the {self.preset} preset finds one object per image, not masks={self.masks}", "drop masks")

    @classmethod
    def from_preset(cls, preset: str = "centred", **overrides) -> Settings:
        """The preset's defaults, with every override that is not None applied."""
        if preset not in PRESETS:
            raise _unknown_preset(preset)
        values = dict(PRESETS[preset], preset=preset)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def as_dict(self) -> dict:
        return asdict(self)

    def with_(self, **changes) -> Settings:
        return replace(self, **changes)


def _unknown_preset(preset: str) -> SettingError:
    return SettingError("preset", f"preset must be one of {', '.join(PRESETS)}, got {preset!r}", "use preset='centred'")
