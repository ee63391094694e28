"""A setting's error below the command line names the Python keyword; the command line re-spells it
as the flag (``cli.flagged``), and leaves a command in backticks as written (issue 43, item 4)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from probe_toolkit.cli import flagged
from probe_toolkit.infra.settings import SettingError

FIXTURE = Path(__file__).parent / "fixtures" / "store_before_42" / "store.zarr"


def refused(call, *args) -> SettingError:
    with pytest.raises(SettingError) as caught:
        call(*args)
    return caught.value


def both(error: SettingError) -> tuple[str, str]:
    return error.line(), flagged(error)


def test_a_grid_the_store_lacks_names_grid_and_view_per_caller(tmp_path):
    from probe_toolkit.commands.neighbours import choose_view

    store = shutil.copytree(FIXTURE, tmp_path / "store.zarr")
    api, cli = both(refused(choose_view, [store], None, 5))
    assert "(grid=5); pass view=224 without grid" in api and "--" not in api, api
    assert "(--grid 5); pass --view 224 without --grid" in cli, cli


def test_a_view_that_is_no_view_and_keys_the_network_lacks():
    from probe_toolkit.commands.decode_keys import refused_keys
    from probe_toolkit.commands.decode_views import check_view

    api, cli = both(refused(check_view, "sideways"))
    assert api.startswith("view sideways is neither") and "use view 480" in api and "--" not in api, api
    assert cli.startswith("--view sideways is neither") and "use --view 480" in cli, cli
    api, cli = both(refused_keys("s.zarr", "rope", "its network has a position table, not RoPE"))
    assert "keys must be plain here (got 'rope')" in api and api.endswith("use e.g. keys='plain'"), api
    assert "--keys must be plain here (got rope)" in cli and cli.endswith("use e.g. --keys plain"), cli


def test_a_settings_file_that_is_not_one_names_settings_file_and_its_flag(tmp_path):
    from probe_toolkit.commands.decode import _settings_file

    path = tmp_path / "s.json"
    path.write_text("[1]")
    api, cli = both(refused(_settings_file, path))
    assert api.endswith("or drop settings_file") and "`probe decode-sweep --settings-out`" in api, api
    assert cli.endswith("or drop --settings") and "`probe decode-sweep --settings-out`" in cli, cli


def test_a_command_in_backticks_is_left_as_the_command_line_spells_it():
    from probe_toolkit.protocols.heads import unextracted

    api, cli = both(unextracted(Path("c/x.zarr"), "run `probe extract CKPT --store x.zarr --views 224` first"))
    assert api.endswith("run `probe extract CKPT --store x.zarr --views 224` first, or pass store=STORE"), api
    assert cli.endswith("run `probe extract CKPT --store x.zarr --views 224` first, or pass --store STORE"), cli
    error = SettingError("view", "view 7 is odd", "run `probe decode S --view 480` (the view)")
    assert flagged(error) == "--view 7 is odd; run `probe decode S --view 480` (the --view)"
