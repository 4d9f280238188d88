"""SCIM 2.0 provisioning (RFC 7643/7644) at ``/scim/v2/``: the identity provider's users and groups.

The protocol (validation, filters, sorting, paging, PATCH, ETags, discovery) is scim2-server's;
ragwarden supplies its door here and its storage in ``provisioning``. The door: every request
but the service provider configuration needs a credential whose subject the policy grants
``provision`` in its tenant, goes through the warehouse's permission gate (a receipt each,
allowed or refused), and sees only that tenant's directory. Errors answer in SCIM's shape.

What provisioning means for access (``governance.provisioned``): a user's ``userName`` is its
subject (``user:NAME``, as a token's ``sub``), a group's ``displayName`` its group principal
(``group:NAME``), a group's members are users of the tenant (groups are not nested here), and a
user made inactive is refused everything in the tenant. Passwords are never stored.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from fastapi import FastAPI, Request, Response
from scim2_models import (
    Error,
    ForbiddenException,
    NotFoundException,
    PatchOp,
    Resource,
    ResourceType,
    SCIMException,
    ScimProvider,
    ServiceProviderConfig,
    UnauthorizedException,
)
from scim2_server.applications.base import BaseApplication
from scim2_server.handler import ScimHandler
from scim2_server.requests import ScimRequest
from scim2_server.responses import ScimResponse
from scim2_server.service import ScimService
from scim2_server.storage import ScimStorage, SearchPage
from scim2_server.utils import load_default_resource_types, load_default_schemas
from starlette.concurrency import run_in_threadpool

from ..credentials import Authenticator
from ..errors import AuthenticationError, PermissionDeniedError, RagwardenError
from ..provisioning import Provisioner, scim_string
from ..warehouse import Warehouse

SCIM_PATH = "/scim/v2"
MAX_RESULTS = 1000

SERVICE_PROVIDER_CONFIG = {
    "schemas": ["urn:ietf:params:scim:schemas:core:2.0:ServiceProviderConfig"],
    "patch": {"supported": True},
    # Each operation of a bulk request would be its own commit; identity providers send none.
    "bulk": {"supported": False, "maxOperations": 0, "maxPayloadSize": 0},
    "filter": {"supported": True, "maxResults": MAX_RESULTS},
    "changePassword": {"supported": False},  # ragwarden holds no passwords
    "sort": {"supported": True},
    "etag": {"supported": True},
    "authenticationSchemes": [
        {"type": "oauthbearertoken", "name": "Bearer token",
         "description": "A JWT from the identity provider, or a ragwarden API key (rwk_...), whose subject the "
                        "policy grants provision in its tenant.", "primary": True}
    ],
}  # fmt: skip


@cache
def scim_provider() -> ScimProvider:
    """The service ragwarden describes: RFC 7643's User (with the enterprise extension) and
    Group, and what this storage supports. Built once per process (its models take 0.05 to 0.2 s
    to make) and shared by every app: a provider is immutable, and what it is entered into per
    request is context-local."""
    return ScimProvider.from_discovery(
        load_default_schemas().values(),
        load_default_resource_types().values(),
        config=ServiceProviderConfig.model_validate(SERVICE_PROVIDER_CONFIG),
    )


class _Service(ScimService):
    """scim2-server's service, reading Microsoft Entra's removal of group members too: Entra sends
    ``{"op": "Remove", "path": "members", "value": [{"value": ID}]}``, where RFC 7644 §3.5.2.2 has
    a filter in the path; each listed member becomes the filtered removal the RFC defines."""

    def read_patch(self, resource_type: ResourceType, body: bytes, content_type: str | None) -> PatchOp[Any]:
        return super().read_patch(resource_type, _rfc_member_removals(body), content_type)


def _rfc_member_removals(body: bytes) -> bytes:
    """``body`` with each Entra-style removal of listed members spelt as RFC 7644 removals (a body
    that is not such a PATCH, or not JSON, is returned as it is, for the service to judge)."""
    try:
        patch = json.loads(body)
        operations = patch["Operations"]
    except (ValueError, TypeError, KeyError):
        return body
    if not isinstance(operations, list):
        return body
    spelt: list[Any] = []
    for operation in operations:
        values = operation.get("value") if isinstance(operation, dict) else None
        listed = (
            isinstance(values, list) and values and all(isinstance(v, dict) and isinstance(v.get("value"), str) for v in values)
        )
        if listed and str(operation.get("op", "")).lower() == "remove" and str(operation.get("path", "")).lower() == "members":
            spelt.extend({"op": "remove", "path": f'members[value eq "{scim_string(v["value"])}"]'} for v in values)
        else:
            spelt.append(operation)
    return json.dumps({**patch, "Operations": spelt}).encode("utf-8")


class ScimEndpoint(BaseApplication):
    """The SCIM service of one warehouse: ``serve`` answers one request (blocking: run it off the
    event loop), in the caller's tenant, through the permission gate."""

    def __init__(self, warehouse: Warehouse, authenticator: Authenticator) -> None:
        provider = scim_provider()
        super().__init__(provider, _Service(provider))
        self._authenticator = authenticator
        self._provisioner = Provisioner(warehouse, self.service)

    def serve(self, request: ScimRequest) -> ScimResponse:
        try:
            if self.needs_auth(request):
                identity = self._authenticator.from_header(request.header("Authorization"))
                response = self._provisioner.run(lambda storage: self._handle(request, storage), _described(request),
                                                 caller=identity, what=f"SCIM {request.method} {request.path}")  # fmt: skip
            else:  # the service provider configuration: public (RFC 7643 §5), no storage
                response = ScimHandler(self.service, _NoStorage()).handle(request)
        except AuthenticationError as exc:
            response = self.service.error_response(UnauthorizedException(detail=str(exc)))
        except PermissionDeniedError as exc:
            response = self.service.error_response(ForbiddenException(detail=str(exc)))
        except RagwardenError as exc:
            response = self.service.error_response(SCIMException.from_error(Error(status=exc.status, detail=str(exc))))
        except Exception as exc:  # noqa: BLE001 -- answered as SCIM's error, logged with its traceback
            response = self.handle_exception(request, exc)
        return self.finalize_response(request, response)

    def _handle(self, request: ScimRequest, storage: ScimStorage) -> ScimResponse:
        try:
            return ScimHandler(self.service, storage).handle(request)
        except SCIMException as exc:  # the client's error, answered; a lost commit race goes up, to be tried again
            return self.service.error_response(exc)


