"""Queued DVC experiments: queue a batch, run it with one `dvc queue start` worker, wait for it.

An experiment that already exists under its name is not run again, and one already queued or
running (an earlier, interrupted command's) is waited for, not queued again: an interrupted
`rarelm headline` picks up where it stopped. One that `dvc queue status` shows running while no
worker is alive (its worker was killed with the session or the machine: DVC keeps it "Running" for
ever, and a new worker never takes it up) is marked failed (`dvc queue kill`) and queued again.
Dead means both: `dvc queue status` counts no worker, active or idle (a worker between two tasks
counts as idle, and celery's answer to that question can time out on a busy machine, so alone the
count is no proof), and no `dvc exp queue-worker` process (nor the `dvc queue start` that spawns
and waits on it) runs in the repo.

A worker can also die while this command waits: on a busy machine DVC's own idle monitor
(dvc_task's TemporaryWorker asks the worker what it runs, gives it one second to answer, and stops
it when no answer comes and nothing is queued) can stop the worker with the batch's last experiment
just taken, which then stays "Running" with no worker (seen once, `make test` beside a second one). The
wait then marks such an experiment failed, queues it again and starts a new worker, once per
experiment: lost a second time, it is reported. Experiments left queued with no worker get a new
worker too.

Finished means the experiment's own record: its exp ref (`existing`), never only its absence from
the queue. `dvc queue status` lists the running tasks before the queued ones, so a task the worker
takes up between the two listings is in neither; on a busy machine that window is seconds wide,
and a batch was once declared done (and its last experiment failed) while that experiment was just
starting. One seen neither queued, running nor finished is looked at once more before it counts as
failed (`settle`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import yaml

from rarelm.errors import RarelmError
from rarelm.report.git_runs import experiment_refs

MAX_RESTARTS = 3  # new workers while no experiment finishes, before the wait gives up


def _dvc(args: list[str], repo: Path, check: bool = True) -> str:
    out = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, capture_output=True, text=True)
    if check and out.returncode:
        raise RarelmError(f"dvc {' '.join(args[:3])} failed: {' '.join(out.stderr.split())[-300:]}")
    return out.stdout


def existing(repo: Path) -> set[str]:
    """Names of the DVC experiments that exist (finished) in the repo."""
    return {name for name, _, _ in experiment_refs(repo)}


def worker_alive(repo: Path) -> bool:
    """Whether a `dvc exp queue-worker` process runs in the repo, or a `dvc queue start` (and the
    process it forks to spawn the worker and wait on it: the worker appears seconds after)."""
    root = repo.resolve()
    for p in psutil.process_iter(["cmdline", "cwd"]):
        cwd, cmdline = Path(p.info["cwd"] or "/"), p.info["cmdline"] or []
        starting = "queue" in cmdline and "start" in cmdline and "dvc" in " ".join(cmdline)
        if ("queue-worker" in cmdline or starting) and (cwd == root or root in cwd.parents):
            return True
    return False


def parse_status(text: str) -> tuple[dict[str, set[str]], int]:
    """`dvc queue status`'s output: {status: names}, and the workers it counts (active + idle).

    >>> parse_status("Task     Name  Created  Status\\nabc1234  e1    10:00 AM Running\\n"
    ...              "def5678  e2    10:01 AM Success\\n\\nWorker status: 1 active, 0 idle\\n")
    ({'Running': {'e1'}, 'Success': {'e2'}}, 1)
    """
    by_status: dict[str, set[str]] = {}
    workers = 0
    for line in text.splitlines()[1:]:
        words = line.split()
        if line.startswith("Worker status:"):  # "Worker status: 1 active, 0 idle"
            workers = int(words[2]) + int(words[4])
        elif len(words) > 2:
            by_status.setdefault(words[-1], set()).add(words[1])
    return by_status, workers


def queue_state(repo: Path) -> tuple[set[str], set[str]]:
    """One `dvc queue status`: the names queued or running, and those of them shown running while
    no worker is counted or alive (their worker died mid-run)."""
    pending, lost, _ = _queue_view(repo)
    return pending, lost


def _queue_view(repo: Path) -> tuple[set[str], set[str], bool]:
    """queue_state's two sets, and whether no worker is counted or alive."""
    by_status, workers = parse_status(_dvc(["queue", "status"], repo))
    running = by_status.get("Running", set())
    dead = not workers and not worker_alive(repo)
    return by_status.get("Queued", set()) | running, running if dead else set(), dead


