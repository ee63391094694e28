"""What the protocols that train a head on the network's own crops share (``linear-segmentation``,
``linear-depth``): settings read against a preset's published values."""

from __future__ import annotations

from pathlib import Path

from ..infra.settings import SettingError, Settings

UNSCORED = ("seed", "chunk", "figure_images")  # settings that change no published value


def unextracted(target: Path, run: str) -> SettingError:
    """The store that keeps a head's record was not extracted: ``run`` (the ``probe extract`` that
    makes it, in backticks), or another store (``store=`` from Python, ``--store`` on the command line)."""
    return SettingError("store", "was not written by probe extract for this checkpoint (the record is kept with its tokens)", f"{run}, or pass store=STORE", target)


class PresetSettings(Settings):
    """A protocol's settings whose ``None`` fields take a preset's published values (``resolved``)."""

    preset: str

    @property
    def resolved(self) -> dict:  # overridden: the values the run uses, the preset's filled in
        return self.as_dict()

    def unpublished(self) -> list[str]:
        """The settings that differ from the preset's published values (the seed, the network's
        chunk and the figure's images change no published value)."""
        published = type(self)(preset=self.preset).resolved
        mine = self.resolved
        return [k for k in mine if k not in UNSCORED and mine[k] != published[k]]
