"""Instance assembly from the config, and ScaleP2D (prefill nodes rebuild a lost decode).

Per role the config names how many instances and how many nodes one spans; free healthy
nodes of that role are taken in registration order (rank 0 registered first, and its IP is the
master DP IP). Roles go union, decode, prefill, so a decode short of nodes sees freed prefill
nodes before the prefill rule re-assembles them.

After a lost log, nodes re-register with the instance they still run. An instance the log
does not hold (not live, and not one it saw terminated: they come back in any order) is
assembled again under its own id once all its nodes are back, so its engines keep serving:
the start that follows finds them running. Until then, for a grace of `heartbeat_timeout`
after their registration, its nodes are held out of new instances.
"""

from __future__ import annotations

from controller.instance_rules import terminate
from controller.operation_rules import wanted
from controller.rule_context import Cause, Ctx, Decision
from controller.state_queries import assemblable, is_borrowed, stop_outstanding
from core.bounds import MAX_INSTANCE_ID
from core.config import EngineSection
from core.events import InstanceAssembledData, InstanceMember, InstanceState, Role
from core.state import InstanceRecord, NodeRecord


def assemble(ctx: Ctx, busy: set[int]) -> list[Decision]:
    """Assemble what the config asks for and free nodes allow; borrow/return for ScaleP2D."""
    plan = _Plan(ctx, busy)
    for role in (Role.UNION, Role.DECODE, Role.PREFILL):
        sec = ctx.cfg.section(role)
        if sec is not None:
            plan.role(role, sec)
        if plan.terminated:
            break  # freed nodes are for the next round, on the state that has them
    return plan.out


