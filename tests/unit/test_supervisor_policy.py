"""The supervisor's policies, without processes: a child that ran well restarts at once, a crash loop backs off
(doubling, capped), which owner exit statuses stop ``tether up`` at once, and when a silent owner counts as hung."""

from __future__ import annotations

import itertools

from runtime._exits import (
    EXIT_ALREADY_RUNNING,
    EXIT_DATABASE_DAMAGED,
    EXIT_FAILED,
    EXIT_NOT_TETHER_DATABASE,
    EXIT_OK,
    EXIT_SCHEMA_TOO_NEW,
    EXITS_FINAL,
)
from runtime._supervisor import (
    BACKOFF_INITIAL_S,
    BACKOFF_MAX_S,
    STABLE_AFTER_S,
    UNANSWERED_GRACE_S,
    next_liveness_look,
    restart_delay,
)

TIMEOUT_S = 5.0


def test_a_child_that_ran_well_restarts_at_once_and_its_back_off_starts_over() -> None:
    assert restart_delay(BACKOFF_MAX_S, STABLE_AFTER_S) == (0.0, BACKOFF_INITIAL_S)
    assert restart_delay(BACKOFF_INITIAL_S, STABLE_AFTER_S * 30) == (0.0, BACKOFF_INITIAL_S)


def test_quick_deaths_back_off_doubling_up_to_the_cap() -> None:
    backoff = BACKOFF_INITIAL_S
    waits = []
    for _ in range(10):
        wait, backoff = restart_delay(backoff, None)  # never ready: an app that fails at import
        waits.append(wait)
    assert waits[0] == BACKOFF_INITIAL_S
    assert all(later == min(earlier * 2, BACKOFF_MAX_S) for earlier, later in itertools.pairwise(waits))
    assert waits[-1] == BACKOFF_MAX_S


def test_a_child_ready_for_less_than_the_stable_time_backs_off() -> None:
    assert restart_delay(0.4, STABLE_AFTER_S / 2) == (0.4, 0.8)


def test_an_owner_killed_after_running_well_each_time_never_waits() -> None:
    """The soak of the issue: the owner SIGKILLed again and again, each time after serving for a while."""
    backoff = BACKOFF_INITIAL_S
    for _ in range(100):
        wait, backoff = restart_delay(backoff, STABLE_AFTER_S + 0.5)
        assert wait == 0.0


def test_final_statuses_are_those_retrying_cannot_change() -> None:
    assert {EXIT_ALREADY_RUNNING, EXIT_SCHEMA_TOO_NEW, EXIT_NOT_TETHER_DATABASE, EXIT_DATABASE_DAMAGED} <= EXITS_FINAL
    assert EXIT_FAILED not in EXITS_FINAL and EXIT_OK not in EXITS_FINAL
    assert -9 not in EXITS_FINAL  # a SIGKILLed owner is restarted


def test_an_owner_that_answered_within_the_timeout_is_looked_at_again_when_it_would_run_out() -> None:
    assert next_liveness_look(103.0, answered_s=100.0, asked_s=102.5, timeout_s=TIMEOUT_S) == 105.0
    assert next_liveness_look(103.0, answered_s=100.0, asked_s=None, timeout_s=TIMEOUT_S) == 105.0


def test_an_owner_asked_and_silent_for_the_timeout_is_hung() -> None:
    assert next_liveness_look(105.0, answered_s=100.0, asked_s=102.5, timeout_s=TIMEOUT_S) is None
    # Never answered since it started listening (its first question waits): hung as well.
    assert next_liveness_look(105.0, answered_s=100.0, asked_s=100.0, timeout_s=TIMEOUT_S) is None


def test_silence_the_supervisor_caused_itself_gets_a_question_and_a_moment_first() -> None:
    """The supervisor was stopped (Ctrl-Z, SIGSTOP) past the timeout: it asked nothing meanwhile, so the owner's silence
    says nothing yet; once a question waited the grace, it does."""
    assert next_liveness_look(160.0, answered_s=100.0, asked_s=None, timeout_s=TIMEOUT_S) == 160.0 + UNANSWERED_GRACE_S
    assert next_liveness_look(160.0, answered_s=100.0, asked_s=159.9, timeout_s=TIMEOUT_S) == 159.9 + UNANSWERED_GRACE_S
    assert next_liveness_look(161.0, answered_s=100.0, asked_s=159.9, timeout_s=TIMEOUT_S) is None


def test_the_grace_is_at_most_half_a_short_timeout() -> None:
    assert next_liveness_look(10.0, answered_s=9.0, asked_s=None, timeout_s=1.0) == 10.5
    assert next_liveness_look(10.0, answered_s=9.0, asked_s=9.5, timeout_s=1.0) is None
