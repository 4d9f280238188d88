"""A stand-in S3-compatible object store on 127.0.0.1, kept for the one thing moto's S3 server
(``support.moto_s3``, the object store of every other test) cannot do: ignore the conditions of a
conditional put, as an object store without conditional writes does.

It speaks the part of the S3 REST API that LanceDB's object store uses, path-style
(``http://127.0.0.1:PORT/bucket/key``): put (with ``If-None-Match: *`` and ``If-Match``, the
conditional put Lance commits with), get (ranges), head, delete, batch delete, copy, list (v2,
with delimiter and continuation), and multipart uploads. Signatures are not checked; buckets
exist once created with ``create_bucket``. Objects live in memory and go with the server.

``conditional_put=False`` makes it ignore the conditions, as an object store without conditional
writes does: the tests show what then happens to concurrent commits.
"""

from __future__ import annotations

import hashlib
import io
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from support.loopback_http import LoopbackHTTPServer

PAGE = 1000


@dataclass(frozen=True)
class StoredObject:
    body: bytes
    etag: str
    modified: datetime


def _dechunked(readline: Callable[[], bytes], read: Callable[[int], bytes]) -> bytes:
    """The payload of a chunked body (HTTP's, or the SDK's ``aws-chunked``): ``size[;ext]`` lines,
    each followed by that many bytes, up to a zero size and trailer lines ended by a blank one."""
    parts = []
    while size := int(readline().split(b";")[0].strip() or b"0", 16):
        parts.append(read(size))
        readline()
    while readline().strip():
        pass
    return b"".join(parts)


def _stored(body: bytes) -> StoredObject:
    return StoredObject(body, f'"{hashlib.md5(body).hexdigest()}"', datetime.now(UTC))  # noqa: S324 - an ETag, not security


def _local_name(tag: str) -> str:
    return tag.rpartition("}")[2]


