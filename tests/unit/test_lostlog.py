"""Table tests for `streams.lostlog`: purge vs age-out, recreate, rewind, and the sample list."""

from __future__ import annotations

import pytest

from streams.lostlog import MAX_SAMPLES, LossDetector, StreamView, parse_time, stale_checkpoint

DAY = 86400.0
NOW = 1_800_000_000.0


def view(
    first: int,
    last: int,
    *,
    now: float = NOW,
    first_ts: float | None = None,
    last_ts: float | None = None,
    max_age: float = 30 * DAY,
    created: str = "c1",
) -> StreamView:
    messages = max(0, last - first + 1)
    return StreamView(
        created=created,
        first_seq=first,
        last_seq=last,
        messages=messages,
        first_ts=first_ts if messages else None,
        last_ts=last_ts,
        now=now,
        max_age=max_age,
    )


def test_info_is_parsed_with_server_time_and_max_age() -> None:
    info = {
        "created": "2026-12-01T21:15:53.05097485Z",
        "ts": "2026-12-01T21:15:54.5Z",
        "config": {"max_age": 2_592_000_000_000_000},
        "state": {
            "messages": 0,
            "first_seq": 4,
            "first_ts": "0001-01-01T00:00:00Z",
            "last_seq": 3,
            "last_ts": "2026-12-01T21:15:53.062309149Z",
        },
    }
    v = StreamView.from_info(info)
    assert (v.first_seq, v.last_seq, v.messages, v.first_ts) == (4, 3, 0, None)
    assert v.max_age == 30 * DAY
    assert v.now - v.last_ts == pytest.approx(1.437691, abs=1e-5)  # type: ignore[operator]
    assert parse_time("2026-12-01T21:15:53Z") == parse_time("2026-12-01T22:15:53+01:00")


def test_a_growing_stream_is_never_lost() -> None:
    d = LossDetector()
    for n in range(1, 50):
        assert d.observe(view(1, n * 10, first_ts=NOW - 100, last_ts=NOW + n, now=NOW + n), n * 10) is None


def test_full_purge_of_young_messages_is_detected() -> None:
    d = LossDetector()
    assert d.observe(view(1, 100, first_ts=NOW - 50, last_ts=NOW - 1), 100) is None
    # purged: empty, first seq past the last; last_ts still says when the last one was written
    reason = d.observe(view(101, 100, last_ts=NOW - 1, now=NOW + 2), 100)
    assert reason is not None and reason.kind == "purged" and "seq 100" in str(reason)


def test_a_purge_is_reported_once_after_the_fold_started_over() -> None:
    d = LossDetector()
    assert d.observe(view(1, 100, first_ts=NOW - 50, last_ts=NOW - 1), 100) is None
    purged = view(101, 100, last_ts=NOW - 1, now=NOW + 2)
    assert d.observe(purged, 100) is not None
    d.reset(purged)
    assert d.observe(purged, 0) is None
    assert d.observe(view(101, 103, first_ts=NOW + 3, last_ts=NOW + 4, now=NOW + 5), 103) is None


def test_age_out_of_old_messages_is_not_a_loss() -> None:
    d = LossDetector()
    old = NOW - 30 * DAY - 100
    d.seen(10, old)
    assert d.observe(view(1, 100, first_ts=old - 10, last_ts=NOW - 5), 100) is None
    # the first 40 aged out: the newest known removed one (seq 10) is older than max_age
    assert d.observe(view(41, 100, first_ts=NOW - 30 * DAY + 5, last_ts=NOW - 5), 100) is None


def test_partial_purge_of_young_head_is_detected_from_delivery_samples() -> None:
    d = LossDetector(granularity=1.0)
    assert d.observe(view(1, 5, first_ts=NOW - 60, last_ts=NOW - 56), 5) is None
    for seq in range(6, 60):
        d.seen(seq, NOW - 60 + seq)  # one a second
    reason = d.observe(view(30, 59, first_ts=NOW - 30, last_ts=NOW - 1), 59)
    assert reason is not None and reason.kind == "purged" and "seq 29" in str(reason)


def test_without_max_age_any_removal_is_a_purge() -> None:
    d = LossDetector()
    d.observe(view(1, 10, first_ts=NOW - 10 * DAY, last_ts=NOW - 9 * DAY, max_age=0), 10)
    assert d.observe(view(5, 10, first_ts=NOW - 9 * DAY, last_ts=NOW - 9 * DAY, max_age=0), 10) is not None


