"""``probe report``: the analyses' saved results as one document, stores side by side.

Modules, one job each: ``sources`` (what is read: stores, results, the followed image, ledgers,
training logs), ``followed`` (the followed image's rows and cosines, prepared once),
``sections`` (what exists, gathered into sections), ``figures`` (matplotlib), ``explorer``
(the interactive explorer's quantised data), ``html`` and ``markdown`` (the two renderings),
``references`` (published numbers, their sources and when one is comparable), ``published``
(where the report prints them), ``pictures`` (token PCA, Fiedler vectors with ground truth),
``tables`` (CSV and LaTeX copies of every table), ``build`` (the atomic write).
"""

from .build import Written, default_name, render_report, write_report
from .sections import gather

__all__ = ["Written", "default_name", "gather", "render_report", "write_report"]
