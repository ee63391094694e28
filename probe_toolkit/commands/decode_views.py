"""Which view a decoder preset was published on, and the one-line warning when a store's view is
not it: MaskCut's 480 × 480 LANCZOS keys, TokenCut's saliency table (its own script's view), and
the own-size views of LOST, DSM and TokenCut's object discovery."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..infra.settings import SettingError
from ..store import cache, own_size

# the views of each image at its own size, zero-padded up, cut down or resized to whole patches
# (store.own_size, torch-free), and how a warning names each
OWN_SIZE = own_size.DESCRIBED
# the view TokenCut's saliency table was computed on (unsupervised_saliency_detection/get_saliency.py)
SALIENCY_VIEW = {"tokencut": own_size.NATIVE_RESIZED}


def check_view(size: int | str) -> str:
    """``--view`` / ``--size``: an own-size view (native, native_crop, native_resized; ``-`` for ``_``
    accepted) or a fixed view's side in pixels (480 by default)."""
    view = str(size).strip().lower().replace("-", "_")
    if view not in OWN_SIZE and not view.isdigit():
        raise SettingError("view", f"view {view} is neither {', '.join(OWN_SIZE)} nor a side in pixels", "use view 480, native, native_crop or native_resized")
    return view


def published_view(preset: str, panel_kind: str | None = None) -> str:
    """The view a preset's numbers on this kind of panel were published with: PUBLISHED_VIEW (the
    CorLoc and AP code), except TokenCut's saliency table, which its own script computed on
    another view (``SALIENCY_VIEW``)."""
    from ..analyses.decoder_settings import PUBLISHED_VIEW

    if panel_kind == "saliency" and preset in SALIENCY_VIEW:
        return SALIENCY_VIEW[preset]
    return PUBLISHED_VIEW.get(preset, "")


def saliency_warning(view: str, manifest: dict[str, Any]) -> str:
    """The one line for TokenCut saliency scores on keys of a view other than its saliency script's."""
    p = int((manifest.get("arch") or {}).get("patch") or 16)
    return (
        f"TokenCut's saliency table (unsupervised_saliency_detection/get_saliency.py) resizes each image with LANCZOS to "
        f"round(·/{p})·{p}; these are the {view} view's keys: extract with --views native_resized and decode with --view native_resized to match it"
    )


def view_check(preset: str, size: int | str, manifest: dict[str, Any], panel_kind: str | None = None) -> dict[str, Any]:
    """The view a preset was published with on this kind of panel (``published_view``), and a
    warning when this store's view is not it."""
    published = published_view(preset, panel_kind)
    resample = str(cache.view_facts(manifest, "480").get("resample") or manifest.get("resample") or "bicubic")
    warnings = []
    if preset == "maskcut" and resample != "lanczos":
        warnings.append(
            f"--preset maskcut was published on 480 × 480 LANCZOS keys; this store's {size} view is {resample} "
            "(MaskCut's masks change with the filter): extract with --views 480 --resample lanczos to match it"
        )
    elif panel_kind == "saliency" and preset in SALIENCY_VIEW and str(size) != published:
        warnings.append(saliency_warning(str(size), manifest))
    elif published in OWN_SIZE and str(size) != published:
        warnings.append(f"--preset {preset} was published on each image at its own size, {OWN_SIZE[published]}; these are the {size} view's keys")
    return {"published_view": published, "warnings": warnings}


def panel_kind(panel: str | None, cache_dir: str | Path | None) -> str | None:
    """The kind of a registered panel (coco, voc, coco20k, saliency), None without one: which
    published view a run's scores are to be compared with."""
    from ..labels.panels import get_panel

    return get_panel(panel, cache_dir).kind if panel is not None else None
