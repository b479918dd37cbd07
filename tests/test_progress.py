"""Progress lines for logs (rarelm/progress.py), on a clock the test moves."""

from rarelm.progress import Steps, duration, eta, ticker


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_steps_stay_quiet_for_a_short_stage_then_log_each_step_with_the_time_so_far():
    clock, lines = Clock(), []
    steps = Steps("rare_terms", quiet=10.0, log=lines.append, clock=clock)
    clock.now += 4
    assert steps.done("reading 12 documents") == 4
    clock.now += 3
    steps.done("TF-IDF terms (40)")
    assert lines == []  # 7 s in all: nothing said
    clock.now += 95
    steps.done("counting 1,000 train tokens")
    clock.now += 0.5
    steps.done("the term list")
    assert lines == ["rare_terms: counting 1,000 train tokens 1 min 35 s (1 min 42 s so far)",
                     "rare_terms: the term list 0.5 s (1 min 42 s so far)"]


def test_ticker_logs_at_most_every_interval_with_share_and_time_left_and_not_the_last_item():
    clock, lines = Clock(), []
    advance = ticker("evaluate: test scoring tokens", total=600, every=30.0, log=lines.append, clock=clock)
    clock.now += 20
    advance(50)  # 20 s: not yet
    clock.now += 40
    advance(50)  # 60 s, 100 of 600: 5 min left at this rate
    clock.now += 10
    advance(100)  # 10 s after the last line: not yet
    clock.now += 30
    advance(400)  # the last item: the step's own line says it ended
    assert lines == ["evaluate: test scoring tokens 100/600 (17%), 1 min 0 s, about 5 min 0 s left"]


def test_duration_and_eta_read_as_a_person_would():
    assert [duration(s) for s in (0.04, 59.94, 60, 3599, 3600, 7325)] == [
        "0.0 s", "59.9 s", "1 min 0 s", "59 min 59 s", "1 h 00 min", "2 h 02 min"]
    assert eta(10.0, 0, 5) == "" and eta(10.0, 5, 5) == ""
    assert eta(30.0, 1, 3) == "about 1 min 0 s left"
