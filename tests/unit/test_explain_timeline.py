"""`motor replay --explain` chains and the timeline page, over a hand-made incident log."""

from dataclasses import dataclass
from typing import Any

from core import subjects
from core.events import (
    CausedBy,
    FaultReported,
    FaultReportedData,
    InstanceStateChanged,
    InstanceStateChangedData,
    LeaderChanged,
    LeaderChangedData,
)
from replay.explain import explain, render
from replay.timeline import build_lanes, render_html
from tests.unit.factories import assembled, ep_status, registered, start_cmd


@dataclass
class Rec:
    seq: int
    subject: str
    event: Any


def incident() -> list[Rec]:
    evs: list[Any] = [
        LeaderChanged(
            id="lead", ts=100.0, source="controller/c1", data=LeaderChangedData(leader_id="c1", term=1)
        ),
        registered("n7", ts=100.5),
        assembled(3, ["n7"], ts=101.0),
        start_cmd("n7", 3, ts=101.1),
        ep_status("n7", "READY", ts=102.0, instance_id=3),
        InstanceStateChanged(
            id="act",
            ts=102.1,
            source="controller/c1",
            data=InstanceStateChangedData(instance_id=3, state="ACTIVE", previous="INITIAL"),
        ),
        FaultReported(
            id="fault",
            ts=110.0,
            source="operator",
            data=FaultReportedData(
                fault_id="f1", node_id="n7", level="L5", code="CardUnhealthy", kind="hardware"
            ),
        ),
    ]
    recs = [Rec(i + 1, subjects.for_event(e), e) for i, e in enumerate(evs)]
    iso = InstanceStateChanged(
        id="iso",
        ts=110.2,
        source="controller/c1",
        caused_by=CausedBy(id="fault", seq=7),
        data=InstanceStateChangedData(
            instance_id=3, state="ISOLATED", previous="ACTIVE", reason="fault L5 CardUnhealthy"
        ),
    )
    recs.append(Rec(8, subjects.for_event(iso), iso))
    return recs


def test_explain_instance_names_the_fault_newest_first() -> None:
    lines = explain(incident(), "instance", "3")
    assert "ISOLATED" in lines[0].summary
    assert lines[0].chain and "fault.reported L5 CardUnhealthy on n7, seq 7" in lines[0].chain[0]
    text = render(lines)
    assert "← fault.reported L5 CardUnhealthy" in text
    assert [ln.seq for ln in lines] == sorted((ln.seq for ln in lines), reverse=True)


def test_explain_node_includes_assembly_and_fault() -> None:
    summaries = [ln.summary for ln in explain(incident(), "node", "n7")]
    assert any("assembled" in s for s in summaries)
    assert any("CardUnhealthy" in s for s in summaries)


def test_explain_broken_link_says_so() -> None:
    recs = incident()[-1:]  # the isolation without the fault it answers
    lines = explain(recs, "instance", "3")
    assert "not in this log range" in lines[0].chain[0]


def test_timeline_lanes_and_self_contained() -> None:
    recs = incident()
    keys = [ln.key for ln in build_lanes(recs)[0]]
    assert keys == ["instance-3", "endpoint-n7-0", "marks-fault", "marks-command", "marks-leader"]
    page = render_html(recs)
    assert page.count('class="lane ') == len(keys)
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "state-ISOLATED" in page and "mark-fault" in page
