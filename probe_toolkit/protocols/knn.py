"""``knn``: DINO's weighted k-NN classifier on frozen features, top-1 and top-5 for every k."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import Settings, at_least, one_of, positive
from .registry import Protocol, Reads, Reference, register

FEATURES = ("auto", "cls-normed", "cls", "mean")


@dataclass(frozen=True)
class KnnSettings(Settings):
    ks: tuple[int, ...] | None = None  # None: DINO's eval_knn.py nb_knn (10, 20, 100, 200), narrowed to the train panel's size
    temperature: float = 0.07  # DINO's eval_knn.py
    feature: str = "auto"

    def check(self) -> None:
        if self.ks is not None:
            if not self.ks:
                at_least("ks", 0, 1)
            for k in self.ks:
                at_least("ks", k, 1)
        positive("temperature", self.temperature)
        one_of("feature", self.feature, FEATURES)


def execute(settings: KnnSettings, placement, *, store, train, val, unseal=None, cache_dir=None, json_path=None, progress=None, **_):
    from ..commands.knn import run_knn

    return run_knn(store, train, val, ks=None if settings.ks is None else list(settings.ks), temperature=settings.temperature, feature=settings.feature, unseal=unseal, cache_dir=cache_dir,
                   json_path=json_path, progress=progress, placement=placement)


PROTOCOL = register(Protocol(
    name="knn",
    summary="DINO's weighted k-NN on frozen features (class token through the final norm by default): top-1 and top-5 for every k.",
    settings=KnnSettings,
    reads=Reads(arrays=("cls_tokens_eval224", "tokens_eval224", "cls_tokens_224", "tokens_224"), views=("eval224", "224"), labels=True, panel_kinds=("classes", "coco")),
    results=("knn",),
    references=(Reference("Caron et al., Emerging Properties in Self-Supervised Vision Transformers (ICCV 2021)", "facebookresearch/dino eval_knn.py"),),
    differences="Exact top-k in numpy with a stated tie rule (equal cosines go to the lower train index), where DINO's script leaves ties to torch.topk.",
    execute=execute,
))
