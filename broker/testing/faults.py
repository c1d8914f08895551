"""Fault injection: make the real broker fail on purpose, the same way through three doors.

    faults.fail("Produce", "NOT_LEADER_OR_FOLLOWER", times=2)          # the Python API
    POST /faults {"api": "Produce", "error": "NOT_LEADER_OR_FOLLOWER", "times": 2}   # HTTP, metrics.port
    python -m broker --fault api=Produce,error=NOT_LEADER_OR_FOLLOWER,times=2         # command line

A fault applies to the next `times` requests of one API (named as Kafka names it), optionally only
to those about one topic, topic-partition or group, in the order they arrive: deterministic. It
*fails* them with a Kafka error (only the matching partitions or groups of a request fail; the
handler serves the rest, see addressing.py), *delays* them, *disconnects* instead of answering,
or *drops* them (never answered: the client times out). `fail_disk` makes the next writes to a
partition's log fail as a broken disk does (the append path turns that into KAFKA_STORAGE_ERROR,
the coordinators into a reload). Every injection is logged and counted (metrics:
kafka_faults_injected).

One interception point: the server looks the request's API key up in `intercepts` (one dict
lookup; the dict is empty while nothing is armed) and, when a fault is armed for that API, runs
`Faults.intercept` instead of the handler. Faults are armed from any thread (the test's); they are
consumed on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import errno
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.apis import Handler, Intercept, RequestContext
from broker.apis.addressing import Key, Role, answer_in_part, fail_entries_after, keys, roles
from broker.observability.logger import get_logger
from broker.observability.metrics import counter
from protocol import messages as M
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from prometheus_client.core import Metric

log = get_logger("broker.faults")

FAIL, DELAY, DISCONNECT, DROP, FAIL_DISK = "fail", "delay", "disconnect", "drop", "fail_disk"
ACTIONS = (FAIL, DELAY, DISCONNECT, DROP, FAIL_DISK)
MOVE_LEADER, MOVE_COORDINATOR, NODE_DOWN, NODE_UP = "move_leader", "move_coordinator", "node_down", "node_up"
CLUSTER_ACTIONS = {MOVE_LEADER: ("topic", "partition", "to"), MOVE_COORDINATOR: ("group", "to", "coordinator"),
                   NODE_DOWN: ("node",), NODE_UP: ("node",)}
COORDINATOR_KEY_TYPES = {"group": 0, "transaction": 1}
CLUSTER_CHANGE_S = 60.0
METADATA = 3
API_KEYS = {name.lower(): key for key, name in M.API_NAMES.items()}
API_NAMES = dict(M.API_NAMES)

_ERRORS_BY_CODE = {int(code): code for code in ErrorCode}


def api_key_of(api: str | int) -> int:
    """An API by Kafka's name ("Produce", any case) or key."""
    if isinstance(api, int):
        if api not in API_NAMES:
            raise ValueError("unknown API key %d" % api)
        return api
    key = API_KEYS.get(str(api).lower())
    if key is None:
        raise ValueError("unknown API %r (Kafka's names: Produce, Fetch, Metadata, ...)" % api)
    return key


def error_code_of(error: str | int) -> ErrorCode:
    """An error by Kafka's name ("NOT_LEADER_OR_FOLLOWER") or code."""
    found = _ERRORS_BY_CODE.get(error) if isinstance(error, int) else ErrorCode.__members__.get(str(error).upper())
    if found is None:
        raise ValueError("unknown Kafka error %r" % error)
    return found


def _node(value: Any) -> int | None:
    return None if value is None else int(value)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def parse_fault_spec(text: str) -> dict[str, Any]:
    """The command line's fault: `key=value,key=value` or a JSON object (as POST /faults takes)."""
    text = text.strip()
    if text.startswith("{"):
        spec = json.loads(text)
        if not isinstance(spec, dict):
            raise ValueError("a fault is a JSON object")
        return spec
    out: dict[str, Any] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError("a fault is key=value pairs separated by commas, got %r" % item)
        out[key.strip()] = value.strip()
    return out


