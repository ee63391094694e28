"""No process of a run outlives it (``infra/lifeline.py``).

Each test starts a real ``probe`` command as a subprocess (``tests/held_run.py`` stops it in the
middle of its work and says so through a pipe, so the kill never races the run's end), records
every process of the run, kills the parent, and then waits on each process's exit (a pidfd per
process), with a generous guard and no duration asserted. A process still alive at the guard
(one without a lifeline waits for work for ever) fails the test (and is killed).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.infra.placement import launcher_shard
from probe_toolkit.results import records
from probe_toolkit.store.extract import Settings, extract

ROOT = Path(__file__).resolve().parents[1]
HELD = Path(__file__).with_name("held_run.py")
GUARD = 60.0  # seconds: only a process that would never end reaches it (the lifeline ends a helper within its 0.2 s check)
HELD_GUARD = 600.0  # seconds: the run's start-up on a crowded machine imports torch; it says "held" through the pipe long before


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that never comes counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def parents() -> dict[int, list[int]]:
    """Each process's children, from /proc."""
    found: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            found.setdefault(ppid, []).append(int(entry.name))
    return found


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children of children included)."""
    below, found, todo = parents(), set(), [pid]
    while todo:
        for child in below.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return {p for p in found if alive(p)}


def held(at: str, args: list, log: Path, **popen) -> tuple[subprocess.Popen, int]:
    """``probe ARGS`` started under ``tests/held_run.py`` (stopping at ``at``): the process and the
    read end of the pipe it says ``held`` through."""
    read, write = os.pipe()
    with open(log, "wb") as output:  # a file, not a pipe: a surviving worker would hold a pipe open forever
        run = subprocess.Popen(
            [sys.executable, str(HELD), at, str(write), *map(str, args)], env=env(), stdout=output, stderr=subprocess.STDOUT, pass_fds=(write,), **popen
        )
    os.close(write)
    return run, read


def wait_for(read: int, process: subprocess.Popen, what: str, log: Path) -> None:
    """Until the run says it is held (or ends first: end-of-file on the pipe)."""
    try:
        ready, _, _ = select.select([read], [], [], HELD_GUARD)
        said = os.read(read, 4) if ready else None
    finally:
        os.close(read)
    if said == b"held":
        return
    process.poll()
    pytest.fail(f"{what} {'ended (exit ' + str(process.returncode) + ')' if said == b'' else 'was never held'} before it was held:\n{log.read_text()[-2000:]}")


def none_survive(pids: set[int]) -> list[int]:
    """Wait on every pid's exit (a zombie counts as gone), up to GUARD seconds; the survivors (killed here) otherwise."""
    exits = {}
    for pid in pids:
        try:
            exits[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            continue
    try:
        waiting = set(exits)
        while waiting:
            ready, _, _ = select.select(list(waiting), [], [], GUARD)
            if not ready:
                break
            waiting -= set(ready)
        left = [exits[fd] for fd in waiting if alive(exits[fd])]
    finally:
        for fd in exits:
            os.close(fd)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def env(**more: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")}
    return {**keep, "PYTHONPATH": os.pathsep.join([str(ROOT), keep.get("PYTHONPATH", "")]), **more}


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_checkpoints, image_dir) -> Path:
    root = tmp_path_factory.mktemp("lifeline")
    return extract(tiny_checkpoints["dino-full"], image_dir, settings=Settings(views=(480,), attention="none", chunk=2), cache_dir=root, quiet=True, batch_size=2).store


def kill_mid_run(args: list, sig: int, tmp_path: Path) -> tuple[set[int], list[int]]:
    log = tmp_path / "log.txt"
    run, read = held("block", args, log)
    try:
        wait_for(read, run, " ".join(map(str, args[:2])), log)
        helpers = descendants(run.pid)
        os.kill(run.pid, sig)
        run.wait()
        return helpers, none_survive(helpers)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_decode_workers_die_with_the_command(store, tmp_path, sig):
    """``probe decode STORE --workers 2``, killed while its workers hold blocks: none survives."""
    helpers, survivors = kill_mid_run(["decode", store, "--workers", "2", "--cache", tmp_path / "cache", "-q"], sig, tmp_path)
    assert len(helpers) >= 2, helpers  # the two workers (and multiprocessing's resource tracker, if any)
    assert survivors == [], f"{len(survivors)} of {len(helpers)} processes outlived the killed command"


def _sigterm(at: str, args: list, tmp_path: Path) -> tuple[subprocess.Popen, set[int], list[int], str]:
    """``probe ARGS`` held at ``at``, then SIGTERMed: (the process, its helpers, the survivors, its output)."""
    log = tmp_path / "log.txt"
    run, read = held(at, args, log)
    try:
        wait_for(read, run, " ".join(map(str, args[:2])), log)
        helpers = descendants(run.pid)
        os.kill(run.pid, signal.SIGTERM)
        run.wait(timeout=120)  # a guard only: the cleanup is a few renames and a pool's shutdown
        return run, helpers, none_survive(helpers), log.read_text()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


def test_sigterm_runs_the_commands_cleanup_and_exits_143(store, tmp_path):
    """SIGTERM of ``probe decode --workers 2`` while its workers hold blocks: the main process runs
    the cleanup a Ctrl-C runs (pool stopped: no worker survives), says so in one line, exits 143."""
    run, helpers, survivors, output = _sigterm("block", ["decode", store, "--workers", "2", "--cache", tmp_path / "cache", "-q"], tmp_path)
    assert run.returncode == 143, output
    assert "Traceback" not in output and "terminated (SIGTERM); nothing half-written is kept, rerun the command" in output, output
    assert len(helpers) >= 2 and survivors == [], (helpers, survivors)


def test_sigterm_while_a_record_is_written_leaves_no_half_written_record(store, tmp_path):
    """SIGTERM after the record's files are written under their temporary name, before the rename:
    the temporary folder is removed by the terminated process itself (not left for the next run to
    sweep), no record appears, and the rerun writes exactly one."""
    copy = tmp_path / "s.zarr"
    shutil.copytree(store, copy)
    run, _, survivors, output = _sigterm("save", ["decode", copy, "--cache", tmp_path / "cache", "-q"], tmp_path)
    assert run.returncode == 143 and "terminated (SIGTERM)" in output and "Traceback" not in output, output
    assert survivors == []
    results = copy / "results"
    assert not [p for p in results.rglob("*") if ".tmp-" in p.name], sorted(results.rglob("*"))
    assert records.runs(copy, "decoder") == []
    again = subprocess.run(
        [sys.executable, "-m", "probe_toolkit", "decode", str(copy), "--cache", str(tmp_path / "cache"), "-q"], env=env(), capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr
    assert len(records.runs(copy, "decoder")) == 1


def test_streaming_decode_workers_die_with_the_command(tiny_checkpoints, image_dir, tmp_path):
    """``probe decode CKPT --images DIR --workers 2`` (keys in memory only), SIGKILLed mid-run."""
    args = ["decode", tiny_checkpoints["dino-full"], "--images", image_dir, "--workers", "2", "--chunk", "4", "--batch-size", "2", "--cache", tmp_path / "cache", "-q"]
    helpers, survivors = kill_mid_run(args, signal.SIGKILL, tmp_path)
    assert len(helpers) >= 2, helpers
    assert survivors == [], f"{len(survivors)} of {len(helpers)} processes outlived the killed command"


def test_extraction_processes_die_with_the_command(tiny_checkpoints, image_dir, tmp_path):
    """``probe extract`` decoding in processes, as beside a GPU (a forkserver and its decoding
    processes), SIGKILLed after its first forward pass: none of them survives."""
    log = tmp_path / "log.txt"
    args = [
        "extract",
        tiny_checkpoints["dino-full"],
        "--images",
        image_dir,
        "--views",
        "224",
        "--chunk",
        "2",
        "--batch-size",
        "2",
        "--decoders",
        "2",
        "--store",
        tmp_path / "s.zarr",
        "--cache",
        tmp_path / "cache",
        "-q",
    ]
    run, read = held("readout-processes", args, log)
    try:
        wait_for(read, run, "extract", log)
        helpers = descendants(run.pid)
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
        survivors = none_survive(helpers)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert len(helpers) >= 3, helpers  # the forkserver and two decoding processes (and the resource tracker)
    assert survivors == [], f"{len(survivors)} of {len(helpers)} processes outlived the killed command"


def test_an_extraction_rank_stops_when_torchrun_is_killed(tiny_checkpoints, image_dir, tmp_path):
    """A launcher standing in for torchrun starts one rank of ``probe extract`` in a session of
    its own (as torchrun does, so a kill of the launcher's group never reaches it) and is SIGKILLed
    while the rank extracts: the rank stops instead of extracting to the end."""
    read, write = os.pipe()
    rank = [
        sys.executable,
        str(HELD),
        "readout",
        str(write),
        "extract",
        tiny_checkpoints["dino-full"],
        "--images",
        image_dir,
        "--views",
        "224",
        "--chunk",
        "1",
        "--batch-size",
        "1",
        "--store",
        tmp_path / "s.zarr",
        "--cache",
        tmp_path / "cache",
        "-q",
    ]
    launcher = (
        f"import os, signal, subprocess; subprocess.Popen({list(map(str, rank))!r}, start_new_session=True, pass_fds=({write},)); os.close({write}); signal.pause()"
    )
    log = tmp_path / "log.txt"
    with open(log, "wb") as output:
        parent = subprocess.Popen(
            [sys.executable, "-c", launcher], env=env(TORCHELASTIC_RUN_ID="t1", RANK="0", WORLD_SIZE="2"), pass_fds=(write,), stdout=output, stderr=subprocess.STDOUT
        )
    os.close(write)
    try:
        wait_for(read, parent, "the rank (its first forward pass)", log)
        ranks = {p for p in parents().get(parent.pid, []) if alive(p)}
        assert len(ranks) == 1, ranks
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert none_survive(ranks) == [], "the rank outlived its launcher"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_rank_and_world_size_left_in_a_shell_are_refused_not_followed():
    assert launcher_shard({}) is None
    assert launcher_shard({"RANK": "0", "WORLD_SIZE": "1"}) is None  # one of one: nothing to shard
    assert launcher_shard({"RANK": "1", "WORLD_SIZE": "3", "TORCHELASTIC_RUN_ID": "x"}) == "1/3"
    with pytest.raises(ProbeError, match=r"RANK=1 WORLD_SIZE=3 are set, but torchrun did not start this process.*--shard 1/3"):
        launcher_shard({"RANK": "1", "WORLD_SIZE": "3"})
