"""The panel kinds ``probe panel add`` reads, each with its file layout and the code it follows
(``probe list`` prints this table; the readers live in ``panels``, ``kinds``, ``saliency``, ``davis``)."""

KINDS = {
    "coco": "a COCO annotation JSON and an image folder (pycocotools)",
    "voc": "Pascal VOC devkit: Annotations/, JPEGImages/, ImageSets/Main/<split>.txt (valeoai/LOST datasets.py)",
    "coco20k": "COCO-2014 train restricted to LOST's and TokenCut's 19,817 images, crowd boxes removed (valeoai/LOST datasets.py)",
    "saliency": "an image folder and binary masks named like the images: ECSSD, DUTS-TE, DUT-OMRON (YangtaoWANG95/TokenCut unsupervised_saliency_detection)",
    "classes": "one sub-folder of images per class, ImageNet's layout (facebookresearch/dino eval_knn.py)",
    "spair": (
        "SPair-71k: PairAnnotation/{trn,val,test}/*.json, ImageAnnotation/<category>/*.json, JPEGImages/<category>/*.jpg, "
        "every pair checked field by field when added (mbanani/probe3d evals/datasets/spair.py), read by probe correspond"
    ),
    "navi": (
        "NAVI (navi_v1): <object>/<collection>/annotations.json (camera q, t, focal_length, image_size), images/downsampled_<id>.jpg, "
        "depth/downsampled_<id>.png; the wild_set images of objects with another collection, every field checked when added "
        "(mbanani/probe3d evals/datasets/navi.py), read by probe correspond"
    ),
    "voc-segmentation": "Pascal VOC 2012 segmentation: JPEGImages/, SegmentationClass/ (palette PNGs; SegmentationClassAug/ for trainaug), "
    "ImageSets/Segmentation/<split>.txt (vpariza/open-hummingbird-eval hbird/data/voc/voc_data.py), read by probe hummingbird",
    "ade20k": "ADE20K SceneParsing (ADEChallengeData2016): images/<split>/, annotations/<split>/ grey PNGs, 0 other and 150 classes "
    "(facebookresearch/dinov3 dinov3/data/datasets/ade20k.py)",
    "nyu": "NYU Depth v2 (the BTS split): nyu_train.txt / nyu_test.txt of 'image depth focal' lines, <scene>/rgb_<n>.jpg and "
    "16-bit <scene>/sync_depth_<n>.png in millimetres, every line checked field by field when added "
    "(facebookresearch/dinov3 dinov3/data/datasets/nyu.py), read by probe depth",
    "davis": "DAVIS-2017: JPEGImages/480p, Annotations/480p, ImageSets/2017 (davisvideochallenge/davis2017-evaluation), read by probe propagate --davis",
}

# the data set a panel kind holds, as a number's caption names it ("ADE20K mIoU", never a data set it was not measured on)
DATA_SETS = {
    "coco": "COCO",
    "voc": "VOC",
    "coco20k": "COCO20k",
    "saliency": "saliency",
    "classes": "class folders",
    "spair": "SPair-71k",
    "voc-segmentation": "VOC",
    "ade20k": "ADE20K",
    "davis": "DAVIS-2017",
}


def data_set(kind: str) -> str:
    """The data set of a panel kind (its own name where the kind is new here)."""
    return DATA_SETS.get(kind, kind)