@dataclass
class Fault:
    """One armed fault; `injected` counts the requests (or writes) it hit, `times` those left."""

    action: str
    api: str  # Kafka's API name; "" for fail_disk
    times: int
    error: ErrorCode | None = None
    delay_ms: int = 0
    topic: str | None = None
    partition: int | None = None
    group: str | None = None
    injected: int = 0
    api_key: int = field(default=-1, repr=False)

    def matches(self, key: Key) -> bool:
        return ((self.topic is None or self.topic == key.topic)
                and (self.partition is None or self.partition == key.partition)
                and (self.group is None or self.group == key.group))

    @property
    def filtered(self) -> bool:
        return self.topic is not None or self.partition is not None or self.group is not None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.action, "times": self.times, "injected": self.injected}
        for name in ("api", "topic", "partition", "group"):
            value = getattr(self, name)
            if value not in (None, ""):
                out[name] = value
        if self.error is not None:
            out["error"] = self.error.name
        if self.action == DELAY:
            out["ms"] = self.delay_ms
        return out


class Faults:
    def __init__(self) -> None:
        self.intercepts: dict[int, Intercept] = {}  # read by the server: API key -> what runs instead of the handler
        self.injected: Counter[tuple[str, str, str]] = Counter()  # (api, action, error) -> count, for metrics
        self._armed: list[Fault] = []
        self._lock = threading.Lock()
        self._broker: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sleepers: set[asyncio.Future[None]] = set()
        self._router: Intercept | None = None  # the simulated cluster's routing, after the faults
        self._routed: frozenset[int] = frozenset()

    # the Python door -----------------------------------------------------------------------------
    def fail(self, api: str | int, error: str | int, times: int = 1, topic: str | None = None,
             partition: int | None = None, group: str | None = None) -> Fault:
        """Answer the next `times` matching requests of `api` with `error` (Kafka's name)."""
        code = error_code_of(error)
        if code is ErrorCode.NONE:
            raise ValueError("NONE is no error to fail with")
        return self._arm_request(FAIL, api, times, topic, partition, group, error=code)

    def delay(self, api: str | int, ms: int, times: int = 1, topic: str | None = None,
              partition: int | None = None, group: str | None = None) -> Fault:
        """Hold the next `times` matching requests of `api` for `ms` before handling them."""
        if ms < 0:
            raise ValueError("a delay cannot be negative")
        return self._arm_request(DELAY, api, times, topic, partition, group, delay_ms=int(ms))

    def disconnect(self, api: str | int, times: int = 1, topic: str | None = None,
                   partition: int | None = None, group: str | None = None) -> Fault:
        """Close the connection instead of handling the next `times` matching requests of `api`."""
        return self._arm_request(DISCONNECT, api, times, topic, partition, group)

    def drop(self, api: str | int, times: int = 1, topic: str | None = None,
             partition: int | None = None, group: str | None = None) -> Fault:
        """Never answer the next `times` matching requests of `api` (the client times out)."""
        return self._arm_request(DROP, api, times, topic, partition, group)

    def fail_disk(self, topic: str, partition: int, times: int = 1) -> Fault:
        """Fail the next `times` writes to the partition's log as a broken disk does (EIO)."""
        fault = Fault(FAIL_DISK, "", self._times(times), ErrorCode.KAFKA_STORAGE_ERROR, topic=topic,
                      partition=int(partition))
        with self._lock:
            if self._broker is not None:
                self._install_disk_fault(fault)
            self._armed.append(fault)
        log.info("fault armed", **fault.describe())
        return fault

    # the cluster changes (simulated.brokers > 1; broker/testing/simulated.py) -------------------
    def move_leader(self, topic: str, partition: int, to: int | None = None) -> int:
        """Move the partition's leadership to another in-sync replica (`to`, or the next one);
        returns the new leader."""
        return int(self._on_loop(MOVE_LEADER, {"topic": topic, "partition": partition, "to": to}))

    def move_coordinator(self, group: str, to: int | None = None, coordinator: str = "group") -> int:
        """Move the coordinator of a group (`coordinator="transaction"`: of a transactional id);
        returns its new node."""
        return int(self._on_loop(MOVE_COORDINATOR, {"group": group, "to": to, "coordinator": coordinator}))

    def node_down(self, node: int) -> None:
        """Take a node down: its ports close; the partitions and coordinators it led move."""
        self._on_loop(NODE_DOWN, {"node": node})

    def node_up(self, node: int) -> None:
        """Bring a node back on its ports; it rejoins the in-sync replicas."""
        self._on_loop(NODE_UP, {"node": node})

    def _on_loop(self, action: str, args: dict[str, Any]) -> Any:
        """Run a cluster change on the broker's loop from another thread (the test's) and wait."""
        loop = self._loop
        if loop is None:
            raise ValueError("%s needs a running broker" % action)
        if _running_loop() is loop:
            raise RuntimeError("%s blocks: from the broker's own loop await apply() instead" % action)
        return asyncio.run_coroutine_threadsafe(self._change_cluster(action, args), loop).result(CLUSTER_CHANGE_S)

    async def _change_cluster(self, action: str, args: dict[str, Any]) -> Any:
        broker = self._broker
        cluster = getattr(broker, "simulated", None) if broker is not None else None
        if cluster is None:
            raise ValueError("%s needs a simulated cluster (simulated.brokers > 1)" % action)
        described = {k: v for k, v in args.items() if v is not None}
        if action == MOVE_LEADER:
            result = await cluster.move_leader(args["topic"], int(args["partition"]), _node(args.get("to")))
        elif action == MOVE_COORDINATOR:
            key_type = COORDINATOR_KEY_TYPES.get(str(args.get("coordinator") or "group"))
            if key_type is None:
                raise ValueError("coordinator is one of %s" % ", ".join(COORDINATOR_KEY_TYPES))
            result = await cluster.move_coordinator(args["group"], key_type, _node(args.get("to")))
        elif action == NODE_DOWN:
            result = await cluster.node_down(int(args["node"]))
        else:
            result = await cluster.node_up(int(args["node"]))
        with self._lock:
            self.injected[("", action, "")] += 1
        log.warning("fault injected", action=action, result=result, **described)
        return result

    async def apply(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The HTTP door (on the broker's loop): arm a request fault or change the cluster."""
        spec = dict(spec)
        action = str(spec.get("action", FAIL)).lower()
        if action not in CLUSTER_ACTIONS:
            return self.arm(spec).describe()
        spec.pop("action")
        allowed = CLUSTER_ACTIONS[action]
        unknown = set(spec) - set(allowed)
        missing = [k for k in allowed if k not in spec and k not in ("to", "coordinator")]
        if unknown or missing:
            raise ValueError("a %s takes %s" % (action, ", ".join(allowed)))
        result = await self._change_cluster(action, spec)
        return {"action": action, **spec, **({"result": result} if result is not None else {})}

    def clear(self) -> None:
        """Disarm every fault."""
        with self._lock:
            for fault in self._armed:
                if fault.action == FAIL_DISK:
                    self._remove_disk_fault(fault)
            self._armed.clear()
            self.intercepts.clear()
            for key in self._routed:
                self._settle(key)
        log.info("faults cleared")

    @property
    def armed(self) -> list[dict[str, Any]]:
        with self._lock:
            return [fault.describe() for fault in self._armed]

    # the HTTP and command-line doors -------------------------------------------------------------
    def arm(self, spec: Mapping[str, Any]) -> Fault:
        """Arm a fault described as the HTTP door's JSON object: `action` (fail, delay, disconnect,
        drop, fail_disk; fail by default), `api`, `error`, `ms`, `times`, `topic`, `partition`,
        `group`."""
        spec = dict(spec)
        action = str(spec.pop("action", FAIL)).lower()
        if action not in ACTIONS:
            raise ValueError("unknown action %r (one of %s)" % (action, ", ".join(ACTIONS)))
        wanted = {FAIL: ("api", "error"), DELAY: ("api", "ms"), FAIL_DISK: ("topic", "partition")}.get(action, ("api",))
        optional = ("times",) if action == FAIL_DISK else ("times", "topic", "partition", "group")
        unknown = set(spec) - set(wanted) - set(optional)
        if unknown:
            raise ValueError("unknown settings of a %s fault: %s" % (action, ", ".join(sorted(unknown))))
        missing = [k for k in wanted if k not in spec]
        if missing:
            raise ValueError("a %s fault needs %s" % (action, " and ".join(missing)))
        for name in ("times", "partition", "ms"):
            if name in spec:
                spec[name] = int(spec[name])
        if action == FAIL_DISK:
            return self.fail_disk(**spec)
        return getattr(self, action)(**spec)  # type: ignore[no-any-return]

    # arming --------------------------------------------------------------------------------------
    @staticmethod
    def _times(times: int) -> int:
        if int(times) < 1:
            raise ValueError("times must be at least 1")
        return int(times)

    def _arm_request(self, action: str, api: str | int, times: int, topic: str | None, partition: int | None,
                     group: str | None, **extra: Any) -> Fault:
        key = api_key_of(api)
        if partition is not None and topic is None:
            raise ValueError("a partition needs its topic")
        about = roles(key)
        if topic is not None and Role.TOPIC not in about:
            raise ValueError("%s requests name no topics" % API_NAMES[key])
        if group is not None and Role.GROUP not in about:
            raise ValueError("%s requests name no groups" % API_NAMES[key])
        fault = Fault(action, API_NAMES[key], self._times(times), topic=topic,
                      partition=None if partition is None else int(partition), group=group, api_key=key, **extra)
        with self._lock:
            self._armed.append(fault)
            self.intercepts[key] = self.intercept
        log.info("fault armed", **fault.describe())
        return fault

    def _take(self, ctx: RequestContext, request: Any) -> Fault | None:
        """The first armed fault of the request's API that matches it, one of its times used up."""
        api_key = ctx.api_key
        with self._lock:
            for fault in self._armed:
                if fault.api_key != api_key:
                    continue
                if fault.filtered and api_key != METADATA and not any(
                        fault.matches(k) for k in keys(api_key, ctx.api_version, request, self._resolver(ctx))):
                    continue
                self._use(fault)
                return fault
        return None

    def _use(self, fault: Fault) -> None:
        """One hit of `fault` (under the lock): counted, and disarmed when it has no times left."""
        fault.times -= 1
        fault.injected += 1
        self.injected[(fault.api or "", fault.action, fault.error.name if fault.error is not None else "")] += 1
        if fault.times == 0:
            self._armed.remove(fault)
            if fault.api_key >= 0 and not any(f.api_key == fault.api_key for f in self._armed):
                self._settle(fault.api_key)

    def _settle(self, api_key: int) -> None:
        """No fault is armed for the API (under the lock): the server calls the router or the handler."""
        if self._router is not None and api_key in self._routed:
            self.intercepts[api_key] = self._router
        else:
            self.intercepts.pop(api_key, None)

    def route(self, router: Intercept | None, api_keys: Iterable[int] = ()) -> None:
        """Requests of these APIs go through `router` (the simulated cluster), after any fault."""
        with self._lock:
            previous, self._routed = self._routed, frozenset(api_keys) if router is not None else frozenset()
            self._router = router
            for key in previous | self._routed:
                if not any(f.api_key == key for f in self._armed):
                    self._settle(key)

    def _inner(self, api_key: int, handler: Handler) -> Handler:
        router = self._router
        if router is None or api_key not in self._routed:
            return handler

        async def routed(ctx: RequestContext, request: Any) -> Any:
            return await router(ctx, request, handler)

        return routed

    @staticmethod
    def _resolver(ctx: RequestContext) -> Callable[[Any], str | None]:
        return ctx.broker.metadata.topic_name

    # the interception point ----------------------------------------------------------------------
    async def intercept(self, ctx: RequestContext, request: Any, handler: Handler) -> Any:
        """Run by the server instead of `handler` while a fault is armed for the request's API."""
        handler = self._inner(ctx.api_key, handler)
        if ctx.api_key == METADATA:
            return await self._metadata(ctx, request, handler)
        fault = self._take(ctx, request)
        if fault is None:
            return await handler(ctx, request)
        return await self._act(ctx, request, handler, fault)

    async def _metadata(self, ctx: RequestContext, request: Any, handler: Handler) -> Any:
        """Metadata may name no topic (all of them): a fault about a topic looks at the answer."""
        with self._lock:
            fault = next((f for f in self._armed if f.api_key == METADATA), None)
        if fault is None:
            return await handler(ctx, request)
        response = None
        if fault.filtered:
            response = await handler(ctx, request)
            assert isinstance(response, M.MetadataResponse)
            if not any(fault.matches(Key(topic=t.name, partition=fault.partition)) for t in response.topics or ()):
                return response
        with self._lock:
            if fault not in self._armed:  # used up meanwhile by another connection
                fault = None
            else:
                self._use(fault)
        if fault is None:
            return response if response is not None else await handler(ctx, request)
        return await self._act(ctx, request, handler, fault, response)

    async def _act(self, ctx: RequestContext, request: Any, handler: Handler, fault: Fault,
                   response: Any = None) -> Any:
        """Apply `fault` to the request (`response`: a Metadata answer already built)."""
        self._log(ctx, fault)
        code = fault.error

        def error_for(key: Key) -> ErrorCode | None:
            return code if fault.matches(key) else None

        if fault.action == FAIL:
            if ctx.api_key != METADATA:
                return await answer_in_part(ctx, request, handler, error_for, self._resolver(ctx))
            if response is None:
                response = await handler(ctx, request)
            fail_entries_after(response, error_for)
            return response
        if fault.action == DELAY:
            await self._sleep(fault.delay_ms / 1000.0)
            return response if response is not None else await handler(ctx, request)
        if fault.action == DISCONNECT:
            ctx.connection.close()
            return None
        await self._never(ctx)  # DROP
        return None

    @staticmethod
    def _log(ctx: RequestContext, fault: Fault) -> None:
        log.warning("fault injected", client_id=ctx.client_id, correlation_id=ctx.correlation_id, **fault.describe())

    async def _sleep(self, seconds: float) -> None:
        """Sleep, cut short when the broker stops (a delayed request must not hold up shutdown)."""
        waiter = asyncio.get_running_loop().create_future()
        self._sleepers.add(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), seconds)
        except TimeoutError:
            pass
        finally:
            self._sleepers.discard(waiter)

    @staticmethod
    async def _never(ctx: RequestContext) -> None:
        """Until the connection has another request, closes, or the broker stops: the dropped
        request stays unanswered, and nothing behind it waits."""
        waiter = asyncio.get_running_loop().create_future()
        def release() -> None:
            if not waiter.done():
                waiter.set_result(None)

        ctx.release_on_next_request(release)
        await waiter

    # the broker's side ---------------------------------------------------------------------------
    def attach(self, broker: Any) -> None:
        """The broker started (its logs are loaded): disk faults armed before now take effect."""
        with self._lock:
            self._broker = broker
            self._loop = asyncio.get_running_loop()
            for fault in self._armed:
                if fault.action == FAIL_DISK:
                    try:
                        self._install_disk_fault(fault)
                    except ValueError as exc:
                        log.warning("fault not in effect", error=str(exc), **fault.describe())

    def detach(self) -> None:
        """The broker stops: delayed requests go on at once; the faults stay armed for the next start."""
        with self._lock:
            for fault in self._armed:
                if fault.action == FAIL_DISK:
                    self._remove_disk_fault(fault)
            self._broker = None
            self._loop = None
        self.route(None)
        for waiter in list(self._sleepers):
            if not waiter.done():
                waiter.set_result(None)

    def collect(self) -> Iterator[Metric]:
        """kafka_faults_injected{api, action, error} (the broker's metrics registry collects it)."""
        family = counter("kafka_faults_injected", "Faults injected (broker.testing), per API, action and error",
                         labels=["api", "action", "error"])
        with self._lock:
            counts = sorted(self.injected.items())
        for (api, action, error), count in counts:
            family.add_metric([api, action, error], count)
        yield family

    def _log_of(self, fault: Fault) -> Any:
        assert fault.topic is not None and fault.partition is not None
        found = self._broker.logs.get_log(fault.topic, fault.partition)
        if found is None:
            raise ValueError("no log for %s-%d on this broker" % (fault.topic, fault.partition))
        return found

    def _install_disk_fault(self, fault: Fault) -> None:
        target = self._log_of(fault)

        def broken_disk() -> None:
            with self._lock:
                if fault in self._armed:
                    self._use(fault)
                if fault not in self._armed:
                    target.write_fault = None
            log.warning("fault injected", **fault.describe())
            raise OSError(errno.EIO, "injected disk failure (fail_disk) writing %s-%s" % (fault.topic, fault.partition))

        target.write_fault = broken_disk

    def _remove_disk_fault(self, fault: Fault) -> None:
        if self._broker is not None:
            found = self._broker.logs.get_log(fault.topic, fault.partition)
            if found is not None:
                found.write_fault = None

