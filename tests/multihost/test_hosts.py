"""Faults of a fleet spread over hosts, under client traffic (issue 18): the nats-server that
leads the MOTOR stream killed -9; the controller leader's host cut off the network for 20 s;
a whole host killed and brought back.

Invariants beside the chaos suite's: every event a publisher got an ack for is in the log
afterwards (ids compared); one start command per instance incarnation; no client-visible
failure where a retry was possible (the client moves to the other coordinator when its
connection fails); everything ACTIVE again within 30 s of the fault ending. A cut host decides
nothing, the majority goes on, and the cut host's instances come back ACTIVE with the engines
they had.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from streams.definitions import HB_STREAM
from tests.chaos import invariants as inv
from tests.chaos.faults import signal_pid
from tests.chaos.scenario import CONVERGE_WITHIN, Scenario
from tests.multihost import invariants as mhinv
from tests.multihost.harness import CLIENT_TIMEOUT, MultiHost

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(600)]

CUT_FOR = 20.0
HOST_DOWN_FOR = 10.0
NATS_DOWN_FOR = 10.0
# A stream whose leader's server is gone elects another after nats-server's Raft election
# timeout (4-9 s, server/raft.go) and a campaign (under 1 s): the log, and the lease bucket
# with it, cannot take a write before that. A controller failover that loses the lease's or
# the log's leader as well takes that long on top of nothing: the lease TTL runs meanwhile.
ELECTION_WITHIN = 10.0
HOST_FAILOVER_WITHIN = ELECTION_WITHIN + 2.0
RETRY_WINDOW = float(CLIENT_TIMEOUT.read or 15.0) + 5.0  # a stream stalled at the fault gives up this late


async def _finish_common(
    sc: Scenario,
    mh: MultiHost,
    *,
    fault_ended: float,
    took: tuple[float | None, str],
    killed: tuple[str, ...] = (),
    retry_until: float | None,
) -> list[inv.Entry]:
    """The chaos suite's checks (re-convergence, clients, processes, one start per incarnation)
    and the ack audit."""
    entries = await sc.common(fault_ended=fault_ended, killed=killed, reconnect_until=retry_until, took=took)
    result, why = await mh.ack_audit()
    sc.check(mhinv.acked_kept(result, why))
    return entries


async def test_the_nats_server_leading_the_log_killed(mh: MultiHost) -> None:
    sc = await Scenario.begin(
        mh, f"the MOTOR stream's leader nats-server killed -9, down {NATS_DOWN_FOR:g} s"
    )  # type: ignore[arg-type]
    before = await mh.placement()
    assert before.leader is not None, before.describe()
    # The heartbeat stream led by the same server: both are leaderless until an election, so
    # no heartbeat lands meanwhile, and the controllers must not judge that silence.
    await mh.lead_on(HB_STREAM, before.leader)
    victim = mh.cluster.nats_servers.server(before.leader)
    name = f"nats-{before.leader}"
    async with sc.traffic():
        with mh.cluster.supervisor.hold(name):
            assert victim.pid is not None
            killed_at = sc.fault(signal_pid(victim.pid, signal.SIGKILL))
            print(f"   killed {name} (pid {victim.pid}) on {mh.cluster.host_of(name).name}", flush=True)
            after, elected = await mh.new_log_leader(before.leader, within=NATS_DOWN_FOR)
            sc.check(mhinv.log_leader_elected(before.leader, after, elected, ELECTION_WITHIN))
            await asyncio.sleep(max(0.0, killed_at + NATS_DOWN_FOR - time.time()))
        back_at = time.time()  # released: the supervisor starts it again on its store
        took = await sc.converge(back_at)
        current = await mh.current_again(before.leader, within=CONVERGE_WITHIN)
        sc.check(
            inv.Check(
                "16 the killed server catches up",
                current is not None,
                f"{before.leader} current again {current - back_at:.1f} s after its restart"
                if current is not None
                else f"{before.leader} not current {CONVERGE_WITHIN:g} s after its restart",
            )
        )
    entries = await _finish_common(sc, mh, fault_ended=back_at, took=took, killed=(name,), retry_until=None)
    sc.check(inv.nothing_judged_by_outage(entries, killed_at))
    sc.finish()


async def test_the_leaders_host_cut_off_for_20_s(mh: MultiHost) -> None:
    sc = await Scenario.begin(mh, f"the controller leader's host cut off for {CUT_FOR:g} s")  # type: ignore[arg-type]
    leader = await mh.leader()
    assert leader is not None, "no controller leads"
    host = mh.cluster.host_of(leader)
    state = await mh.fold()
    assert state is not None
    cut_instances = mh.instances_on(state, host)
    others = sorted(set(state.instances) - set(cut_instances))
    pids = mh.engine_pids(state, host)
    has_coordinator = any(n.startswith("coordinator") for n in mh.processes_on(host))
    print(
        f"   cutting {host.name} ({leader}, {', '.join(mh.processes_on(host))}); instances {cut_instances}",
        flush=True,
    )
    async with sc.traffic(retry_connection_errors=True):
        cut_at = sc.fault(mh.net.cut(host))
        await asyncio.sleep(max(0.0, cut_at + CUT_FOR - time.time()))
        healed_at = mh.net.heal(host)
        print(f"   healed {host.name} after {healed_at - cut_at:.1f} s", flush=True)
        took = await sc.converge(healed_at)
    entries = await _finish_common(
        sc,
        mh,
        fault_ended=healed_at,
        took=took,
        retry_until=healed_at + RETRY_WINDOW if has_coordinator else None,
    )
    decided = await mh.leader_changed_since(cut_at, within=5)
    sc.check(inv.failover(cut_at, decided, HOST_FAILOVER_WITHIN, "the majority's controller"))
    sc.check(mhinv.minority_decided_nothing(entries, mh.sources_on(host), cut_at, healed_at))
    sc.check(
        mhinv.majority_went_on(
            entries,
            cut_at=cut_at,
            healed_at=healed_at,
            leader_was_cut=True,
            cut_instances=cut_instances,
            other_instances=others,
        )
    )
    sc.check(mhinv.no_start_for(entries, cut_instances, cut_at))
    state = await mh.fold()
    assert state is not None
    sc.check(inv.engines_kept(pids, mh.engine_pids(state, host), entries, cut_at))
    sc.finish()


async def test_a_whole_host_killed_and_brought_back(mh: MultiHost) -> None:
    leader = await mh.leader()
    assert leader is not None
    host = mh.cluster.host_of(leader)  # the leader's host: a failover on top of the host's loss
    sc = await Scenario.begin(
        mh, f"host {host.name} killed (every process) and back after {HOST_DOWN_FOR:g} s"
    )  # type: ignore[arg-type]
    names = tuple(mh.processes_on(host))
    has_coordinator = any(n.startswith("coordinator") for n in names)
    async with sc.traffic(retry_connection_errors=True):
        with mh.held(host):
            down_at = sc.fault(await asyncio.to_thread(mh.net.kill, host))
            print(f"   killed every process of {host.name}: {', '.join(names)}", flush=True)
            await asyncio.sleep(max(0.0, down_at + HOST_DOWN_FOR - time.time()))
        back_at = time.time()  # released: the supervisor starts the host's processes again
        print(f"   {host.name} back after {back_at - down_at:.1f} s", flush=True)
        # Until its coordinator listens again a client's connection there is refused: it retries.
        serving = await mh.serving_again(host, within=CONVERGE_WITHIN) if has_coordinator else None
        took = await sc.converge(back_at)
    await _finish_common(sc, mh, fault_ended=back_at, took=took, killed=names, retry_until=serving)
    # From the log: the announcement may come after the host is back, if NATS took that long.
    decided = await mh.leader_changed_since(down_at, within=5)
    sc.check(inv.failover(down_at, decided, HOST_FAILOVER_WITHIN, "a controller"))
    sc.finish()
