"""rarelm.report.dvc_queue: when a queued batch is done, and which experiments failed, decided from
recorded `dvc queue status` outputs and the experiments' refs (no DVC runs, no timing)."""

from __future__ import annotations

import pytest

from rarelm.errors import RarelmError
from rarelm.report import dvc_queue

HEADER = "Task     Name         Created    Status\n"
WORKERS = "\nWorker status: 1 active, 0 idle\n"


def status(**names: str) -> str:
    """`dvc queue status` as DVC 3.67 prints it: the running tasks first, then the queued, the done."""
    order = ("Running", "Queued", "Failed", "Success")
    rows = sorted(names.items(), key=lambda item: order.index(item[1]))
    return HEADER + "".join(f"{i:07x}  {name:<11}  10:0{i} AM    {state}\n"
                            for i, (name, state) in enumerate(rows)) + WORKERS


class Queue:
    """What DVC answers, poll by poll: (`dvc queue status` output, the names whose exp ref exists)."""

    def __init__(self, polls: list[tuple[str, set[str]]]):
        self.polls, self.at, self.queued = polls, 0, []

    def dvc(self, args, repo, check=True):
        if args[:2] == ["queue", "status"]:
            text = self.polls[min(self.at, len(self.polls) - 1)][0]
            self.at += 1
            return text
        if args[:2] == ["exp", "run"]:
            self.queued.append(args[args.index("-n") + 1])
        return ""

    def existing(self, repo):
        return set(self.polls[max(0, min(self.at, len(self.polls)) - 1)][1])


class Started:
    """`dvc queue start`: it spawns a detached worker and returns at once."""

    def __init__(self, *args, **kwargs):
        pass

    def wait(self):
        return 0


@pytest.fixture
def queue(monkeypatch, tmp_path):
    def use(polls):
        fake = Queue(polls)
        monkeypatch.setattr(dvc_queue, "_dvc", fake.dvc)
        monkeypatch.setattr(dvc_queue, "existing", fake.existing)
        monkeypatch.setattr(dvc_queue, "worker_alive", lambda repo: True)
        monkeypatch.setattr(dvc_queue.time, "sleep", lambda s: None)
        monkeypatch.setattr(dvc_queue.subprocess, "Popen", Started)
        return fake
    return use


BATCH = [("hl-good-s2", ["alpha=0.7", "seed=2"]), ("hl-good-s3", ["alpha=0.7", "seed=3"])]


def test_an_experiment_in_the_status_blind_spot_is_waited_for_not_failed(queue, tmp_path):
    """The failure under load: hl-good-s3 moved from the queue to the worker between status's two
    listings, so one status showed it nowhere; the batch was declared done and it failed."""
    fake = queue([
        (status(), set()),                                                  # before queueing
        (status(**{"hl-good-s2": "Running", "hl-good-s3": "Queued"}), set()),
        (status(**{"hl-good-s2": "Success"}), {"hl-good-s2"}),              # s3 in neither list
        (status(**{"hl-good-s2": "Success", "hl-good-s3": "Running"}), {"hl-good-s2"}),
        (status(**{"hl-good-s2": "Success", "hl-good-s3": "Success"}), {"hl-good-s2", "hl-good-s3"}),
    ])
    handed, log = [], []
    assert dvc_queue.run_batch(tmp_path, BATCH, log.append, poll=0, finished=handed.append) == 2
    assert fake.queued == ["hl-good-s2", "hl-good-s3"] and handed == ["hl-good-s2", "hl-good-s3"]
    assert fake.at == 5  # it polled until s3's ref existed


def test_failed_twice_in_a_row_is_a_failure(queue, tmp_path):
    queue([(status(), set()),
           (status(**{"hl-good-s2": "Running", "hl-good-s3": "Queued"}), set()),
           (status(**{"hl-good-s2": "Success", "hl-good-s3": "Failed"}), {"hl-good-s2"})])
    with pytest.raises(RarelmError, match=r"experiments failed: hl-good-s3 \(see `dvc queue logs NAME`\)"):
        dvc_queue.run_batch(tmp_path, BATCH, lambda line: None, poll=0)


def test_success_without_an_exp_ref_is_a_failure_after_a_second_look(queue, tmp_path):
    # DVC logs and swallows a failed collect (the ref copied back from the temp workspace): "Success"
    fake = queue([(status(), set()),
                  (status(**{"hl-good-s2": "Success", "hl-good-s3": "Success"}), {"hl-good-s2"})])
    with pytest.raises(RarelmError, match="experiments failed: hl-good-s3 "):
        dvc_queue.run_batch(tmp_path, BATCH, lambda line: None, poll=0)
    assert fake.at == 3  # the first poll made it a suspect, the second a failure


def test_settle_on_one_poll():
    assert dvc_queue.settle({"a", "b", "c"}, pending={"a"}, finished={"b"}, suspects=set()) == (
        {"a", "c"}, set(), {"c"})
    assert dvc_queue.settle({"a", "c"}, pending={"c"}, finished=set(), suspects={"c"}) == (
        {"a", "c"}, set(), {"a"})  # "c" is seen again: no longer a suspect
    assert dvc_queue.parse_status(status(**{"x": "Failed", "y": "Queued"})) == (
        {"Failed": {"x"}, "Queued": {"y"}}, 1)
