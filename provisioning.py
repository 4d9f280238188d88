"""SCIM's storage: one tenant's users and groups in the warehouse's ``directory`` table, served
to scim2-server's handler (``api.scim``) through the permission gate.

For one operation, the tenant's resources are held by scim2-server's own in-memory storage (its
filters, sorting, paging and uniqueness), read again only when another writer moved the tenant's
head; what the operation changed is committed on the snapshot it was read from, and the whole
request is planned again when another write to the tenant committed first, on this replica or
another (``state.directory``). Before a commit that may add memberships, the tenant's directory
as it would be is checked against the policy (``Warehouse.check_directory``), so no write can
leave a combination every later request would fail on.

What is stored is what governance can read: a user's ``userName`` is a principal
(``user:NAME``), a group's ``displayName`` too (``group:NAME``), a group's members are users of
its tenant (groups are not nested here), two groups never name one principal, and a password is
never stored.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from scim2_models import (
    InvalidValueException,
    NotFoundException,
    Resource,
    ResourceType,
    ResponseParameters,
    SearchRequest,
    UniquenessException,
)
from scim2_server.memory import InMemoryStorage
from scim2_server.service import ScimService
from scim2_server.storage import ScimStorage, SearchPage

from .errors import PolicyError, RagwardenError
from .governance.caller import Caller
from .governance.provisioned import GROUP, USER
from .governance.tags import group_named, group_problem, principal_problem, user_named
from .state import DirectoryRow, DirectorySnapshot, DirectoryTable, retrying_conflicts
from .warehouse import Warehouse

T = TypeVar("T")
DirectoryCheck = Callable[[str, list[DirectoryRow]], None]
"""``check(tenant, rows)``: raise ``PolicyError`` if ``tenant``'s directory, were it ``rows``,
would not combine with the policy in force (``Warehouse.check_directory``)."""


class _Memory(InMemoryStorage):
    """scim2-server's in-memory storage over one tenant's resources. A version is random, not a
    counter from 1: the storage is rebuilt from the table, and must never give an ETag again."""

    def next_version(self) -> str:
        return f'W/"{uuid.uuid4().hex[:16]}"'


@dataclass
class _Loaded:
    """A tenant's resources as last committed or read by this process, and the head they match."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    head: str | None = None
    memory: _Memory | None = None


