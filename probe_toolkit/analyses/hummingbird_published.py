"""Hummingbird's published settings and numbers (vpariza/open-hummingbird-eval), apart from the
search itself so that the protocol's settings and the terminal table read them without numpy."""

K = 30  # hbird/hbird_eval.py hbird_evaluation n_neighbours
TEMPERATURE = 0.02  # hbird/hbird_eval.py HbirdEvaluation._cross_attention beta
IGNORE_INDEX = 255  # hbird/hbird_eval.py hbird_evaluation ignore_index (VOC's boundary label)
VOC_CLASSES = 21  # hbird/data/voc/voc_data.py CLASS_IDX_TO_NAME: background + 20 objects
INPUT_SIZE = 512  # README.md "image size of (512,512) for the dino" (hbird_evaluation's own default is 224)
PATCH_SIZE = 16  # ViT-S/16
SEED = 123  # eval.py RunConfig.seed
AUGMENTATION_EPOCHS = 2  # README.md "two dataset augmentation epochs" (hbird_evaluation's default is 1)
PUBLISHED_MEMORY_SIZES = (1024 * 10**2, 1024 * 10**3, 1024 * 10**4)  # README.md VOC table columns
# README.md, "Results we got with our implementation on Pascal VOC": mIoU at the memory sizes above (ScaNN, two
# augmentation epochs, the Hungarian-matched mIoU), measured on released weights
PUBLISHED = (("DINO ViT-S/16, 512 px", (37.2, 43.1, 46.6)), ("DINOv2 ViT-S/14, 504 px", (70.2, 74.9, 77.0)))
# each published row's input size (README.md: "image size of (512,512) for the dino", DINOv2 resized to 504)
PUBLISHED_SIZES = {"DINO ViT-S/16, 512 px": 512, "DINOv2 ViT-S/14, 504 px": 504}
PUBLISHED_SOURCE = "vpariza/open-hummingbird-eval README.md (Pascal VOC; ScaNN, two augmentation epochs, Hungarian-matched mIoU)"
EMPTY_SCORE = 1e6  # hbird/hbird_eval.py _sample_features: score of a patch holding no class
MATCHINGS = ("identity", "hungarian")


def comparable(memory, size: int = INPUT_SIZE) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """The published rows a run's table may hold beside its own (every other published number goes apart): those at
    the run's input size, and only where one of its memory sizes is a published one."""
    if not {str(m) for m in PUBLISHED_MEMORY_SIZES} & {str(m) for m in memory}:
        return ()
    return tuple((name, values) for name, values in PUBLISHED if PUBLISHED_SIZES[name] == int(size))
