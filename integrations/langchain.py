"""LangChain: ``WardenRetriever``, a ``BaseRetriever`` that searches ragwarden as one caller, and
``RagwardenVectorStore``, a ``VectorStore`` that reads and writes as one.

    retriever = WardenRetriever(warehouse=ragwarden.open(), subject="user:alice", tenant="acme", k=4)
    retriever = WardenRetriever(url="https://rag.example", token=user_token)   # over the service
    store = RagwardenVectorStore.from_documents(docs, warehouse=ragwarden.open(), subject="user:alice",
                                                tenant="acme", tags={"allow": ["group:fpa"], "classification": "internal"})

The retriever's ``Document``s carry the chunk's id, labels, classification, lineage and the reason
it was visible in ``metadata``, so a chain can cite it and label what it writes from it. The
store's carry the metadata they were written with and nothing else, as any LangChain store's do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import VectorStore
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr, model_validator

from ..errors import ConfigurationError, InvalidRequestError
from ..ingest.importers import AclFromMetadata
from ..retrieval.collapse import GroupBy
from ..retrieval.search import MAX_K, Mode
from ..warehouse import Warehouse
from .binding import Binding, SearchOptions, bind, hit_metadata, with_options
from .options import DEFAULT_K, check_k, requested_k
from .stores import ERASED_BY_STORE, WriteTags, by_ids, erase, write_texts

__all__ = ["RagwardenVectorStore", "WardenRetriever"]


class WardenRetriever(BaseRetriever):
    """The top ``k`` chunks the bound caller may read, as LangChain ``Document``s.

    Bind it with ``warehouse=`` (in process) or ``url=`` (a ragwarden service), and name the caller
    with ``token=`` (a JWT or API key, verified) or, in process only, ``subject=`` and ``tenant=``.
    ``invoke(query, k=n)`` overrides ``k`` for one call. ``search_kwargs={"filter": {...}}`` (or
    ``filter=``) narrows every search to chunks matching it, as LangChain's vector store
    retrievers do; ``search_kwargs={"k": n}`` sets ``k``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    warehouse: Warehouse | None = None
    url: str | None = None
    token: SecretStr | None = None
    subject: str | None = None
    tenant: str | None = None
    actor: str | None = None
    k: int = Field(DEFAULT_K, ge=1, le=MAX_K)
    mode: Mode = "vector"
    purpose: str | None = None
    group_by: GroupBy | None = None
    per_group: int = 1
    distinct: bool = False
    filter: dict[str, Any] | None = None
    search_kwargs: dict[str, Any] = Field(default_factory=dict)

    _bound: tuple[tuple[Any, ...], Binding] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_binding(self) -> WardenRetriever:
        unknown = sorted(set(self.search_kwargs) - {"filter", "k"})
        if unknown:
            raise InvalidRequestError(f"search_kwargs {unknown} are not understood here; give filter or k")
        if "k" in self.search_kwargs:
            self.k = check_k(self.search_kwargs["k"])
        if self.filter is not None and self.search_kwargs.get("filter") not in (None, self.filter):
            raise InvalidRequestError("filter is given twice (filter= and search_kwargs['filter']) with different values; give one")
        self._binding()  # a contradiction or a refused token fails here, at construction
        return self

    def _binding(self) -> Binding:
        """The binding of the fields as they are now: a copy or an assignment that changes whom or
        how it searches gets a new one (and a token given anew is verified anew)."""
        token = self.token.get_secret_value() if self.token is not None else None
        fields = (id(self.warehouse), self.url, token, self.subject, self.tenant, self.actor, self.mode, self.purpose,
                  self.group_by, self.per_group, self.distinct, repr(self._filter()))  # fmt: skip
        if self._bound is None or self._bound[0] != fields:
            binding = bind(
                warehouse=self.warehouse,
                url=self.url,
                token=token,
                subject=self.subject,
                tenant=self.tenant,
                actor=self.actor,
                options=SearchOptions(mode=self.mode, purpose=self.purpose, group_by=self.group_by,
                                      per_group=self.per_group, distinct=self.distinct, filter=self._filter()),
            )
            self._bound = (fields, binding)
        return self._bound[1]

    def _filter(self) -> dict[str, Any] | None:
        return self.filter if self.filter is not None else self.search_kwargs.get("filter")

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        return [_document(hit) for hit in self._binding().search(query, requested_k(self.k, kwargs))]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        return [_document(hit) for hit in await self._binding().asearch(query, requested_k(self.k, kwargs))]


def _document(hit: dict[str, Any]) -> Document:
    return Document(id=hit["chunk_id"], page_content=hit["text"], metadata=hit_metadata(hit))


