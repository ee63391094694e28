"""How the command line spells a parameter, and fix commands built from those spellings.

One table (``FLAGS``) maps a parameter (a protocol's setting, a placement field, an input, an
option of ``probe extract``) to its flag where the two differ; every other parameter's flag is
``--`` and its name with dashes. The CLI builds its options from this table (``cli/app.py``,
``cli/protocols.py``), and ``fix_command`` builds the commands that error messages print from
it, so a printed fix is spelled as the parser reads it (``tests/test_contract_api.py`` checks
every command's flags against ``flag``).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

# a parameter -> its flag, where the two spellings differ
FLAGS = {
    "boot": "--boot",
    "n_boot": "--boot",
    "n_last_frames": "--n-last-frames",
    "size_mask_neighborhood": "--size-mask-neighborhood",
    "ks": "--k",
    "subset": "--set",
    "color_lambda": "--color-lambda",
    "settings_file": "--settings",
    "settings_out": "--settings-out",
    "dask_address": "--dask-address",
    "wrap": "--no-wrap",
    "thresholds": "--threshold",
    "memory": "--memory",
    "json_path": "--json",
    "cache_dir": "--cache",
    "sequences": "--sequence",
    "score": "--no-score",
    "sets": "--set",
    "formats": "--format",
    "form": "--format",
    "for_": "--for",
}


def flag(parameter: str) -> str:
    """The command line's flag of ``parameter`` (``ks`` → ``--k``, ``n_last_frames`` → ``--n-last-frames``)."""
    return FLAGS.get(parameter, "--" + parameter.replace("_", "-"))


def _word(value: Any) -> str:
    text = str(value)
    return text if text.isupper() and text.isidentifier() else shlex.quote(text)  # CKPT, NAME, DIR: placeholders stay bare


def fix_command(command: str, *arguments: Any, **options: Any) -> str:
    """``probe <command> ARGUMENTS --flag value ...``, each keyword spelled by ``flag``: True is the
    flag alone, False or None leaves it out, a tuple is comma-joined (``--views 224,480``), a list
    repeats the flag (``--sequence a --sequence b``); paths and values are shell-quoted, upper-case
    placeholders (CKPT, NAME) stay bare.

        fix_command("extract", "CKPT", views="480", panel="voc07")  ->  "probe extract CKPT --views 480 --panel voc07"
    """
    words = ["probe", *command.split(), *(_word(a) for a in arguments)]
    for name, value in options.items():
        if value is None or value is False:
            continue
        spelled = flag(name)
        if value is True:
            words.append(spelled)
        elif isinstance(value, list):
            for item in value:
                words += [spelled, _word(item)]
        elif isinstance(value, tuple):
            words += [spelled, _word(",".join(str(v) for v in value))]
        else:
            words += [spelled, _word(value if not isinstance(value, Path) else str(value))]
    return " ".join(words)
