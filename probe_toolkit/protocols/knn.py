"""``knn``: DINO's weighted k-NN classifier on frozen features, top-1 and top-5 for every k."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import AtLeast, Each, OneOf, Positive, Settings, setting
from .registry import CACHE, Command, Difference, Input, Option, Protocol, Reads, Reference, json_input, register, train_val

NB_KNN = (10, 20, 100, 200)  # facebookresearch/dino eval_knn.py --nb_knn
FEATURES = ("auto", "cls-normed", "cls", "mean")


@dataclass(frozen=True)
class KnnSettings(Settings):
    ks: tuple[int, ...] | None = setting(
        None,
        f"Neighbour counts, all in one pass (default: DINO's eval_knn.py nb_knn, {','.join(map(str, NB_KNN))}, narrowed to the train panel's size).",
        Each(AtLeast(1)),
    )
    temperature: float = setting(0.07, "Vote weight exp(cos / T) (default: DINO's eval_knn.py).", Positive())
    feature: str = setting("auto", "auto, cls-normed (DINO's), cls (as stored) or mean (patch tokens).", OneOf(FEATURES))


PROTOCOL = register(
    Protocol(
        name="knn",
        summary="DINO's (and DINOv3's) weighted k-NN on frozen features (class token through the final norm by default): top-1 and top-5 for every k.",
        settings=KnnSettings,
        inputs=(
            Input("store", "A store holding (or beside a store holding) both panels' images.", "store", True),
            *train_val("Panel whose images vote (class folders, or COCO: largest category).", "Panel whose images are classified and scored.", use="hold the neighbours"),
            json_input("Also write the accuracies and settings as JSON."),
            Input("unseal", "Reason to open a sealed test panel as --val (recorded in the ledger)."),
            CACHE,
        ),
        reads=Reads(
            arrays=("cls_tokens_eval224", "tokens_eval224", "cls_tokens_224", "tokens_224"),
            views=("eval224", "224"),
            labels=True,
            panel_kinds=("classes", "coco"),
            stores=("cls_tokens_eval224", "cls_normed_eval224"),
        ),
        results=("knn",),
        result="results.knn_report:KnnReport",
        references=(
            Reference("Caron et al., Emerging Properties in Self-Supervised Vision Transformers (ICCV 2021)", "facebookresearch/dino eval_knn.py"),
            Reference("Siméoni et al., DINOv3 (2025)", "facebookresearch/dinov3 dinov3/eval/knn.py"),
        ),
        differences=(
            Difference(
                "the similarities are computed in blocks of val × train images with a running top-k, the train features read in blocks",
                "memory does not grow with the train set; the script holds N_val // 100 val images × N_train at a time and fails below 100 val images",
                "none: the same neighbours",
            ),
            Difference(
                "a cosine is the float32 rounding of the float64 product (numpy screens in float32 and settles near-ties in float64; "
                "--backend torch takes float64 products in torch, on --device cpu or cuda)",
                "DINO's float32 matmul rounds in its kernel's order, so its neighbours depend on block sizes, BLAS and device",
                "a neighbour can differ from the script's where two cosines differ in their last float32 bit; probe's do not depend on placement or device",
            ),
            Difference(
                "equal cosines go to the lower train index, also at the k-th place; classes of equal vote rank by class index",
                "the script leaves ties to torch.topk",
                "a neighbour or prediction can differ from the script's only where cosines or votes tie exactly",
            ),
            Difference(
                "with 5 classes or fewer, top-5 is NaN (shown as –)",
                "the script gives a number there (the share of images whose class got any vote), which says nothing about a ranking",
                "no top-5 on panels of 5 classes or fewer",
            ),
            Difference(
                "a k above the train images is narrowed to the ks that fit",
                "DINOv3 clips each k to the train set's size instead, which would score one k twice",
                "fewer ks than asked on a small train panel (the run prints which)",
            ),
            Difference(
                "on a DINOv3 store the feature is DINOv3's (x_norm_clstoken: the class token through the final norm, eps 1e-5, storage "
                "tokens unused, L2-normalised), and neighbours are weighed by exp(cos / T) as in DINO",
                "DINOv3's KnnModule weighs by softmax(cos / T) over the largest k, a factor common to every class of one image",
                "none: the same predictions and top-1 / top-5",
            ),
        ),
        run="commands.knn:run",
        command=Command(
            "DINO's weighted k-NN (facebookresearch/dino eval_knn.py): top-1 and top-5 for every k.",
            options=(
                "train",
                "val",
                "ks",
                "temperature",
                "feature",
                "json_path",
                Option("backend", "scipy: the numpy search; torch: the same search in torch on --device (same neighbours)."),
                Option("device", "cpu or cuda (--backend torch): where the train features are searched."),
                "work_memory",
                "unseal",
                "cache",
                "quiet",
                "SHARDED",
            ),
            table="results.tables:knn",
            progress=("images", "k-NN"),
        ),
        sections=("report.protocols:knn",),
        placement=("workers", "dask_address", "shard", "backend", "device", "work_memory"),  # val images over workers, a cluster or shards; the search on --device
    )
)
