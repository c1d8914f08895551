"""Client quota APIs: DescribeClientQuotas (48) and AlterClientQuotas (49).

As Kafka: Describe needs DESCRIBE_CONFIGS on the cluster and filters the quota entities of the
metadata image (ClientQuotasImage.describe: exact, default and "specified" matches, strict);
Alter needs ALTER_CONFIGS on the cluster and validates as ClientQuotaControlManager (entity
types user, client-id and ip, not ip with the others, known keys, positive values, whole numbers
for byte rates) before writing ClientQuotaRecords; validate_only writes nothing. The quotas take
effect at once (broker/security/quotas.py).
"""

from __future__ import annotations

import ipaddress

from broker.apis.context import RequestContext
from broker.apis.registry import api
from broker.security.authz import Op, authorize_cluster
from broker.security.quotas import (
    CLIENT_ID,
    CONNECTION_CREATION_RATE,
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    IP,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    USER,
    Entity,
)
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

E = ErrorCode
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2
INT_MAX, LONG_MAX = 2**31 - 1, 2**63 - 1
# key -> largest value of its type (None: a double)
USER_CLIENT_KEYS: dict[str, int | None] = {
    PRODUCER_BYTE_RATE: LONG_MAX, CONSUMER_BYTE_RATE: LONG_MAX, REQUEST_PERCENTAGE: None,
    CONTROLLER_MUTATION_RATE: None,
}
IP_KEYS: dict[str, int | None] = {CONNECTION_CREATION_RATE: INT_MAX}


def _entity_text(entity: dict[str, str | None]) -> str:
    """Java's ClientQuotaEntity.toString."""
    return "ClientQuotaEntity(entries={%s})" % ", ".join("%s=%s" % (k, v) for k, v in entity.items())


# ----- DescribeClientQuotas ----------------------------------------------------------------
def _filter(components: list[M.DescribeClientQuotasRequest.ComponentData]) -> tuple[dict[str, str | None], set[str]]:
    exact: dict[str, str | None] = {}
    specified: set[str] = set()
    for c in components:
        if not c.entity_type:
            raise KafkaError(E.INVALID_REQUEST, "Invalid empty entity type.")
        if c.entity_type in exact or c.entity_type in specified:
            raise KafkaError(E.INVALID_REQUEST, "Entity type %s cannot appear more than once in the filter."
                             % c.entity_type)
        if c.entity_type not in (IP, USER, CLIENT_ID):
            raise KafkaError(E.UNSUPPORTED_VERSION, "Unsupported entity type %s" % c.entity_type)
        if c.match_type == MATCH_EXACT:
            if c.match is None:
                raise KafkaError(E.INVALID_REQUEST, "Request specified MATCH_TYPE_EXACT, but set match string to null.")
            exact[c.entity_type] = c.match
        elif c.match_type == MATCH_DEFAULT:
            if c.match is not None:
                raise KafkaError(E.INVALID_REQUEST, "Request specified MATCH_TYPE_DEFAULT, but also specified a match "
                                 "string.")
            exact[c.entity_type] = None
        elif c.match_type == MATCH_SPECIFIED:
            if c.match is not None:
                raise KafkaError(E.INVALID_REQUEST, "Request specified MATCH_TYPE_SPECIFIED, but also specified a "
                                 "match string.")
            specified.add(c.entity_type)
        else:
            raise KafkaError(E.INVALID_REQUEST, "Unknown match type %d" % c.match_type)
    types = set(exact) | specified
    if IP in types and (USER in types or CLIENT_ID in types):
        raise KafkaError(E.INVALID_REQUEST, "Invalid entity filter component combination. IP filter component should "
                         "not be used with user or clientId filter component.")
    return exact, specified


def _matches(entity: Entity, exact: dict[str, str | None], specified: set[str], strict: bool) -> bool:
    entries = dict(entity)
    if strict and len(entries) != len(exact) + len(specified):
        return False
    return (all(t in entries and entries[t] == name for t, name in exact.items())
            and all(t in entries for t in specified))


@api(48)
async def handle_describe_client_quotas(ctx: RequestContext, request: M.DescribeClientQuotasRequest
                                        ) -> M.DescribeClientQuotasResponse:
    R = M.DescribeClientQuotasResponse
    if not authorize_cluster(ctx, Op.DESCRIBE_CONFIGS):
        return R(throttle_time_ms=0, error_code=int(E.CLUSTER_AUTHORIZATION_FAILED), entries=None)
    try:
        exact, specified = _filter(list(request.components))
    except KafkaError as exc:
        return R(throttle_time_ms=0, error_code=int(exc.code), error_message=exc.message, entries=None)
    entries = [
        R.EntryData(entity=[R.EntityData(entity_type=t, entity_name=n) for t, n in entity],
                    values=[R.ValueData(key=k, value=v) for k, v in sorted(values.items())])
        for entity, values in ctx.broker.metadata.image.client_quotas.items()
        if _matches(entity, exact, specified, request.strict)
    ]
    return R(throttle_time_ms=0, error_code=0, error_message=None, entries=entries)


