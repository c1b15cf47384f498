"""The one retry backoff (autoheal/backoff.py): growth and cap, jitter bounds, the error filter,
no wait after the last try, the time limit, and a stop that cuts a wait short."""

from __future__ import annotations

import random
import threading
import time

import pytest

from autoheal.backoff import Backoff


class Flaky:
    """Raises `errors` in turn, then returns "ok"; counts its calls."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def recording(b: Backoff) -> list[float]:
    """Replace b's waits by a record of them (no time passes)."""
    waits: list[float] = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        return True

    b.wait = wait  # type: ignore[method-assign]
    return waits


def test_delays_double_from_base_to_cap_without_jitter() -> None:
    b = Backoff(0.5, 4.0, jitter=0.0)
    assert [b.failed() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    b.succeeded()
    assert b.failures == 0 and b.failed() == 0.5
    assert Backoff(1.0, 1e9, jitter=0.0).delay(10_000) == 1e9  # a long outage stays finite


@pytest.mark.parametrize("jitter", [0.1, 0.5, 1.0])
def test_jitter_stays_within_its_fraction_of_the_delay(jitter: float) -> None:
    b = Backoff(0.5, 8.0, jitter=jitter, rng=random.Random(7))
    for n in range(1, 9):
        full = min(8.0, 0.5 * 2 ** (n - 1))
        drawn = [b.delay(n) for _ in range(300)]
        assert all((1 - jitter) * full <= d <= full for d in drawn), (n, min(drawn), max(drawn))
        assert max(drawn) - min(drawn) > 0.5 * jitter * full  # really spread, not one value


def test_the_default_jitter_is_the_workers_half_delay() -> None:
    b = Backoff(base=0.5, cap=8.0)  # as remediation/worker.py builds it
    for n, d in enumerate(b.failed() for _ in range(8)):
        want = min(8.0, 0.5 * 2**n)
        assert want / 2 <= d <= want


def test_bad_settings_are_refused() -> None:
    for kwargs in ({"jitter": 1.5}, {"jitter": -0.1}, {"tries": 0}):
        with pytest.raises(ValueError):
            Backoff(0.5, 4.0, **kwargs)
    with pytest.raises(ValueError):
        Backoff(-1.0, 4.0)


def test_a_retryable_error_is_tried_again_and_the_result_returned() -> None:
    b = Backoff(0.1, 1.0, jitter=0.0)
    waits = recording(b)
    told: list[tuple[str, float]] = []
    fn = Flaky(ConnectionError("a"), ConnectionError("b"))
    assert b.call(fn, (ConnectionError,), lambda exc, pause: told.append((str(exc), pause))) == "ok"
    assert fn.calls == 3 and waits == [0.1, 0.2] and told == [("a", 0.1), ("b", 0.2)]


def test_an_error_not_worth_retrying_is_raised_at_once() -> None:
    b = Backoff(0.1, 1.0, jitter=0.0, tries=5)
    waits = recording(b)
    fn = Flaky(ValueError("bad input"))
    with pytest.raises(ValueError, match="bad input"):
        b.call(fn, (ConnectionError,))
    assert fn.calls == 1 and waits == []
    # a predicate filters on more than the class (e.g. an HTTP status)
    fn = Flaky(OSError(5, "io"), OSError(13, "denied"))
    with pytest.raises(OSError, match="denied"):
        b.call(fn, lambda exc: isinstance(exc, OSError) and exc.errno == 5)
    assert fn.calls == 2 and waits == [0.1]


def test_no_wait_after_the_last_try() -> None:
    b = Backoff(0.1, 1.0, jitter=0.0, tries=3)
    waits = recording(b)
    fn = Flaky(*(ConnectionError(str(i)) for i in range(5)))
    with pytest.raises(ConnectionError, match="2"):  # the last try's error
        b.call(fn, (ConnectionError,))
    assert fn.calls == 3 and waits == [0.1, 0.2]  # two waits between three tries, none after
    assert Backoff(0.1, 1.0, tries=1).call(Flaky(), (ConnectionError,)) == "ok"


def test_no_wait_that_would_end_past_the_time_allowed() -> None:
    now = [100.0]
    b = Backoff(0.5, 4.0, jitter=0.0, within=1.2, clock=lambda: now[0])

    def wait(seconds: float) -> bool:
        now[0] += seconds
        return True

    b.wait = wait  # type: ignore[method-assign]
    fn = Flaky(*(ConnectionError() for _ in range(5)))
    with pytest.raises(ConnectionError):
        b.call(fn, (ConnectionError,))
    assert fn.calls == 2 and now[0] == 100.5  # 0.5 s waited; another 1 s would pass 1.2 s


def test_a_stop_ends_a_wait_in_progress_and_the_retries() -> None:
    b = Backoff(60.0, 60.0, jitter=0.0)
    fn = Flaky(*(ConnectionError("down") for _ in range(5)))
    out: list[BaseException] = []

    def run() -> None:
        try:
            b.call(fn, (ConnectionError,))
        except ConnectionError as exc:
            out.append(exc)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.2)  # it is in its 60 s wait now
    t0 = time.monotonic()
    b.cancel()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - t0 < 2
    assert fn.calls == 1 and [str(e) for e in out] == ["down"] and b.stopped
    with pytest.raises(ConnectionError):  # stopped: nothing is tried again
        b.call(Flaky(ConnectionError()), (ConnectionError,))


def test_wait_returns_false_when_stopped() -> None:
    stop = threading.Event()
    b = Backoff(1.0, 1.0, stop=stop)
    assert b.wait(0.01) is True
    threading.Timer(0.1, stop.set).start()
    t0 = time.monotonic()
    assert b.wait(30) is False and time.monotonic() - t0 < 5


def test_threads_share_one_backoff_each_with_its_own_count() -> None:
    b = Backoff(0.01, 0.02, jitter=0.0, tries=3)
    fns = [Flaky(ConnectionError(), ConnectionError()) for _ in range(8)]
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda f=f: results.append(b.call(f, (ConnectionError,)))) for f in fns
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert results == ["ok"] * 8 and all(f.calls == 3 for f in fns)