def _described(request: ScimRequest) -> Any:
    """What a receipt says of a SCIM request: its method, path and answer (ids, never names)."""

    def describe(response: ScimResponse) -> dict[str, Any]:
        status = int(response.status)
        return {"reason": f"SCIM {request.method.upper()} {request.path}: {status}",
                "details": {"method": request.method.upper(), "path": request.path, "status": status}}  # fmt: skip

    return describe


class _NoStorage(ScimStorage):
    """The storage of the requests that need none (discovery)."""

    def get(self, *args: Any, **kwargs: Any) -> Resource[Any]:
        raise NotFoundException

    def search(self, *args: Any, **kwargs: Any) -> SearchPage:
        raise NotFoundException

    def create(self, *args: Any, **kwargs: Any) -> Resource[Any]:
        raise NotFoundException

    def update(self, *args: Any, **kwargs: Any) -> Resource[Any]:
        raise NotFoundException

    def delete(self, *args: Any, **kwargs: Any) -> None:
        raise NotFoundException


def mount_scim(app: FastAPI, warehouse: Warehouse, authenticator: Authenticator) -> None:
    """Serve SCIM at ``/scim/v2`` on ``app``."""
    endpoint = ScimEndpoint(warehouse, authenticator)

    @app.api_route(SCIM_PATH + "{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
    async def scim(request: Request, path: str) -> Response:
        base = str(request.base_url).rstrip("/") + SCIM_PATH
        scim_request = ScimRequest(method=request.method, base_url=base, path=endpoint.split_path(path or "/"),
                                   query=dict(request.query_params), headers=list(request.headers.items()),
                                   body=await request.body())  # fmt: skip
        answered = await run_in_threadpool(endpoint.serve, scim_request)
        content = b"" if answered.body is None else json.dumps(answered.body).encode("utf-8")
        return Response(content=content, status_code=int(answered.status), headers=answered.headers)