class S3Server:
    def __init__(self, *, conditional_put: bool = True) -> None:
        self.conditional_put = conditional_put
        self.buckets: dict[str, dict[str, StoredObject]] = {}
        self.uploads: dict[str, tuple[str, str, dict[int, bytes]]] = {}
        self.requests = 0
        self.lock = threading.Lock()
        self._http = LoopbackHTTPServer(self._handler())

    @property
    def endpoint(self) -> str:
        return self._http.url

    def create_bucket(self, name: str) -> None:
        with self.lock:
            self.buckets.setdefault(name, {})

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        with self.lock:
            return sorted(k for k in self.buckets[bucket] if k.startswith(prefix))

    def stop(self) -> None:
        self._http.stop()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        store = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in separate writes: without TCP_NODELAY each answer on a
            # kept-alive connection waits out the client's delayed ACK (about 40 ms).
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            # -- plumbing ---------------------------------------------------------------------

            def _target(self) -> tuple[str, str, dict[str, str]]:
                parts = urlsplit(self.path)
                bucket, _, key = parts.path.lstrip("/").partition("/")
                query = {name: values[0] for name, values in parse_qs(parts.query, keep_blank_values=True).items()}
                return unquote(bucket), unquote(key), query

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                    body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                else:
                    body = _dechunked(self.rfile.readline, self.rfile.read)
                if "aws-chunked" in self.headers.get("Content-Encoding", ""):  # the SDK's streaming upload
                    stream = io.BytesIO(body)
                    body = _dechunked(stream.readline, stream.read)
                return body

            def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _xml(self, xml: str, status: int = 200) -> None:
                self._send(status, xml.encode(), {"Content-Type": "application/xml"})

            def _error(self, status: int, code: str) -> None:
                self._xml(f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{code}</Message></Error>", status)

            def _objects(self, bucket: str) -> dict[str, StoredObject] | None:
                """The bucket's objects, counting the request (call with the lock held); None,
                answered 404, for a bucket that does not exist."""
                store.requests += 1
                objects = store.buckets.get(bucket)
                if objects is None:
                    self._error(404, "NoSuchBucket")
                return objects

            def _precondition_fails(self, current: StoredObject | None) -> bool:
                if not store.conditional_put:
                    return False
                if self.headers.get("If-None-Match") == "*" and current is not None:
                    return True
                wanted = self.headers.get("If-Match")
                return wanted is not None and (current is None or current.etag != wanted)

            def _serve(self, handle: Callable[[dict[str, StoredObject], str, str, dict[str, str], bytes], None]) -> None:
                """Run ``handle(objects, bucket, key, query, body)`` with the store locked, once the
                bucket is known to exist."""
                bucket, key, query = self._target()
                body = self._body() if self.command in ("PUT", "POST") else b""
                with store.lock:
                    objects = self._objects(bucket)
                    if objects is not None:
                        handle(objects, bucket, key, query, body)

            # -- verbs ------------------------------------------------------------------------

            def do_HEAD(self) -> None:
                self._serve(self._get)

            def do_GET(self) -> None:
                self._serve(self._get)

            def do_PUT(self) -> None:
                self._serve(self._put)

            def do_POST(self) -> None:
                self._serve(self._post)

            def do_DELETE(self) -> None:
                self._serve(self._delete)

            def _get(self, objects: dict[str, StoredObject], bucket: str, key: str, query: dict[str, str], _body: bytes) -> None:
                if not key:
                    return self._list(objects, query)
                found = objects.get(key)
                if found is None:
                    return self._error(404, "NoSuchKey")
                headers = {"ETag": found.etag, "Last-Modified": formatdate(found.modified.timestamp(), usegmt=True),
                           "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}  # fmt: skip
                wanted = self.headers.get("Range")
                if not wanted:
                    return self._send(200, found.body, headers)
                first, _, last = wanted.removeprefix("bytes=").partition("-")
                size = len(found.body)
                if not first:  # a suffix: the last N bytes
                    start, end = max(0, size - int(last)), size - 1
                else:
                    start, end = int(first), min(int(last), size - 1) if last else size - 1
                if start >= size and size:
                    return self._error(416, "InvalidRange")
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
                self._send(206, found.body[start : end + 1], headers)

            def _list(self, objects: dict[str, StoredObject], query: dict[str, str]) -> None:
                prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
                after = query.get("continuation-token") or query.get("start-after") or ""
                keys, prefixes, truncated, last = [], set(), False, ""
                for key in sorted(k for k in objects if k.startswith(prefix) and k > after):
                    rest = key[len(prefix):]
                    if delimiter and delimiter in rest:
                        common = prefix + rest.split(delimiter, 1)[0] + delimiter
                        if common in prefixes:
                            continue
                        if len(keys) + len(prefixes) >= PAGE:
                            truncated = True
                            break
                        prefixes.add(common)
                        last = common + "\uffff"
                        continue
                    if len(keys) + len(prefixes) >= PAGE:
                        truncated = True
                        break
                    keys.append(key)
                    last = key
                contents = "".join(
                    f"<Contents><Key>{escape(k)}</Key><LastModified>{objects[k].modified.strftime('%Y-%m-%dT%H:%M:%S.000Z')}"
                    f"</LastModified><ETag>{escape(objects[k].etag)}</ETag><Size>{len(objects[k].body)}</Size>"
                    "<StorageClass>STANDARD</StorageClass></Contents>"
                    for k in keys
                )
                common = "".join(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in sorted(prefixes))
                token = f"<NextContinuationToken>{escape(last)}</NextContinuationToken>" if truncated else ""
                xml = ("<?xml version='1.0' encoding='UTF-8'?><ListBucketResult><Prefix>" + escape(prefix) + "</Prefix>"
                       f"<KeyCount>{len(keys) + len(prefixes)}</KeyCount><MaxKeys>{PAGE}</MaxKeys>"
                       f"<IsTruncated>{str(truncated).lower()}</IsTruncated>{token}{contents}{common}</ListBucketResult>")  # fmt: skip
                self._xml(xml)

            def _put(self, objects: dict[str, StoredObject], bucket: str, key: str, query: dict[str, str], body: bytes) -> None:
                if "uploadId" in query:
                    upload = store.uploads.get(query["uploadId"])
                    if upload is None:
                        return self._error(404, "NoSuchUpload")
                    upload[2][int(query["partNumber"])] = body
                    return self._send(200, b"", {"ETag": _stored(body).etag})
                source = self.headers.get("x-amz-copy-source")
                if source is not None:
                    from_bucket, _, from_key = unquote(source).lstrip("/").partition("/")
                    copied = store.buckets.get(from_bucket, {}).get(from_key)
                    if copied is None:
                        return self._error(404, "NoSuchKey")
                    body = copied.body
                if self._precondition_fails(objects.get(key)):
                    return self._error(412, "PreconditionFailed")
                objects[key] = stored = _stored(body)
                if source is not None:
                    xml = f"<CopyObjectResult><ETag>{escape(stored.etag)}</ETag></CopyObjectResult>"
                    return self._xml(xml)
                self._send(200, b"", {"ETag": stored.etag})

            def _post(self, objects: dict[str, StoredObject], bucket: str, key: str, query: dict[str, str], body: bytes) -> None:
                if "delete" in query:
                    return self._delete_many(objects, body)
                if "uploads" in query:
                    upload_id = uuid.uuid4().hex
                    store.uploads[upload_id] = (bucket, key, {})
                    xml = (f"<InitiateMultipartUploadResult><Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key>"
                           f"<UploadId>{upload_id}</UploadId></InitiateMultipartUploadResult>")  # fmt: skip
                    return self._xml(xml)
                if "uploadId" in query:
                    upload = store.uploads.pop(query["uploadId"], None)
                    if upload is None:
                        return self._error(404, "NoSuchUpload")
                    numbers = [int(e.text or 0) for e in ElementTree.fromstring(body).iter() if _local_name(e.tag) == "PartNumber"]
                    if self._precondition_fails(objects.get(key)):
                        return self._error(412, "PreconditionFailed")
                    objects[key] = stored = _stored(b"".join(upload[2][n] for n in numbers))
                    xml = (f"<CompleteMultipartUploadResult><Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key>"
                           f"<ETag>{escape(stored.etag)}</ETag></CompleteMultipartUploadResult>")  # fmt: skip
                    return self._xml(xml)
                self._error(400, "InvalidRequest")

            def _delete_many(self, objects: dict[str, StoredObject], body: bytes) -> None:
                keys = [e.text or "" for e in ElementTree.fromstring(body).iter() if _local_name(e.tag) == "Key"]
                for key in keys:
                    objects.pop(key, None)
                deleted = "".join(f"<Deleted><Key>{escape(k)}</Key></Deleted>" for k in keys)
                self._xml(f"<DeleteResult>{deleted}</DeleteResult>")

            def _delete(self, objects: dict[str, StoredObject], bucket: str, key: str, query: dict[str, str], _body: bytes) -> None:
                if "uploadId" in query:
                    store.uploads.pop(query["uploadId"], None)
                else:
                    objects.pop(key, None)
                self._send(204)

        return Handler
