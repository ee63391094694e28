"""``knn``: DINO's weighted k-NN classifier on frozen features, top-1 and top-5 for every k."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import Settings, at_least, one_of, positive
from .registry import UNSEAL_VAL, Option, Protocol, Reads, Reference, on_train_val, register, written_to

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

    return run_knn(store, train, val, ks=None if settings.ks is None else list(settings.ks), temperature=settings.temperature, feature=settings.feature, unseal=unseal,
                   cache_dir=cache_dir,
                   json_path=json_path, progress=progress, placement=placement)


PROTOCOL = register(Protocol(
    name="knn",
    summary="DINO's (and DINOv3's) weighted k-NN on frozen features (class token through the final norm by default): top-1 and top-5 for every k.",
    settings=KnnSettings,
    reads=Reads(arrays=("cls_tokens_eval224", "tokens_eval224", "cls_tokens_224", "tokens_224"), views=("eval224", "224"), labels=True, panel_kinds=("classes", "coco")),
    results=("knn",),
    references=(Reference("Caron et al., Emerging Properties in Self-Supervised Vision Transformers (ICCV 2021)", "facebookresearch/dino eval_knn.py"),
                Reference("Siméoni et al., DINOv3 (2025)", "facebookresearch/dinov3 dinov3/eval/knn.py")),
    differences=("Exact top-k with a stated tie rule (equal cosines go to the lower train index), where DINO's script leaves ties to torch.topk; "
                 "a cosine is the float32 rounding of the float64 product (DINO's float32 matmul rounds in its kernel's order), so the neighbours "
                 "do not depend on block sizes, BLAS or device: numpy screens in float32 and settles near-ties in float64, --backend torch "
                 "(--device cpu or cuda) takes float64 products in torch, with the same neighbours and cosines. The train features are read "
                 "in blocks (memory does not grow with the train set). "
                 "On a DINOv3 store the feature is DINOv3's (x_norm_clstoken: the class token through the final norm, eps 1e-5, storage tokens unused, "
                 "L2-normalised); its KnnModule weighs neighbours by softmax(cos / T) over the largest k where DINO sums exp(cos / T), "
                 "a factor common to every class of one image, so predictions and top-1 / top-5 are the same. A k above the train images is "
                 "narrowed to the ks that fit (DINOv3 clips each k to the train set's size instead), so no k is scored twice."),
    execute=execute,
    command=on_train_val(
        "DINO's weighted k-NN (facebookresearch/dino eval_knn.py): top-1 and top-5 for every k.",
        "A store holding (or beside a store holding) both panels' images.",
        "Panel whose images vote (class folders, or COCO: largest category).",
        "Panel whose images are classified and scored.",
        Option("ks", "Neighbour counts, all in one pass (default DINO's eval_knn.py: 10,20,100,200, narrowed to the train panel's size).",
               "ints", example="10,20,100,200"),
        Option("temperature", "Vote weight exp(cos / T) (DINO: 0.07).", "float", 0.07),
        Option("feature", "auto, cls-normed (DINO's), cls (as stored) or mean (patch tokens).", default="auto"),
        written_to("Also write the accuracies and settings as JSON."),
        Option("backend", "scipy: the numpy search; torch: the same search in torch on --device (same neighbours).", default="scipy"),
        Option("device", "cpu or cuda (--backend torch): where the train features are searched.", default="cpu"),
        UNSEAL_VAL,
        "cache", "quiet", "SHARDED",
        table="results.tables:knn",
        progress=("images", "progress", "k-NN")),
    sections=("report.protocols:knn",),
    placement=("workers", "dask_address", "shard", "backend", "device"),  # the val images spread over workers, a cluster or shards; the search on --device
))