def test_borderline_removal_counts_as_age_out() -> None:
    d = LossDetector()
    d.seen(7, NOW - 30 * DAY + 0.5)  # within SLACK of the age limit
    assert d.observe(view(8, 20, first_ts=NOW - 100, last_ts=NOW, max_age=30 * DAY), 20) is None


def test_recreated_stream_is_detected_by_created_time() -> None:
    d = LossDetector()
    d.observe(view(1, 100, first_ts=NOW - 9, last_ts=NOW), 100)
    reason = d.observe(view(1, 300, first_ts=NOW, last_ts=NOW, created="c2"), 100)
    assert reason is not None and reason.kind == "recreated" and "created again" in str(reason)


def test_rewound_stream_is_detected() -> None:
    d = LossDetector()
    d.observe(view(1, 100, first_ts=NOW - 9, last_ts=NOW), 100)
    reason = d.observe(view(1, 40, first_ts=NOW - 9, last_ts=NOW), 100)
    assert reason is not None and reason.kind == "rewound" and "below the folded seq 100" in str(reason)


def test_reset_adopts_the_new_stream() -> None:
    d = LossDetector()
    d.observe(view(1, 100, first_ts=NOW - 9, last_ts=NOW), 100)
    new = view(1, 3, first_ts=NOW, last_ts=NOW + 1, created="c2")
    d.reset(new)
    assert d.observe(new, 3) is None and d.created == "c2"


def test_samples_are_thinned_to_the_granularity_and_bounded() -> None:
    d = LossDetector(granularity=10.0)
    for seq in range(1, 1001):
        d.seen(seq, NOW + seq * 0.5)  # two a second: one kept per ~10 s, plus the newest
    assert 45 <= len(d.samples) <= 55 and d.samples[-1] == (1000, NOW + 500)
    d = LossDetector(granularity=0.0)
    for seq in range(1, 3 * MAX_SAMPLES):
        d.seen(seq, NOW + seq)
    assert len(d.samples) <= MAX_SAMPLES + 1 and d.samples[-1][0] == 3 * MAX_SAMPLES - 1


def test_checkpoint_within_the_log_is_used() -> None:
    assert stale_checkpoint(50, view(1, 100, first_ts=NOW - 60, last_ts=NOW), stream_created="c1") is None
    # old messages aged out, the checkpoint's own position still in the log
    assert (
        stale_checkpoint(50, view(40, 100, first_ts=NOW - 60, last_ts=NOW), event_ts=NOW - 31 * DAY) is None
    )


def test_checkpoint_ahead_of_the_log_is_stale() -> None:
    reason = stale_checkpoint(150, view(1, 100, first_ts=NOW - 60, last_ts=NOW))
    assert reason is not None and "lost its tail" in reason


def test_checkpoint_of_another_stream_incarnation_is_stale() -> None:
    reason = stale_checkpoint(
        50, view(1, 100, first_ts=NOW - 60, last_ts=NOW, created="c2"), stream_created="c1"
    )
    assert reason is not None and "created again" in reason


def test_checkpoint_whose_young_events_were_purged_is_stale() -> None:
    v = view(101, 110, first_ts=NOW - 5, last_ts=NOW)  # purged at 100, then 10 new events
    assert "purged" in str(stale_checkpoint(80, v, event_ts=NOW - 3600))
    assert stale_checkpoint(80, v, event_ts=NOW - 31 * DAY) is None  # that is age-out
    assert stale_checkpoint(80, v) is None  # an old checkpoint without its origin: cannot tell


def test_a_message_written_over_at_a_folded_sequence_is_a_lost_tail() -> None:
    from streams.lostlog import overwritten

    assert overwritten(25, 1_000, 1_000) is None  # still the message folded
    assert overwritten(25, 1_000, None) is None  # missing: a purge or an age-out, observe's call
    assert overwritten(25, 0, 2_000) is None  # its time was never known: nothing to compare
    loss = overwritten(25, 1_000, 2_000)
    assert loss is not None and loss.kind == "rewound" and "seq 25" in str(loss)


def test_jetstream_times_are_read_to_the_nanosecond() -> None:
    from streams.lostlog import parse_time_ns

    assert parse_time_ns("2026-01-02T03:04:05.123456789Z") % 1_000_000_000 == 123_456_789
    assert parse_time_ns("2026-01-02T03:04:05Z") % 1_000_000_000 == 0
    assert parse_time_ns("0001-01-01T00:00:00Z") == 0 and parse_time_ns(None) == 0
