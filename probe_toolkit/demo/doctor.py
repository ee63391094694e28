"""``probe doctor``: is this machine ready? Versions, threads, device, cache, browser."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..infra.provenance import library_versions

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    required: bool = True


def find_browser() -> str | None:
    """Headless Chromium for the report explorer's test (``PROBE_CHROMIUM`` overrides)."""
    explicit = os.environ.get("PROBE_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def checks(cache_root: Path) -> list[Check]:
    import torch

    out = []
    versions = library_versions()
    for name in ("torch", "timm", "zarr", "xarray", "pycocotools", "numpy", "scipy", "scikit-learn"):
        out.append(Check(name, versions[name] != "absent", versions[name]))
    try:
        import timm  # noqa: F401
        import torchvision  # noqa: F401

        out.append(Check("import timm", True, "timm and torchvision import"))
    except Exception as error:  # the torchvision::nms trap of a mismatched wheel lands here
        out.append(Check("import timm", False, f"{type(error).__name__}: {error}"))
    out.append(Check("threads", True, f"torch {torch.get_num_threads()} intra-op threads, {os.cpu_count()} CPUs"))
    if torch.cuda.is_available():
        device = f"cuda: {torch.cuda.get_device_name(0)} ({torch.cuda.device_count()} visible)"
    else:
        device = "cpu (no CUDA device visible)"
    out.append(Check("device", True, device, required=False))
    try:
        cache_root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cache_root):
            pass
        free = shutil.disk_usage(cache_root).free / 2**30
        out.append(Check("cache root", True, f"{cache_root.resolve()} writable, {free:.1f} GiB free"))
    except OSError as error:
        out.append(Check("cache root", False, f"{cache_root}: {error}"))
    browser = find_browser()
    out.append(Check("chromium", browser is not None, browser or "not found: `apt-get install chromium` for the explorer test", required=False))
    return out
