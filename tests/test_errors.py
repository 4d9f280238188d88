"""Each error carries the HTTP status and code a service answers it with, and a client turns an
answer back into the same class."""

from __future__ import annotations

import pytest

from ragwarden import errors

ANSWERS = [
    (errors.AuthenticationError, 401, "unauthenticated"),
    (errors.PermissionDeniedError, 403, "forbidden"),
    (errors.NotFoundError, 404, "not_found"),
    (errors.PayloadTooLargeError, 413, "payload_too_large"),
    (errors.InvalidRequestError, 422, "invalid_request"),
    (errors.InvalidValueError, 422, "invalid_request"),
    (errors.InvalidSourceError, 422, "invalid_source"),
    (errors.PolicyError, 503, "policy_unavailable"),
    (errors.InvalidPolicyError, 503, "policy_unavailable"),
    (errors.OverloadedError, 503, "overloaded"),
    (errors.DeadlineExceededError, 503, "deadline_exceeded"),
    (errors.WarehouseError, 503, "warehouse_unavailable"),
    (errors.StorageUnreachableError, 503, "storage_unreachable"),
    (errors.WarehouseFormatError, 503, "warehouse_format"),
    (errors.ConfigurationError, 500, "misconfigured"),
    (errors.RagwardenError, 500, "internal"),
]


def test_every_error_class_is_covered():
    classes = {getattr(errors, name) for name in errors.__all__ if name.endswith("Error")}
    assert classes == {cls for cls, _, _ in ANSWERS}


@pytest.mark.parametrize(("cls", "status", "code"), ANSWERS, ids=[cls.__name__ for cls, _, _ in ANSWERS])
def test_each_error_carries_its_status_and_code(cls, status, code):
    assert (cls.status, cls.code) == (status, code)


def test_an_instance_answers_as_its_class():
    refused = errors.InvalidSourceError("a.jsonl:3", "no text")
    assert (refused.status, refused.code) == (422, "invalid_source")
    assert errors.InvalidPolicyError("policy.csv", 4, "bad rule").code == "policy_unavailable"


@pytest.mark.parametrize(
    ("code", "cls"),
    [(code, cls) for cls, _, code in ANSWERS
     if cls not in (errors.InvalidSourceError, errors.InvalidPolicyError, errors.InvalidValueError)],
)
def test_error_of_gives_back_the_class_of_its_code(code, cls):
    error = errors.error_of(code, "what went wrong")
    assert type(error) is cls and str(error) == "what went wrong"


def test_error_of_a_refused_source_is_an_invalid_request_and_of_an_unknown_code_a_plain_error():
    assert type(errors.error_of("invalid_source", "x.jsonl: no text")) is errors.InvalidRequestError
    assert type(errors.error_of("policy_unavailable", "reload")) is errors.PolicyError  # never the subclass, which wants a path
    assert type(errors.error_of("invalid_request", "no acl")) is errors.InvalidRequestError  # the code's own class


def test_a_malformed_value_is_both_an_invalid_request_and_a_value_error():
    error = errors.InvalidValueError("unknown classification 'top'")
    assert isinstance(error, errors.InvalidRequestError) and isinstance(error, ValueError)
    assert type(errors.error_of("no_such_code", "?")) is errors.RagwardenError


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (401, errors.AuthenticationError),
        (403, errors.PermissionDeniedError),
        (404, errors.NotFoundError),
        (413, errors.PayloadTooLargeError),
        (422, errors.InvalidRequestError),
        (400, errors.WarehouseError),
        (429, errors.WarehouseError),
        (500, errors.WarehouseError),
        (502, errors.WarehouseError),
        (503, errors.WarehouseError),
    ],
)
def test_error_of_status_maps_a_client_error_status_and_reads_anything_else_as_unavailable(status, cls):
    error = errors.error_of_status(status, "from a proxy")
    assert type(error) is cls and str(error) == "from a proxy"
