"""Companion training: DINO, SelfPatch and the contrastive rule, writing checkpoints ``probe extract`` reads.

From Python::

    from training import train
    run = train("tiny", {"data.images": "photos/", "run.out": "runs/tiny", "optim.epochs": 4})
    run.checkpoint  # runs/tiny/checkpoint.pth, SelfPatch's full layout

From the shell: ``python -m training CONFIG.toml [--set section.key=value ...]`` or ``probe train``.
"""

from .config import Config, load_config
from .loop import LOG_FIELDS, Run, train

__all__ = ["Config", "LOG_FIELDS", "Run", "load_config", "train"]
