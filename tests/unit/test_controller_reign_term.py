"""The term a new reign announces: past every term node agents may have obeyed."""

from __future__ import annotations

import pytest

from controller.leadership import reign_term


@pytest.mark.parametrize(
    ("lease_term", "folded", "floor", "term"),
    [
        (1, None, 0, 1),  # the first reign of a fresh log
        (1, 1, 0, 2),  # a successor: one past the log's last leader
        (5, 2, 0, 5),  # the lease already names a higher reign (an earlier try of ours)
        # After a purge the log names no leader; the agents obeyed term 3 before it: a reign
        # counted from the log alone (1) would have every command refused stale_term.
        (1, None, 3, 4),
        (3, None, 3, 4),
        (1, 2, 3, 4),  # the new log's leader is older than what was folded before the loss
        (1, 7, 3, 8),
    ],
)
def test_a_reign_is_named_past_the_log_and_past_what_was_folded_before_a_lost_log(
    lease_term: int, folded: int | None, floor: int, term: int
) -> None:
    assert reign_term(lease_term, folded, floor) == term
