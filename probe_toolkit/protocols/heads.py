"""What the protocols that train a head on the network's own crops share (``linear-segmentation``,
``linear-depth``): settings read against a preset's published values."""

from __future__ import annotations

from ..infra.settings import Settings

UNSCORED = ("seed", "chunk", "figure_images")  # settings that change no published value


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