class _Plan:
    def __init__(self, ctx: Ctx, busy: set[int]) -> None:
        self.ctx = ctx
        self.busy = busy
        self.taken: set[str] = set()
        self.next_id = ctx.state.next_instance_id
        self.out: list[Decision] = []
        self.terminated = False
        self._by_order: list[NodeRecord] | None = None
        self.held: set[str] = set()  # nodes waiting for the rest of their lost instance
        self._floor: int | None = None
        # The first ACTIVE instance of each shape, found once: `peer_ips` is asked per instance.
        self._peers: dict[tuple[object, ...], InstanceRecord | None] = {}

    @property
    def by_order(self) -> list[NodeRecord]:
        # Sorted only when a role is short: with 10k registered nodes this is most of a tick.
        if self._by_order is None:
            self._by_order = sorted(self.ctx.state.nodes.values(), key=lambda n: n.order)
        return self._by_order

    @property
    def claimed_floor(self) -> int:
        """The lowest id a new instance may take: above every id a node says it still runs."""
        if self._floor is None:
            claimed = (
                n.reg.instance_id + 1
                for n in self.by_order
                if n.reg.instance_id is not None and n.reg.running_endpoints
            )
            self._floor = max((self.ctx.state.next_instance_id, *claimed))
        return self._floor

    def free(self, role: Role, sec: EngineSection) -> list[NodeRecord]:
        return [
            n
            for n in self.by_order
            if n.reg.role == role
            and n.node_id not in self.taken
            and n.node_id not in self.held
            and assemblable(self.ctx.state, n, sec.engine_type, self.ctx.idx)
        ]

    def role(self, role: Role, sec: EngineSection) -> None:
        state = self.ctx.state
        mine = [i for i in state.instances.values() if i.spec.role == role]
        borrowed = [i for i in mine if is_borrowed(state, i)]
        own = len(mine) - len(borrowed)
        npi = sec.nodes_per_instance()
        want = wanted(self.ctx, role, sec)
        made = self.readopt(role, sec, npi, want - own) if own < want else 0
        # Free nodes are listed once: only this loop's own picks change who is free, and a list
        # per instance made a cold start of n nodes cost n**2 checks (20 s of decide at 4000).
        free = self.free(role, sec) if own + made < want else []
        used = 0
        while own + made < want:
            picked = free[used : used + npi]
            if len(picked) < npi:
                break
            used += npi
            made += 1
            self.add(role, sec, picked, f"{own + made}/{want}")
        if role != Role.DECODE or not self.ctx.cfg.controller.scale_p2d:
            return
        if borrowed:
            self.give_back(role, mine, borrowed, want)
        elif own + made < want:
            self.borrow(sec, npi, f"{own + made + 1}/{want}")

    def readopt(self, role: Role, sec: EngineSection, npi: int, wanted: int) -> int:
        """Assemble again, under their ids, lost instances whose nodes all came back running them."""
        state, ctx = self.ctx.state, self.ctx
        groups: dict[int, list[NodeRecord]] = {}
        for n in self.by_order:
            iid = n.reg.instance_id
            if (
                iid is not None
                and iid not in state.instances
                and iid not in state.retired  # not one the log terminated: one it lost
                and n.reg.running_endpoints
                and n.reg.role == role
                and n.node_id not in self.taken
                and assemblable(state, n, sec.engine_type, ctx.idx)
            ):
                groups.setdefault(iid, []).append(n)
        made = 0
        for iid, nodes in sorted(groups.items()):
            if len(nodes) == npi and made < wanted:
                made += 1
                self.add(role, sec, nodes, f"{iid} again", iid=iid)
            elif (
                len(nodes) < npi
                and ctx.now - max(n.registered_ts for n in nodes) < ctx.cfg.controller.heartbeat_timeout
            ):
                self.held.update(n.node_id for n in nodes)
        return made

    def add(
        self, role: Role, sec: EngineSection, picked: list[NodeRecord], of: str, *, iid: int | None = None
    ) -> None:
        readopted = iid is not None
        if iid is None:
            iid = max(self.next_id, self.claimed_floor)
        if iid > MAX_INSTANCE_ID:
            # The log holds an instance of the last id an event may carry (`core.bounds`: out
            # of reach in practice): no event could name another, so none is assembled.
            return
        self.next_id = max(self.next_id, iid + 1)
        self.taken.update(n.node_id for n in picked)
        members = tuple(
            InstanceMember(node_id=n.node_id, node_rank=r, ip=n.reg.pod_ip, endpoints=n.reg.endpoints)
            for r, n in enumerate(picked)
        )
        data = InstanceAssembledData(
            instance_id=iid,
            role=role,
            engine_type=sec.engine_type,
            model=sec.model,
            job_name=picked[0].reg.job_name,
            members=members,
            master_dp_ip=members[0].ip,
            d2d_peer_ips=self.peer_ips(role, sec, members),
            capabilities=picked[0].reg.capabilities,
        )
        newest = max(picked, key=lambda n: n.registered_seq)
        on = ", ".join(n.node_id for n in picked)
        if readopted:
            why = (
                f"re-adopting {role.value} instance {iid} on {on}: its nodes re-registered running it, "
                "the log no longer has it (lost tail)"
            )
            key: tuple[object, ...] = ("readopt", *(n.registered_id for n in picked))
        else:
            borrowed = (
                "" if picked[0].reg.role == role else f" from {picked[0].reg.role.value} nodes (ScaleP2D)"
            )
            why = f"assembling {role.value} instance {iid} ({of}) on {on}{borrowed}"
            key = tuple(n.node_id for n in picked)
        cause = Cause(newest.registered_seq, newest.registered_id, why)
        self.out.append(self.ctx.assembled(data, cause, *key))

    def peer_ips(
        self, role: Role, sec: EngineSection, members: tuple[InstanceMember, ...]
    ) -> tuple[str, ...]:
        """D2D weight-transfer peers: a running instance of the same shape, `<endpoint_id>:<peer_ip>`."""
        shape = tuple(len(m.endpoints) for m in members)
        key = (role, sec.model, sec.engine_type, shape)
        if key not in self._peers:
            self._peers[key] = next(
                (
                    inst
                    for inst in sorted(self.ctx.state.instances.values(), key=lambda i: i.instance_id)
                    if inst.state == InstanceState.ACTIVE
                    and inst.spec.role == role
                    and inst.spec.model == sec.model
                    and inst.spec.engine_type == sec.engine_type
                    and tuple(len(m.endpoints) for m in inst.spec.members) == shape
                ),
                None,
            )
        peer = self._peers[key]
        if peer is None:
            return ()
        return tuple(
            f"{ep.id}:{p.ip}" for m, p in zip(members, peer.spec.members, strict=True) for ep in m.endpoints
        )

    # ----------------------------------------------------------------- ScaleP2D

    def borrow(self, sec: EngineSection, npi: int, of: str) -> None:
        """A decode lost to a hardware fault and no free decode node: rebuild it from prefill."""
        state = self.ctx.state
        lost = [
            f
            for f in state.faults.values()
            if f.data.node_id in self.ctx.idx.blocked
            and (n := state.nodes.get(f.data.node_id)) is not None
            and n.reg.role == Role.DECODE
        ]
        if not lost:
            return
        psec = self.ctx.cfg.section(Role.PREFILL)
        if psec is None or psec.engine_type != sec.engine_type:
            return
        spare = self.free(Role.PREFILL, psec)[:npi]
        if len(spare) == npi:
            self.add(Role.DECODE, sec, spare, of)
            return
        if any(
            n.reg.role == Role.PREFILL and n.node_id not in self.ctx.idx.member_of and stop_outstanding(n)
            for n in self.by_order
        ):
            return  # a prefill instance is already being taken apart
        prefills = sorted(
            (
                i
                for i in state.instances.values()
                if i.spec.role == Role.PREFILL and not is_borrowed(state, i)
            ),
            key=lambda i: i.instance_id,
        )
        victims = [
            i
            for i in prefills
            if i.instance_id not in self.busy and i.instance_id not in self.ctx.idx.alarms_by_instance
        ]
        if len(prefills) < 2 or not victims:
            return  # keep at least one prefill instance serving
        victim = victims[-1]
        f = max(lost, key=lambda f: f.seq)
        why = f"ScaleP2D: decode node {f.data.node_id} lost ({f.data.code}); taking prefill instance {victim.instance_id}'s nodes"
        self._terminate(victim, Cause(f.seq, f.event_id, why))

    def give_back(
        self, role: Role, mine: list[InstanceRecord], borrowed: list[InstanceRecord], want: int
    ) -> None:
        """Enough own decode instances are ACTIVE again: return the borrowed nodes to prefill."""
        own_active = [i for i in mine if i not in borrowed and i.state == InstanceState.ACTIVE]
        if len(own_active) < want:
            return
        victim = next(
            (i for i in sorted(borrowed, key=lambda i: i.instance_id) if i.instance_id not in self.busy), None
        )
        if victim is None:
            return
        newest = max(own_active, key=lambda i: i.assembled_seq)
        why = (
            f"ScaleP2D: decode capacity restored (instance {newest.instance_id}); returning nodes to prefill"
        )
        self._terminate(victim, Cause(newest.assembled_seq, newest.assembled_id, why))

    def _terminate(self, inst: InstanceRecord, cause: Cause) -> None:
        self.busy.add(inst.instance_id)
        self.terminated = True
        self.out += terminate(self.ctx, inst, cause, isolate_first=False)
