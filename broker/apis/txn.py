"""Transaction APIs: InitProducerId (22), AddPartitionsToTxn (24), AddOffsetsToTxn (25), EndTxn (26),
WriteTxnMarkers (27), TxnOffsetCommit (28), DescribeTransactions (65), ListTransactions (66), and
the verification of transactional produce.

The handlers adapt each version to the transaction coordinator (`broker.txn_coordinator`), as
Kafka's KafkaApis does: PRODUCER_FENCED is INVALID_PRODUCER_EPOCH for clients older than the
version that knows it, AddPartitionsToTxn v0-3 is a client's single transaction and v4+ a
broker's batch (with VerifyOnly), EndTxn v5 is a transactions-v2 client.
"""

from __future__ import annotations

import asyncio

from broker.apis.context import BrokerServices, RequestContext, TxnVerifier
from broker.apis.group import coordinator_of as group_coordinator_of
from broker.apis.registry import api
from broker.coordinator.group.coordinator import GROUP_METADATA_TOPIC as OFFSETS_TOPIC
from broker.coordinator.group.coordinator import txn_offset_commit_error
from broker.coordinator.txn import TransactionCoordinator
from broker.coordinator.txn.markers import MARKER_TIMEOUT_S
from broker.coordinator.txn.state import TV_0, TV_2, TopicPartition
from broker.metadata import INTERNAL_TOPICS
from broker.partition import Partition, VerificationState
from broker.security.authz import (
    Op,
    Res,
    authorize,
    authorize_by_resource_type,
    authorize_cluster,
    filter_authorized,
)
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from protocol.records import BatchHeader

E = ErrorCode
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# A transactions-v2 produce retries its implicit AddPartitions while the previous transaction
# completes (Kafka's add.partitions.to.txn.retry.backoff.ms and its bound).
_ADD_RETRY_BACKOFF_S = 0.02
_ADD_RETRY_MAX_S = 0.1


def coordinator_of(ctx: RequestContext) -> TransactionCoordinator:
    """This broker's transaction coordinator."""
    coordinator = ctx.broker.txn_coordinator
    if coordinator is None:
        raise KafkaError(E.COORDINATOR_NOT_AVAILABLE)
    return coordinator


def verifier_of(ctx: RequestContext, transactional_id: str) -> TxnVerifier:
    """The coordinator of `transactional_id` as a partition leader verifying a transactional
    produce or a group's transactional offset commit asks it: this broker's, or another node's
    (AddPartitionsToTxn to it, in a cluster)."""
    coordinator = ctx.broker.txn_coordinator_for(transactional_id)
    if coordinator is None:
        raise KafkaError(E.COORDINATOR_NOT_AVAILABLE)
    return coordinator


def _fenced(code: ErrorCode, version: int, knows_fenced_from: int) -> ErrorCode:
    """Clients before PRODUCER_FENCED was added to an API get INVALID_PRODUCER_EPOCH instead."""
    return E.INVALID_PRODUCER_EPOCH if code is E.PRODUCER_FENCED and version < knows_fenced_from else code