# ----- AlterClientQuotas -------------------------------------------------------------------
def _keys_of(entity: dict[str, str | None]) -> dict[str, int | None]:
    """The keys an entity may set (ClientQuotaControlManager's checks of the entity)."""
    if not entity:
        raise KafkaError(E.INVALID_REQUEST, "Invalid empty client quota entity")
    for entity_type, name in entity.items():
        if entity_type not in (USER, CLIENT_ID, IP):
            raise KafkaError(E.INVALID_REQUEST, "Unhandled client quota entity type: %s" % entity_type)
        if name is not None and name == "":
            raise KafkaError(E.INVALID_REQUEST, "Empty %s not supported" % entity_type)
    if IP in entity:
        if USER in entity or CLIENT_ID in entity:
            raise KafkaError(E.INVALID_REQUEST, "Invalid quota entity combination, IP entity shouldnot be combined "
                             "with User or ClientId")
        ip = entity[IP]
        if ip is not None:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise KafkaError(E.INVALID_REQUEST, "%s is not a valid IP or resolvable host." % ip) from None
        return IP_KEYS
    return USER_CLIENT_KEYS


def _check_value(keys: dict[str, int | None], key: str, value: float) -> None:
    if key not in keys:
        raise KafkaError(E.INVALID_REQUEST, "Invalid configuration key " + key)
    if value <= 0.0:
        raise KafkaError(E.INVALID_REQUEST, "Quota %s must be greater than 0" % key)
    largest = keys[key]
    if largest is not None:
        if value > largest:
            raise KafkaError(E.INVALID_REQUEST, "Proposed value for %s is too large for %s."
                             % (key, "an INT" if largest == INT_MAX else "a LONG"))
        if abs(value % 1.0) > 1e-6:
            raise KafkaError(E.INVALID_REQUEST, "%s cannot be a fractional value." % key)


def _records(entity: dict[str, str | None], changes: dict[str, float | None],
             current: dict[str, float]) -> list[M.ClientQuotaRecord]:
    keys = _keys_of(entity)
    records = []
    data = [M.ClientQuotaRecord.EntityData(entity_type=t, entity_name=n) for t, n in entity.items()]
    for key, value in changes.items():
        if value is None:
            if key in current:
                records.append(M.ClientQuotaRecord(entity=list(data), key=key, value=0.0, remove=True))
            continue
        _check_value(keys, key, value)
        if current.get(key) != value:
            records.append(M.ClientQuotaRecord(entity=list(data), key=key, value=value, remove=False))
    return records


@api(49)
async def handle_alter_client_quotas(ctx: RequestContext, request: M.AlterClientQuotasRequest
                                     ) -> M.AlterClientQuotasResponse:
    R = M.AlterClientQuotasResponse

    def entity_data(entity: dict[str, str | None]) -> list[M.AlterClientQuotasResponse.EntityData]:
        return [R.EntityData(entity_type=t, entity_name=n) for t, n in entity.items()]

    entities = [{e.entity_type: e.entity_name for e in entry.entity} for entry in request.entries]
    if not authorize_cluster(ctx, Op.ALTER_CONFIGS):
        return R(throttle_time_ms=0, entries=[
            R.EntryData(error_code=int(E.CLUSTER_AUTHORIZATION_FAILED), error_message=None, entity=entity_data(e))
            for e in entities])
    quotas = ctx.broker.metadata.image.client_quotas
    results: dict[Entity, tuple[dict[str, str | None], KafkaError | None]] = {}
    records: list[M.ClientQuotaRecord] = []
    for entity, entry in zip(entities, request.entries):
        key: Entity = tuple(sorted(entity.items(), key=lambda item: item[0]))
        changes: dict[str, float | None] = {}
        error: KafkaError | None = None
        for op in entry.ops:
            if op.key in changes:
                error = KafkaError(E.INVALID_REQUEST, "Duplicate quota key %s not updating quota for this entity %s"
                                   % (op.key, _entity_text(entity)))
            else:
                changes[op.key] = None if op.remove else op.value
        if key in results or error is not None:
            # as Kafka: a second alteration of an entity is refused (the first one stands)
            results[key] = (entity, KafkaError(E.INVALID_REQUEST, "Ignoring duplicate entity " + _entity_text(entity)))
            continue
        try:
            records += _records(entity, changes, quotas.get(key, {}))
            results[key] = (entity, None)
        except KafkaError as exc:
            results[key] = (entity, exc)
    if not request.validate_only:
        ctx.broker.metadata.append_records(records)
        if ctx.broker.quotas is not None:
            ctx.broker.quotas.refresh()  # in force from the next request on
    return R(throttle_time_ms=0, entries=[
        R.EntryData(error_code=int(error.code) if error else 0, error_message=error.message if error else None,
                    entity=entity_data(entity))
        for entity, error in results.values()])