def cache_committed_inputs(repo: Path, log: Callable[[str], None]) -> None:
    """Make sure DVC's cache holds the listing of each directory output in dvc.lock that another
    stage depends on file by file (data/rare and data/weights: `weights` and `train` read files in
    them), by running those stages once in the workspace (`dvc repro <stage>`) where it lacks one.

    A queued experiment that restores such a dependent stage from the run cache (an evaluate-only
    variant restores `train`) loads the baseline lock's listing of that directory, and fails
    (`failed to load directory ('data', 'weights')`) in a clone that never ran the pipeline
    (docs/reliability.md). Where this CPU makes other bits than the committed outputs (data/weights'
    scores.npy differs in float rounding between CPU kinds), `dvc repro` records this machine's
    outputs in the workspace's dvc.lock, which the queued experiments then start from.
    """
    missing = _uncached_listings(repo)
    if missing:
        log(f"DVC's cache lacks the listing of {', '.join(missing)}'s outputs in dvc.lock (a clone "
            f"that never ran the pipeline): dvc repro {' '.join(missing)}")
        _dvc(["repro", *missing], repo)


def _uncached_listings(repo: Path) -> list[str]:
    """Stages whose directory output in dvc.lock another stage depends on file by file, and whose
    listing (<md5>.dir) DVC's cache lacks."""
    try:
        stages = yaml.safe_load((repo / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
        lock = yaml.safe_load((repo / "dvc.lock").read_text(encoding="utf-8"))["stages"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return []  # nothing committed to restore (or not a pipeline this can read)
    deps = [d if isinstance(d, str) else next(iter(d)) for s in stages.values() for d in s.get("deps", [])]
    cache = Path(_dvc(["cache", "dir"], repo).strip()) / "files" / "md5"
    return [name for name, stage in lock.items() for out in stage.get("outs", [])
            if str(out.get("md5", "")).endswith(".dir")
            and any(d.startswith(out["path"].rstrip("/") + "/") for d in deps)
            and not (cache / out["md5"][:2] / out["md5"][2:]).is_file()]


def run_batch(repo: Path, batch: list[tuple[str, list[str]]], log: Callable[[str], None],
              poll: float = 20, done: set[str] = frozenset(),
              finished: Callable[[str], None] = lambda name: None) -> int:
    """Queue (name, overrides) experiments that do not exist yet (nor are in `done`), run them one
    at a time, wait; `finished(name)` is called for each as soon as it is seen finished (those
    that had finished before, first).

    One already queued or running (an earlier, interrupted command's) is waited for, not queued
    again. Returns how many experiments it ran or waited for.
    """
    if {name for name, _ in batch} <= set(done):  # all recorded (e.g. by rarelm run-plan): no DVC needed
        return 0
    pending, lost = queue_state(repo)
    for name in sorted(lost & {name for name, _ in batch}):
        _kill_lost(repo, name, log)
        pending.discard(name)
    finished_before = existing(repo)
    _hand_over(repo, {name for name, _ in batch} & finished_before, set(), finished)
    done = finished_before | set(done)
    todo = [(name, sets) for name, sets in batch if name not in done]
    if todo:
        cache_committed_inputs(repo, log)
    for name, sets in todo:
        if name in pending:
            continue
        _queue(repo, name, sets, log)
    if not todo:
        return 0
    workers = [_start_worker(repo)]
    names, handed, suspects, requeued = {name for name, _ in todo}, set(), set(), set()
    t0, shown, first = time.time(), None, None  # first: (time, waiting) at the first finish seen
    dead_polls, restarts = 0, 0  # polls in a row with no worker; new workers since the last finish
    while True:
        time.sleep(poll)
        pending, lost, dead = _queue_view(repo)
        # the record after the queue: one that finishes in between is seen finished, not missing
        waiting, _, suspects = settle(names, pending, existing(repo), suspects)
        lost = waiting & lost
        if not waiting:
            break
        # dead on two polls in a row: a worker just started may not show yet on the first (nor, under
        # load, the re-queued experiment's fresh entry beside its killed one shown running)
        dead_polls = dead_polls + 1 if dead and waiting & pending and workers[-1].poll() is not None else 0
        if lost & requeued and dead_polls >= 2:
            raise RarelmError(f"the queue's worker died running {', '.join(sorted(lost & requeued))} "
                              "twice (run the command again: it queues it anew)")
        if dead_polls >= 2:
            if restarts == MAX_RESTARTS:
                raise RarelmError(f"the queue's worker ended {MAX_RESTARTS + 1} times with no experiment "
                                  "finished (`dvc queue start` in the repo shows why)")
            for name in sorted(lost):
                _kill_lost(repo, name, log)
                _queue(repo, name, dict(todo)[name], log)
            requeued |= lost
            log("the queue's worker ended with experiments left: a new worker starts")
            workers.append(_start_worker(repo))
            dead_polls, restarts = 0, restarts + 1
        if len(waiting) != shown:  # a line when one finishes, not every poll
            restarts = 0 if shown is not None else restarts
            handed = _hand_over(repo, names - waiting, handed, finished)
            now = time.time()
            if shown is not None and first is None:
                first = (now, len(waiting))
            # time per experiment from finishes only: the first one done may have started long before
            each = (now - first[0]) / (first[1] - len(waiting)) if first and first[1] > len(waiting) else None
            shown = len(waiting)
            log(progress(now - t0, shown, len(todo), each))
    for worker in workers:
        worker.wait()  # `dvc queue start` spawned a detached worker and returned: only reaped here
    _hand_over(repo, names, handed, finished)
    failed = sorted(names - existing(repo))
    if failed:
        raise RarelmError(f"experiments failed: {', '.join(failed)} (see `dvc queue logs NAME`)")
    return len(todo)


def _queue(repo: Path, name: str, sets: list[str], log: Callable[[str], None]) -> None:
    log(f"queue {name}: {' '.join(sets)}")
    _dvc(["exp", "run", "--queue", "-q", "-n", name, *[x for s in sets for x in ("-S", s)]], repo)


def _kill_lost(repo: Path, name: str, log: Callable[[str], None]) -> None:
    log(f"{name} was left running by a worker that died: marked failed, queued again")
    _dvc(["queue", "kill", name], repo)


def _start_worker(repo: Path) -> subprocess.Popen:
    """`dvc queue start -j 1`: it spawns a detached worker (none if one runs) and returns, so its end
    says nothing of the experiments."""
    return subprocess.Popen([sys.executable, "-m", "dvc", "queue", "start", "-j", "1"], cwd=repo,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def settle(names: set[str], pending: set[str], finished: set[str],
           suspects: set[str]) -> tuple[set[str], set[str], set[str]]:
    """One poll's verdict on a batch: (waiting, failed, suspects for the next poll).

    `pending`: the names `dvc queue status` shows queued or running; `finished`: those whose exp
    ref exists. One neither finished nor pending is a suspect; a suspect of the previous poll that
    is still neither has failed (a task in the queue's blind spot is running by the next poll):

    >>> polls = [({"a", "b"}, set()), ({"a"}, set()), ({"b"}, {"a"}), (set(), {"a"})]
    >>> suspects = set()
    >>> for pending, finished in polls:
    ...     waiting, failed, suspects = settle({"a", "b"}, pending, finished, suspects)
    ...     print(sorted(waiting), sorted(failed), sorted(suspects))
    ['a', 'b'] [] []
    ['a', 'b'] [] ['b']
    ['b'] [] []
    ['b'] [] ['b']
    >>> [sorted(x) for x in settle({"a", "b"}, set(), {"a"}, {"b"})]
    [[], ['b'], ['b']]
    """
    unseen = names - finished - pending
    failed = unseen & suspects
    return names - finished - failed, failed, unseen  # a failed one stays failed


def _hand_over(repo: Path, names: set[str], handed: set[str], finished: Callable[[str], None]) -> set[str]:
    """Call `finished` on those of `names` that exist and were not handed over yet; all handed over."""
    for name in sorted((names - handed) & existing(repo)):
        finished(name)
        handed = handed | {name}
    return handed


def progress(elapsed: float, left: int, total: int, each: float | None = None) -> str:
    """A batch's waiting line; with `each` (seconds per experiment), the time to go.

    >>> progress(30, 22, 22)
    '30 s: 0 of 22 done, 22 queued or running'
    >>> progress(1800, 19, 22, 600)
    '1800 s: 3 of 22 done, 19 queued or running; about 3.2 h to go at 600 s each'
    >>> progress(1200, 1, 3, 600)
    '1200 s: 2 of 3 done, 1 queued or running; about 10 min to go at 600 s each'
    """
    line = f"{elapsed:.0f} s: {total - left} of {total} done, {left} queued or running"
    if each is None:
        return line
    to_go = f"{each * left / 3600:.1f} h" if each * left >= 3600 else f"{each * left / 60:.0f} min"
    return f"{line}; about {to_go} to go at {each:.0f} s each"