class RagwardenVectorStore(VectorStore):
    """A LangChain ``VectorStore`` over ragwarden, acting as one caller: it finds only what that
    caller may read, and writes (and deletes) with the caller's rights (``ingest``, ``forget``).

    Bind it as ``WardenRetriever`` is bound (``warehouse=`` or ``url=``; ``token=``, or in process
    ``subject=`` and ``tenant=``). ``tags`` says who may read what it writes: the same tags for
    every text (``{"allow": [...], "deny": [...], "labels": [...], "classification": ...}``), or
    each text's from its metadata (an ``AclFromMetadata``, or its text ``"allow=owners,..."``);
    without them it refuses to write. Each text is one document whose id is the LangChain id; the
    warehouse embeds it, unless ``embedding`` is given: its vectors are then written, named by
    ``embedding_model`` (or the embedding's ``model_name``), which must be the warehouse's model.
    ``delete`` erases (the receipt is its tombstone), so writing an erased id again needs
    ``restore_erased=True``.
    """

    def __init__(
        self,
        *,
        warehouse: Warehouse | None = None,
        url: str | None = None,
        token: str | None = None,
        subject: str | None = None,
        tenant: str | None = None,
        actor: str | None = None,
        tags: Mapping[str, Any] | AclFromMetadata | str | None = None,
        embedding: Embeddings | None = None,
        embedding_model: str | None = None,
        mode: Mode = "vector",
        purpose: str | None = None,
    ) -> None:
        self._binding = bind(warehouse=warehouse, url=url, token=token, subject=subject, tenant=tenant, actor=actor,
                             options=SearchOptions(mode=mode, purpose=purpose))  # fmt: skip
        self._tags = WriteTags.of(tags)
        self._embedding = embedding
        self._model = embedding_model or getattr(embedding, "model_name", None) or getattr(embedding, "model", None)
        if embedding is not None and not isinstance(self._model, str):
            raise ConfigurationError("name the model that embedding uses (embedding_model=...): the warehouse checks "
                                     "it is its own before it writes the vectors")  # fmt: skip

    @property
    def embeddings(self) -> Embeddings | None:
        return self._embedding

    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        restore_erased: bool = False,
        **kwargs: Any,
    ) -> list[str]:
        """Write each text as a document the caller's ``tags`` govern; their ids."""
        _refuse_unknown(kwargs, "add_texts")
        texts = list(texts)
        vectors = self._embedding.embed_documents(texts) if self._embedding is not None and texts else None
        return write_texts(self._binding, self._tags, texts, metadatas, ids, vectors=vectors, model=self._model,
                           restore_erased=restore_erased)  # fmt: skip

    def delete(self, ids: list[str] | None = None, *, reason: str = ERASED_BY_STORE, **kwargs: Any) -> bool:
        """Erase the documents ``ids`` (with all derived from them); an id that is missing, or that
        the caller may not erase, is passed over."""
        _refuse_unknown(kwargs, "delete")
        if ids is None:
            raise InvalidRequestError("name the ids to delete: a governed store never deletes everything at once")
        erase(self._binding, ids, reason=reason)
        return True

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents ``ids`` the caller may read, in that order (a missing or forbidden id is left out)."""
        return [_stored(hit) for hit in by_ids(self._binding, list(ids))]

    def similarity_search(self, query: str, k: int = DEFAULT_K, **kwargs: Any) -> list[Document]:
        return [document for document, _ in self.similarity_search_with_score(query, k, **kwargs)]

    def similarity_search_with_score(
        self, query: str, k: int = DEFAULT_K, filter: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The caller's top ``k`` for ``query`` (only those matching ``filter``), with their scores
        (cosine similarity in vector mode: higher is nearer)."""
        _refuse_unknown(kwargs, "similarity_search")
        hits = with_options(self._binding, filter=filter).search(query, check_k(k))
        return [(_stored(hit), hit["score"]) for hit in hits]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        if self._binding.options.mode != "vector":
            raise InvalidRequestError(f"relevance scores are cosine similarities, so they need mode 'vector', not "
                                      f"{self._binding.options.mode!r}")  # fmt: skip
        return lambda similarity: (1.0 + similarity) / 2.0

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings | None = None,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> RagwardenVectorStore:
        """A store bound by ``kwargs`` (as the constructor's), with ``texts`` written to it."""
        store = cls(embedding=embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    @classmethod
    def from_documents(cls, documents: list[Document], embedding: Embeddings | None = None,
                       **kwargs: Any) -> RagwardenVectorStore:  # fmt: skip
        return super().from_documents(documents, embedding, **kwargs)  # type: ignore[arg-type]


def _stored(hit: dict[str, Any]) -> Document:
    """A hit as the document that was written: its id, text and metadata, nothing more."""
    return Document(id=hit["doc_id"], page_content=hit["text"], metadata=dict(hit["metadata"]))


def _refuse_unknown(kwargs: Mapping[str, Any], method: str) -> None:
    if kwargs:
        raise InvalidRequestError(f"{method} does not understand {', '.join(sorted(kwargs))}; it is refused, not ignored")
