"""SASL APIs: SaslHandshake (17), SaslAuthenticate (36), DescribeUserScramCredentials (50),
AlterUserScramCredentials (51).

SaslHandshake and SaslAuthenticate are served by the connection's SASL authenticator on SASL
listeners (broker/security/sasl/authenticator.py); one that reaches the request path (on a
listener without SASL, or after authentication when no re-authentication is due) is answered
ILLEGAL_SASL_STATE, as KafkaApis does.

SCRAM credentials: Describe needs DESCRIBE on the cluster, Alter needs ALTER (each user then gets
CLUSTER_AUTHORIZATION_FAILED). Alter validates as Kafka's ScramControlManager (a user altered once
per request, a known mechanism, 4096..16384 iterations, a non-empty name, a deleted credential
must exist) and stores the salt, iterations, StoredKey and ServerKey derived from the salted
password in the metadata log; the salted password itself is never kept.
"""

from __future__ import annotations

from broker.apis.context import RequestContext
from broker.apis.registry import api
from broker.security.authz import Op, authorize_cluster
from broker.security.sasl.scram import BY_TYPE, MAX_ITERATIONS, credential_from_salted
from protocol import messages as M
from protocol.errors import ErrorCode

E = ErrorCode


@api(17)
async def handle_sasl_handshake(ctx: RequestContext, request: M.SaslHandshakeRequest) -> M.SaslHandshakeResponse:
    return M.SaslHandshakeResponse(error_code=int(E.ILLEGAL_SASL_STATE), mechanisms=[])


@api(36)
async def handle_sasl_authenticate(ctx: RequestContext, request: M.SaslAuthenticateRequest
                                   ) -> M.SaslAuthenticateResponse:
    return M.SaslAuthenticateResponse(error_code=int(E.ILLEGAL_SASL_STATE), auth_bytes=b"",
                                      error_message="SaslAuthenticate request received after successful authentication")


# ----- DescribeUserScramCredentials ------------------------------------------------------------
@api(50)
async def handle_describe_user_scram_credentials(ctx: RequestContext, request: M.DescribeUserScramCredentialsRequest
                                                 ) -> M.DescribeUserScramCredentialsResponse:
    R = M.DescribeUserScramCredentialsResponse
    if not authorize_cluster(ctx, Op.DESCRIBE):
        return R(throttle_time_ms=0, error_code=int(E.CLUSTER_AUTHORIZATION_FAILED), results=[])
    stored = ctx.broker.metadata.image.scram
    if not request.users:
        duplicated = {name: False for name in sorted({name for name, _ in stored})}
    else:
        duplicated = {}
        for u in request.users:
            duplicated[u.name] = u.name in duplicated
    results = []
    for name, duplicate in duplicated.items():
        if duplicate:
            results.append(R.DescribeUserScramCredentialsResult(
                user=name, error_code=int(E.DUPLICATE_RESOURCE), credential_infos=[],
                error_message="Cannot describe SCRAM credentials for the same user twice in a single request: " + name))
            continue
        infos = [R.CredentialInfo(mechanism=mechanism, iterations=stored[(name, mechanism)].iterations)
                 for mechanism in sorted(BY_TYPE) if (name, mechanism) in stored]
        if infos:
            results.append(R.DescribeUserScramCredentialsResult(user=name, error_code=0, credential_infos=infos))
        else:
            results.append(R.DescribeUserScramCredentialsResult(
                user=name, error_code=int(E.RESOURCE_NOT_FOUND), credential_infos=[],
                error_message="Attempt to describe a user credential that does not exist: " + name))
    return R(throttle_time_ms=0, error_code=0, results=results)


# ----- AlterUserScramCredentials ---------------------------------------------------------------
def _name_and_mechanism_error(name: str, mechanism: int) -> tuple[ErrorCode, str] | None:
    if not name:
        return E.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    if mechanism not in BY_TYPE:
        return E.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"
    return None


@api(51)
async def handle_alter_user_scram_credentials(ctx: RequestContext, request: M.AlterUserScramCredentialsRequest
                                              ) -> M.AlterUserScramCredentialsResponse:
    R = M.AlterUserScramCredentialsResponse
    users = [d.name for d in request.deletions] + [u.name for u in request.upsertions]
    if not authorize_cluster(ctx, Op.ALTER):
        return R(throttle_time_ms=0, results=[
            R.AlterUserScramCredentialsResult(user=name, error_code=int(E.CLUSTER_AUTHORIZATION_FAILED))
            for name in dict.fromkeys(users)])
    stored = ctx.broker.metadata.image.scram
    errors: dict[str, tuple[ErrorCode, str]] = {}
    deletions: dict[str, M.AlterUserScramCredentialsRequest.ScramCredentialDeletion] = {}
    upsertions: dict[str, M.AlterUserScramCredentialsRequest.ScramCredentialUpsertion] = {}
    duplicate = (E.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request")
    for d in request.deletions:
        if d.name in errors:
            continue
        if deletions.pop(d.name, None) is not None:
            errors[d.name] = duplicate
            continue
        problem = _name_and_mechanism_error(d.name, d.mechanism)
        if problem is None and (d.name, d.mechanism) not in stored:
            problem = E.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"
        if problem is not None:
            errors[d.name] = problem
        else:
            deletions[d.name] = d
    for u in request.upsertions:
        if u.name in errors:
            continue
        if deletions.pop(u.name, None) is not None or upsertions.pop(u.name, None) is not None:
            errors[u.name] = duplicate
            continue
        problem = _name_and_mechanism_error(u.name, u.mechanism)
        if problem is None and u.iterations < BY_TYPE[u.mechanism].min_iterations:
            problem = E.UNACCEPTABLE_CREDENTIAL, "Too few iterations"
        elif problem is None and u.iterations > MAX_ITERATIONS:
            problem = E.UNACCEPTABLE_CREDENTIAL, "Too many iterations"
        if problem is not None:
            errors[u.name] = problem
        else:
            upsertions[u.name] = u
    records: list[M.RemoveUserScramCredentialRecord | M.UserScramCredentialRecord] = []
    results = []
    for d in deletions.values():
        records.append(M.RemoveUserScramCredentialRecord(name=d.name, mechanism=d.mechanism))
        results.append(R.AlterUserScramCredentialsResult(user=d.name, error_code=0, error_message=None))
    for u in upsertions.values():
        credential = credential_from_salted(BY_TYPE[u.mechanism], bytes(u.salt), bytes(u.salted_password),
                                            u.iterations)
        records.append(M.UserScramCredentialRecord(
            name=u.name, mechanism=u.mechanism, salt=credential.salt, stored_key=credential.stored_key,
            server_key=credential.server_key, iterations=credential.iterations))
        results.append(R.AlterUserScramCredentialsResult(user=u.name, error_code=0, error_message=None))
    for name, (code, message) in errors.items():
        results.append(R.AlterUserScramCredentialsResult(user=name, error_code=int(code), error_message=message))
    ctx.broker.metadata.append_records(records)
    return R(throttle_time_ms=0, results=results)