# ----- InitProducerId ----------------------------------------------------------------------
@api(22)
async def handle_init_producer_id(ctx: RequestContext, request: M.InitProducerIdRequest) -> M.InitProducerIdResponse:
    R = M.InitProducerIdResponse
    version = ctx.api_version
    # as KafkaApis, before anything else: WRITE on the transactional id; an idempotent producer
    # needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic
    if request.transactional_id is not None:
        if not authorize(ctx, Op.WRITE, Res.TRANSACTIONAL_ID, request.transactional_id):
            return R(error_code=E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, producer_id=-1, producer_epoch=-1)
    elif not authorize_cluster(ctx, Op.IDEMPOTENT_WRITE, log_if_denied=False) and \
            not authorize_by_resource_type(ctx, Op.WRITE, Res.TOPIC):
        return R(error_code=E.CLUSTER_AUTHORIZATION_FAILED, producer_id=-1, producer_epoch=-1)
    producer_id = request.producer_id if version >= 3 else NO_PRODUCER_ID
    epoch = request.producer_epoch if version >= 3 else NO_PRODUCER_EPOCH
    if (producer_id == NO_PRODUCER_ID) != (epoch == NO_PRODUCER_EPOCH):
        return R(error_code=E.INVALID_REQUEST, producer_id=-1, producer_epoch=-1)
    if request.transactional_id is None:
        # an idempotent producer: always a new producer id, epoch 0
        return R(error_code=E.NONE, producer_id=ctx.broker.metadata.allocate_producer_id(), producer_epoch=0)
    try:
        coordinator = coordinator_of(ctx)
    except KafkaError as exc:
        return R(error_code=exc.code, producer_id=-1, producer_epoch=-1)
    expected = None if producer_id == NO_PRODUCER_ID else (producer_id, epoch)
    result = await coordinator.init_producer_id(request.transactional_id, request.transaction_timeout_ms, expected)
    return R(error_code=_fenced(result.error, version, 4), producer_id=result.producer_id,
             producer_epoch=result.producer_epoch)


# ----- AddPartitionsToTxn ------------------------------------------------------------------
def _topic_results(errors: dict[TopicPartition, ErrorCode]) -> list[M.AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult]:
    R = M.AddPartitionsToTxnResponse
    by_topic: dict[str, list[M.AddPartitionsToTxnResponse.AddPartitionsToTxnPartitionResult]] = {}
    for (topic, partition), code in errors.items():
        by_topic.setdefault(topic, []).append(
            R.AddPartitionsToTxnPartitionResult(partition_index=partition, partition_error_code=code))
    return [R.AddPartitionsToTxnTopicResult(name=t, results_by_partition=ps) for t, ps in by_topic.items()]


async def _add_partitions(ctx: RequestContext, transaction: M.AddPartitionsToTxnRequest.AddPartitionsToTxnTransaction,
                         version: int) -> dict[TopicPartition, ErrorCode]:
    partitions = [(t.name, p) for t in transaction.topics for p in t.partitions]
    metadata = ctx.broker.metadata
    tid = transaction.transactional_id
    if version < 4:
        # a client's request: WRITE on the transactional id, then on each topic (internal topics
        # are never writable this way)
        if not authorize(ctx, Op.WRITE, Res.TRANSACTIONAL_ID, tid):
            return {tp: E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED for tp in partitions}
        writable = filter_authorized(ctx, Op.WRITE, Res.TOPIC, [t for t, _ in partitions if t not in INTERNAL_TOPICS])
    else:
        writable = {t for t, _ in partitions}
    denied = {tp for tp in partitions if tp[0] not in writable}
    unknown = {tp for tp in partitions if tp not in denied and (
        (info := metadata.topic(tp[0])) is None or not 0 <= tp[1] < info.partitions)}
    if unknown or denied:
        # the whole transaction fails: the failed partitions say why, the others were not attempted
        return {tp: E.TOPIC_AUTHORIZATION_FAILED if tp in denied else E.UNKNOWN_TOPIC_OR_PARTITION if tp in unknown
                else E.OPERATION_NOT_ATTEMPTED for tp in partitions}
    try:
        coordinator = coordinator_of(ctx)
    except KafkaError as exc:
        return {tp: exc.code for tp in partitions}
    if version >= 4 and transaction.verify_only:
        return dict(await coordinator.verify_partitions(tid, transaction.producer_id, transaction.producer_epoch,
                                                        partitions))
    # v4+ without VerifyOnly comes from a broker adding the partitions of a transactions-v2 produce
    tv = TV_2 if version >= 4 else TV_0
    code = await coordinator.add_partitions(tid, transaction.producer_id, transaction.producer_epoch, partitions, tv)
    code = _fenced(code, version, 2)
    return {tp: code for tp in partitions}