class TenantDirectory(ScimStorage):
    """One tenant's users and groups, for scim2-server's handler. Each operation reads the
    tenant's snapshot (the resources this process holds, when the tenant's head has not moved),
    runs in memory, and commits what it changed on that snapshot."""

    supports_cursors = False

    def __init__(
        self, table: DirectoryTable, tenant: str, service: ScimService, loaded: _Loaded, check: DirectoryCheck
    ) -> None:
        self._table = table
        self._tenant = tenant
        self._service = service
        self._loaded = loaded
        self._check = check
        self._memory: _Memory | None = None
        self._changed: dict[tuple[str, str], Resource[Any] | None] = {}
        self._needs_policy_check = False

    @contextmanager
    def operation(self) -> Iterator[None]:
        with self._loaded.lock:  # one operation per tenant at a time in this process
            snapshot = self._table.snapshot(self._tenant)
            if self._loaded.memory is None or self._loaded.head != snapshot.head:
                self._loaded.memory, self._loaded.head = self._read(snapshot), snapshot.head
            self._memory, self._changed, self._needs_policy_check = self._loaded.memory, {}, False
            try:
                yield
                if self._changed:
                    self._loaded.head = self._commit(snapshot)
            except BaseException:
                if self._changed:  # the memory holds what was never committed: read it again next time
                    self._loaded.memory = None
                raise
            finally:
                self._memory = None

    def _read(self, snapshot: DirectorySnapshot) -> _Memory:
        memory = _Memory()
        models = {name: self._service.get_model(self._service.get_resource_type(name)) for name in (USER, GROUP)}
        memory.resources = [models[row.resource_type].model_validate(json.loads(row.body)) for row in snapshot.rows()]
        return memory

    def _commit(self, snapshot: DirectorySnapshot) -> str:
        if self._needs_policy_check:  # memberships may have grown: would the policy still hold?
            rows = [self._row(cast(Any, r.meta).resource_type, r, body=False) for r in self.memory.resources]
            try:
                self._check(self._tenant, rows)
            except PolicyError as exc:
                raise InvalidValueException(detail=f"not provisioned, as the policy could not hold it: {exc}") from None
        writes = [self._row(kind, resource) for (kind, _), resource in self._changed.items() if resource is not None]
        deletes = [key for key, resource in self._changed.items() if resource is None]
        return snapshot.commit(writes, deletes)

    def _row(self, kind: str, resource: Resource[Any], *, body: bool = True) -> DirectoryRow:
        """The stored row of a resource of type ``kind`` (``_checked`` already said it is valid);
        without ``body``, only what governance reads."""
        text = json.dumps(resource.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":")) if body else ""
        row = DirectoryRow(tenant=self._tenant, resource_type=kind, resource_id=cast(str, resource.id), body=text)
        if kind == USER:
            return replace(row, principal=user_named(resource.user_name), active=resource.active is not False)
        return replace(row, principal=group_named(resource.display_name),
                       members=tuple(str(member.value) for member in resource.members or ()))  # fmt: skip

    @property
    def memory(self) -> _Memory:
        if self._memory is None:
            raise RagwardenError("the directory is read inside an operation only: open one with the provisioning gate first")
        return self._memory

    # -- what governance needs of a resource -----------------------------------------------

    def _checked(self, resource_type: ResourceType, resource: Resource[Any]) -> Resource[Any]:
        """``resource`` as it may be stored, or an error naming what is wrong: a user's name must
        make a principal, a group's too, no other resource may name the same principal, and a
        group's members must be users of this tenant."""
        if resource_type.name == USER:
            name = resource.user_name
            problem = principal_problem(user_named(name)) if isinstance(name, str) else "userName is missing"
            if problem:
                raise InvalidValueException(detail=f"userName {name!r} cannot name a ragwarden user: {problem}")
            self._refuse_twin(resource_type, "userName", user_named(name), resource)
            return resource.model_copy(update={"password": None})  # never stored, never returned
        name = resource.display_name
        principal = group_named(name) if isinstance(name, str) else None
        problem = group_problem(principal) if principal else "displayName is missing"
        if problem:
            raise InvalidValueException(detail=f"displayName {name!r} cannot name a ragwarden group: {problem}")
        user_type = self._service.get_resource_type(USER)
        for member in resource.members or ():
            if member.type not in (None, USER):
                raise InvalidValueException(
                    detail=f"member {member.value!r} is a {member.type}: a group's members are users (groups are not nested)"
                )
            try:
                self.memory.get(user_type, str(member.value))
            except NotFoundException:
                raise InvalidValueException(detail=f"member {member.value!r} is not a user of this tenant") from None
        self._refuse_twin(resource_type, "displayName", cast(str, principal), resource)
        return resource

    def _refuse_twin(self, resource_type: ResourceType, attribute: str, principal: str, resource: Resource[Any]) -> None:
        """Refuse (409) ``resource`` when another resource of its type names ``principal``
        (``x`` and ``user:x``, or ``x`` and ``group:x``, name one principal)."""
        kind, _, bare = principal.partition(":")
        wanted = f'{attribute} eq "{scim_string(bare)}" or {attribute} eq "{scim_string(principal)}"'
        for other in self.memory.search([resource_type], SearchRequest(filter=wanted)).resources:
            named = user_named(other.user_name) if kind == "user" else group_named(other.display_name)
            if other.id != resource.id and named == principal:
                raise UniquenessException(detail=f"{principal} is already provisioned (id {other.id})")

    # -- ScimStorage -------------------------------------------------------------------------

    def get(
        self, resource_type: ResourceType, resource_id: str, *, response_parameters: ResponseParameters[Any] | None = None
    ) -> Resource[Any]:
        return self.memory.get(resource_type, resource_id)

    def search(
        self, resource_types: list[ResourceType], search_request: SearchRequest[Any], *, position: Any = None
    ) -> SearchPage:
        return self.memory.search(resource_types, search_request, position=position)

    def create(self, resource_type: ResourceType, resource: Resource[Any]) -> Resource[Any]:
        created = self.memory.create(resource_type, self._checked(resource_type, resource))
        self._changed[(resource_type.name, cast(str, created.id))] = created
        self._needs_policy_check |= resource_type.name == GROUP  # a new user is in no group yet
        return created

    def update(
        self, resource_type: ResourceType, resource: Resource[Any], *, expected_version: str | None = None
    ) -> Resource[Any]:
        checked = self._checked(resource_type, resource)
        updated = self.memory.update(resource_type, checked, expected_version=expected_version)
        self._changed[(resource_type.name, cast(str, updated.id))] = updated
        self._needs_policy_check |= resource_type.name == GROUP or getattr(updated, "active", None) is not False
        return updated

    def delete(self, resource_type: ResourceType, resource_id: str, *, expected_version: str | None = None) -> None:
        """Delete a resource; a deleted user leaves every group it was in, in the same commit (a
        group naming a user that is gone could never be updated again)."""
        self.memory.delete(resource_type, resource_id, expected_version=expected_version)
        self._changed[(resource_type.name, resource_id)] = None
        if resource_type.name != USER:
            return
        group_type = self._service.get_resource_type(GROUP)
        holding = SearchRequest(filter=f'members.value eq "{scim_string(resource_id)}"')
        for group in self.memory.search([group_type], holding).resources:
            kept = [member for member in group.members or () if str(member.value) != resource_id]
            left = self.memory.update(group_type, group.model_copy(update={"members": kept}))
            self._changed[(GROUP, cast(str, left.id))] = left


def scim_string(value: str) -> str:
    """``value`` inside a SCIM filter's quoted string (RFC 7644 §3.4.2.2: JSON string escapes)."""
    return json.dumps(value)[1:-1]


class Provisioner:
    """The warehouse's directory, served to SCIM: ``run`` gives a request's handling one
    tenant's storage, for a caller the policy grants ``provision`` there."""

    def __init__(self, warehouse: Warehouse, service: ScimService) -> None:
        self._warehouse = warehouse
        self._service = service
        self._loaded: dict[str, _Loaded] = {}
        self._lock = threading.Lock()

    def _loaded_for(self, tenant: str) -> _Loaded:
        with self._lock:
            return self._loaded.setdefault(tenant, _Loaded())

    def run(
        self, handle: Callable[[ScimStorage], T], describe: Callable[[T], Mapping[str, Any]], *, caller: Caller, what: str
    ) -> T:
        """``handle(storage)`` in ``caller``'s tenant, recorded; run again from a fresh snapshot
        while its commit loses a race to another write of the tenant."""

        def serve(table: DirectoryTable) -> T:
            storage = TenantDirectory(table, caller.tenant, self._service, self._loaded_for(caller.tenant),
                                      self._warehouse.check_directory)  # fmt: skip
            return retrying_conflicts(lambda: handle(storage), what=what)

        return self._warehouse.provision(serve, describe, caller=caller)
