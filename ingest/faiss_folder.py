"""A folder LangChain's FAISS store saved (``FAISS.save_local``), read without running its pickle.

The folder holds ``index.faiss`` (the vectors, in faiss's own format) and ``index.pkl``: a pickle
of the docstore (its ``Document``s: id, text, metadata) and of the map from a vector's position to
its document. LangChain loads that pickle only when told ``allow_dangerous_deserialization``,
because a pickle can run any code it names. This reader never does: the pickle is read by an
unpickler that knows only the two classes such a pickle holds, each a plain stand-in that keeps
the fields it is given, and refuses any other name, so a crafted file can name nothing that runs.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from ..errors import InvalidValueError
from .importers import Collected

DOCSTORE = ("langchain_community.docstore.in_memory", "InMemoryDocstore")
DOCUMENT = ("langchain_core.documents.base", "Document")


class _Held:
    """A stand-in for a class the pickle names: it keeps the state it is given, and runs nothing."""

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def fields(self) -> dict[str, Any]:
        """Its fields: a pydantic model's ``__dict__`` in its state, or a plain object's state."""
        state = getattr(self, "state", None) or {}
        if isinstance(state, tuple):  # (dict, slots)
            state = state[0] or {}
        inner = state.get("__dict__") if isinstance(state, Mapping) else None
        return dict(inner if isinstance(inner, Mapping) else state if isinstance(state, Mapping) else {})


class _Docstore(_Held):
    pass


class _Document(_Held):
    pass


class _Unpickler(pickle.Unpickler):
    """Finds the docstore and document classes as stand-ins, and refuses every other name."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == DOCSTORE:
            return _Docstore
        if (module, name) == DOCUMENT:
            return _Document
        raise InvalidValueError(f"the pickle names {module}.{name}, which a folder LangChain's FAISS saved does not "
                                "hold; it is refused, not loaded (only its docstore and documents are read)")  # fmt: skip


def faiss_langchain_rows(folder: str, *, index_name: str = "index") -> tuple[int, Iterator[Collected]]:
    """The rows of the LangChain FAISS folder ``folder`` (files ``index_name``.faiss and .pkl):
    their count, and each row with its document's id, text and metadata and its vector."""
    base = Path(folder)
    index_path, pickle_path = base / f"{index_name}.faiss", base / f"{index_name}.pkl"
    for path in (index_path, pickle_path):
        if not path.is_file():
            raise InvalidValueError(f"{folder} holds no {path.name}: is it a folder FAISS.save_local wrote "
                                    "(name another index with --index-name)?")  # fmt: skip
    index = faiss.read_index(str(index_path))
    try:
        docstore, positions = _Unpickler(io.BytesIO(pickle_path.read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise InvalidValueError(f"{pickle_path} is not a LangChain FAISS docstore: {exc}") from None
    documents = docstore.fields().get("_dict") if isinstance(docstore, _Docstore) else None
    if not isinstance(documents, Mapping) or not isinstance(positions, Mapping):
        raise InvalidValueError(f"{pickle_path} does not hold (docstore, positions) as LangChain's FAISS saves them")
    if len(positions) != index.ntotal:
        raise InvalidValueError(f"{index_path} holds {index.ntotal} vectors but {pickle_path} maps {len(positions)}")

    def rows() -> Iterator[Collected]:
        vectors = _vectors(index, index_path)
        for position in range(index.ntotal):
            doc_id = positions.get(position)
            document = documents.get(doc_id)
            if not isinstance(document, _Document):
                raise InvalidValueError(f"{pickle_path}: vector {position} maps to {doc_id!r}, which its docstore does not hold")
            fields = document.fields()
            yield Collected(id=str(fields.get("id") or doc_id), text=fields.get("page_content"), vector=vectors[position],
                            metadata=dict(fields.get("metadata") or {}))  # fmt: skip

    return index.ntotal, rows()


def _vectors(index: Any, path: Path) -> np.ndarray:
    """Every vector the index holds, in position order (an IVF index is given a direct map first)."""
    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:
        ivf = None
    if ivf is not None:
        ivf.make_direct_map()
    try:
        return index.reconstruct_n(0, index.ntotal)
    except RuntimeError as exc:
        raise InvalidValueError(f"{path}: a {type(index).__name__} cannot give back its vectors ({exc}); "
                                "export the collection another way") from None