@api(24)
async def handle_add_partitions_to_txn(ctx: RequestContext, request: M.AddPartitionsToTxnRequest
                                       ) -> M.AddPartitionsToTxnResponse:
    R = M.AddPartitionsToTxnResponse
    version = ctx.api_version
    if version < 4:
        transaction = M.AddPartitionsToTxnRequest.AddPartitionsToTxnTransaction(
            transactional_id=request.v3_and_below_transactional_id, producer_id=request.v3_and_below_producer_id,
            producer_epoch=request.v3_and_below_producer_epoch, verify_only=False,
            topics=request.v3_and_below_topics)
        errors = await _add_partitions(ctx, transaction, version)
        return R(results_by_topic_v3_and_below=_topic_results(errors))
    if not authorize_cluster(ctx, Op.CLUSTER_ACTION):  # v4+ comes from brokers
        return R(error_code=E.CLUSTER_AUTHORIZATION_FAILED, results_by_transaction=[])
    results = await asyncio.gather(*(_add_partitions(ctx, t, version) for t in request.transactions))
    return R(error_code=E.NONE, results_by_transaction=[
        R.AddPartitionsToTxnResult(transactional_id=t.transactional_id, topic_results=_topic_results(errors))
        for t, errors in zip(request.transactions, results)])


# ----- AddOffsetsToTxn ---------------------------------------------------------------------
@api(25)
async def handle_add_offsets_to_txn(ctx: RequestContext, request: M.AddOffsetsToTxnRequest) -> M.AddOffsetsToTxnResponse:
    """The group's __consumer_offsets partition joins the transaction (TxnOffsetCommit follows)."""
    R = M.AddOffsetsToTxnResponse
    if not authorize(ctx, Op.WRITE, Res.TRANSACTIONAL_ID, request.transactional_id):
        return R(error_code=E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not authorize(ctx, Op.READ, Res.GROUP, request.group_id):
        return R(error_code=E.GROUP_AUTHORIZATION_FAILED)
    try:
        coordinator = coordinator_of(ctx)
        offsets_partition = (OFFSETS_TOPIC, group_coordinator_of(ctx).partition_for(request.group_id))
    except KafkaError as exc:
        return R(error_code=exc.code)
    code = await coordinator.add_partitions(request.transactional_id, request.producer_id, request.producer_epoch,
                                            [offsets_partition], TV_0)
    return R(error_code=_fenced(code, ctx.api_version, 2))


# ----- TxnOffsetCommit ---------------------------------------------------------------------
def _offsets_error(code: ErrorCode, version: int) -> ErrorCode:
    """How a TxnOffsetCommit reports what the transaction coordinator said of the group's partition."""
    if code is E.PRODUCER_FENCED:
        return E.INVALID_PRODUCER_EPOCH
    if code is E.TRANSACTION_ABORTABLE and version <= 3:
        return E.INVALID_TXN_STATE  # clients before KIP-890 do not know TRANSACTION_ABORTABLE
    if code in _RETRIABLE or code is E.CONCURRENT_TRANSACTIONS:
        return E.COORDINATOR_LOAD_IN_PROGRESS  # clients retry it without looking the coordinator up again
    return code


@api(28)
async def handle_txn_offset_commit(ctx: RequestContext, request: M.TxnOffsetCommitRequest) -> M.TxnOffsetCommitResponse:
    R = M.TxnOffsetCommitResponse
    version = ctx.api_version
    metadata = ctx.broker.metadata
    # WRITE on the transactional id, READ on the group, then READ on each topic
    if not authorize(ctx, Op.WRITE, Res.TRANSACTIONAL_ID, request.transactional_id):
        return txn_offset_commit_error(request, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not authorize(ctx, Op.READ, Res.GROUP, request.group_id):
        return txn_offset_commit_error(request, E.GROUP_AUTHORIZATION_FAILED)
    readable = filter_authorized(ctx, Op.READ, Res.TOPIC, [t.name for t in request.topics])
    answered: list[M.TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic] = []  # unauthorized and unknown topics and partitions, answered here
    valid = []
    for topic in request.topics:
        if topic.name not in readable:
            answered.append(R.TxnOffsetCommitResponseTopic(name=topic.name, partitions=[
                R.TxnOffsetCommitResponsePartition(partition_index=p.partition_index,
                                                   error_code=E.TOPIC_AUTHORIZATION_FAILED) for p in topic.partitions]))
            continue
        info = metadata.topic(topic.name)
        count = info.partitions if info is not None else 0
        known = [p for p in topic.partitions if 0 <= p.partition_index < count]
        unknown = [p for p in topic.partitions if not 0 <= p.partition_index < count]
        if unknown:
            answered.append(R.TxnOffsetCommitResponseTopic(name=topic.name, partitions=[
                R.TxnOffsetCommitResponsePartition(partition_index=p.partition_index,
                                                   error_code=E.UNKNOWN_TOPIC_OR_PARTITION) for p in unknown]))
        if known:
            valid.append(M.TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(name=topic.name, partitions=known))
    if valid:
        request.topics = valid
        response = await _commit_transactional_offsets(ctx, request, version)
        answered = list(response.topics) + answered
    if version < 2:  # clients before 2.0 do not retry COORDINATOR_LOAD_IN_PROGRESS here
        for t in answered:
            for p in t.partitions:
                if p.error_code == E.COORDINATOR_LOAD_IN_PROGRESS:
                    p.error_code = E.COORDINATOR_NOT_AVAILABLE
    return R(topics=answered)


async def _commit_transactional_offsets(ctx: RequestContext, request: M.TxnOffsetCommitRequest, version: int
                                        ) -> M.TxnOffsetCommitResponse:
    try:
        if not request.group_id:
            raise KafkaError(E.INVALID_GROUP_ID)
        # the transaction's coordinator, which may be another node than the group's (a cluster)
        coordinator = verifier_of(ctx, request.transactional_id)
        groups = group_coordinator_of(ctx)
        markers_seen = await groups.markers_seen(request.group_id, request.producer_id)
    except KafkaError as exc:
        return txn_offset_commit_error(request, exc.code)
    tp = (OFFSETS_TOPIC, groups.partition_for(request.group_id))
    tid, pid, epoch = request.transactional_id, request.producer_id, request.producer_epoch
    if version >= 5:  # transactions v2: the group's partition joins the transaction here
        code = await coordinator.add_partitions(tid, pid, epoch, [tp], TV_2)
    else:
        code = (await coordinator.verify_partitions(tid, pid, epoch, [tp]))[tp]
    if code is not E.NONE:
        return txn_offset_commit_error(request, _offsets_error(code, version))
    return await groups.commit_transactional_offsets(request, markers_seen)


# ----- EndTxn ------------------------------------------------------------------------------
@api(26)
async def handle_end_txn(ctx: RequestContext, request: M.EndTxnRequest) -> M.EndTxnResponse:
    R = M.EndTxnResponse
    version = ctx.api_version
    if not authorize(ctx, Op.WRITE, Res.TRANSACTIONAL_ID, request.transactional_id):
        return R(error_code=E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, producer_id=-1, producer_epoch=-1)
    try:
        coordinator = coordinator_of(ctx)
    except KafkaError as exc:
        return R(error_code=exc.code)
    tv = TV_2 if version >= 5 else TV_0  # EndTxn v5 is sent only by transactions-v2 clients
    result = await coordinator.end_txn(request.transactional_id, request.producer_id, request.producer_epoch,
                                       request.committed, tv)
    return R(error_code=_fenced(result.error, version, 2), producer_id=result.producer_id,
             producer_epoch=result.producer_epoch)


# ----- WriteTxnMarkers ---------------------------------------------------------------------
@api(27)
async def handle_write_txn_markers(ctx: RequestContext, request: M.WriteTxnMarkersRequest) -> M.WriteTxnMarkersResponse:
    """A transaction coordinator's markers for this broker's partitions (inter-broker; our own
    coordinator writes its markers directly, broker/coordinator/txn/markers.py)."""
    R = M.WriteTxnMarkersResponse
    broker = ctx.broker
    # brokers only: ALTER or CLUSTER_ACTION on the cluster, else every partition is refused
    allowed = authorize_cluster(ctx, Op.ALTER, log_if_denied=False) or authorize_cluster(ctx, Op.CLUSTER_ACTION)
    results = []
    for marker in request.markers:
        tv = marker.transaction_version if ctx.api_version >= 2 else TV_0
        topics = []
        for topic in marker.topics:
            partitions = []
            for index in topic.partition_indexes:
                code = await _write_marker(broker, marker, topic.name, index, tv) if allowed else \
                    E.CLUSTER_AUTHORIZATION_FAILED
                partitions.append(R.WritableTxnMarkerPartitionResult(partition_index=index, error_code=code))
            topics.append(R.WritableTxnMarkerTopicResult(name=topic.name, partitions=partitions))
        results.append(R.WritableTxnMarkerResult(producer_id=marker.producer_id, topics=topics))
    return R(markers=results)


async def _write_marker(broker: BrokerServices, marker: M.WriteTxnMarkersRequest.WritableTxnMarker, topic: str,
                        index: int, tv: int) -> ErrorCode:
    try:
        if topic == OFFSETS_TOPIC and broker.group_coordinator is not None:
            if not 0 <= index < broker.group_coordinator.runtime.num_partitions:
                return E.UNKNOWN_TOPIC_OR_PARTITION
            await broker.group_coordinator.complete_transaction(
                index, marker.producer_id, marker.producer_epoch, marker.transaction_result, marker.coordinator_epoch)
            return E.NONE
        partition = broker.partitions.get(topic, index)
        if partition is None:
            return E.UNKNOWN_TOPIC_OR_PARTITION
        partition.check_enough_replicas(-1)  # markers are written as acks=all, as Kafka does
        result = await partition.write_marker(marker.producer_id, marker.producer_epoch, marker.transaction_result,
                                              marker.coordinator_epoch, tv)
        await partition.replicated(result.first_offset + 1, MARKER_TIMEOUT_S)
        return E.NONE
    except KafkaError as exc:
        return exc.code
    except OSError:
        return E.KAFKA_STORAGE_ERROR


# ----- DescribeTransactions / ListTransactions -------------------------------------------
@api(65)
async def handle_describe_transactions(ctx: RequestContext, request: M.DescribeTransactionsRequest
                                       ) -> M.DescribeTransactionsResponse:
    R = M.DescribeTransactionsResponse
    try:
        coordinator = coordinator_of(ctx)
    except KafkaError as exc:
        return R(transaction_states=[R.TransactionState(error_code=exc.code, transactional_id=t)
                                     for t in request.transactional_ids])

    async def one(tid: str) -> M.DescribeTransactionsResponse.TransactionState:
        if not authorize(ctx, Op.DESCRIBE, Res.TRANSACTIONAL_ID, tid):
            return R.TransactionState(error_code=E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, transactional_id=tid)
        code, meta = await coordinator.describe(tid)
        if meta is None:
            return R.TransactionState(error_code=code, transactional_id=tid)
        # only the partitions of topics the principal may describe
        partitions = {t: ps for t, ps in meta.describe_partitions().items()
                      if authorize(ctx, Op.DESCRIBE, Res.TOPIC, t)}
        return R.TransactionState(
            error_code=E.NONE, transactional_id=tid, transaction_state=meta.state.kafka_name,
            transaction_timeout_ms=meta.txn_timeout_ms, transaction_start_time_ms=meta.txn_start_timestamp,
            producer_id=meta.producer_id, producer_epoch=meta.producer_epoch,
            topics=[R.TopicData(topic=t, partitions=ps) for t, ps in partitions.items()])

    return R(transaction_states=list(await asyncio.gather(*(one(t) for t in request.transactional_ids))))


@api(66)
async def handle_list_transactions(ctx: RequestContext, request: M.ListTransactionsRequest) -> M.ListTransactionsResponse:
    R = M.ListTransactionsResponse
    version = ctx.api_version
    try:
        coordinator = coordinator_of(ctx)
    except KafkaError as exc:
        return R(error_code=exc.code)
    code, txns, unknown = await coordinator.list_transactions(
        list(request.state_filters), list(request.producer_id_filters),
        request.duration_filter if version >= 1 else -1,
        request.transactional_id_pattern if version >= 2 else None)
    return R(error_code=code, unknown_state_filters=unknown, transaction_states=[
        R.TransactionState(transactional_id=m.transactional_id, producer_id=m.producer_id,
                           transaction_state=m.state.kafka_name) for m in txns
        if authorize(ctx, Op.DESCRIBE, Res.TRANSACTIONAL_ID, m.transactional_id, log_if_denied=False)])


# ----- verification of transactional produce (KIP-890) -------------------------------------
# How a produce reports what the coordinator said about a partition not yet in the transaction.
_RETRIABLE = frozenset([E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR,
                        E.NETWORK_EXCEPTION])


def _produce_error(code: ErrorCode, produce_version: int) -> KafkaError:
    if code is E.PRODUCER_FENCED:
        code = E.INVALID_PRODUCER_EPOCH
    elif code is E.TRANSACTION_ABORTABLE and produce_version <= 10:
        code = E.INVALID_TXN_STATE  # clients before KIP-890 do not know TRANSACTION_ABORTABLE
    if code is E.INVALID_TXN_STATE:
        return KafkaError(code, "Partition was not added to the transaction")
    if code in _RETRIABLE or (code is E.CONCURRENT_TRANSACTIONS and produce_version < 12):
        # NOT_ENOUGH_REPLICAS makes older clients retry the produce without a metadata refresh
        return KafkaError(E.NOT_ENOUGH_REPLICAS, "Unable to verify the partition has been added to the "
                          "transaction. Underlying error: %s" % code.name)
    return KafkaError(code)


async def verify_transactional_produce(ctx: RequestContext, partition: Partition, header: BatchHeader,
                                       transactional_id: str | None) -> VerificationState | None:
    """Before a transactional batch opens a transaction in `partition`: make sure the partition is
    in the transaction (produce v3-11: ask the coordinator) or add it (v12+, transactions v2).
    Returns the verification guard to append with; raises KafkaError with the produce's error."""
    if not partition.needs_verification(header):
        return None
    version = ctx.api_version
    guard = partition.start_verification(header.producer_id, header.base_sequence, supports_epoch_bump=version >= 12)
    tp = (partition.topic, partition.index)
    try:
        coordinator = verifier_of(ctx, transactional_id or "")
    except KafkaError as exc:
        raise _produce_error(exc.code, version) from None
    if version >= 12:
        deadline = asyncio.get_running_loop().time() + _ADD_RETRY_MAX_S
        while True:
            code = await coordinator.add_partitions(transactional_id or "", header.producer_id, header.producer_epoch,
                                                    [tp], TV_2)
            if code is not E.CONCURRENT_TRANSACTIONS or asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(_ADD_RETRY_BACKOFF_S)
    else:
        errors = await coordinator.verify_partitions(transactional_id or "", header.producer_id,
                                                     header.producer_epoch, [tp])
        code = errors[tp]
    if code is not E.NONE:
        raise _produce_error(code, version)
    return guard
