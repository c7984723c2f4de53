"""HTTP transport: keep-alive connections, JSON bodies, typed errors, retries.

Standard library only (:mod:`http.client`). One connection per thread is
kept alive for short requests; streams and downloads get their own.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import math
import random
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Iterator, Mapping

from .errors import ProtocolError, RollboxError, TransportError, error_for_status

__all__ = ["RetryPolicy", "Transport", "Retry"]

# Statuses retried with back-off: the service did nothing and said to try
# again (429: full, nothing was queued; 503: shutting down, recovering, a
# sandbox or storage unavailable).
RETRY_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class RetryPolicy:
    """How the client retries.

    Attributes:
        max_retries: retries of one request after the first attempt (0: never).
        max_wait: the most seconds one request may spend waiting between
            attempts in total; past it the last error is raised.
        backoff: the first wait (seconds) when the service gave no
            ``Retry-After``; it doubles each retry, with jitter, up to
            ``max_backoff``.
        max_backoff: the longest single wait without a ``Retry-After``.
        statuses: HTTP statuses retried (default 429 and 503). A
            ``Retry-After`` header, when present, is the wait.
    """

    max_retries: int = 8
    max_wait: float = 600.0
    backoff: float = 0.5
    max_backoff: float = 30.0
    statuses: frozenset[int] = RETRY_STATUSES


@dataclass(frozen=True)
class Retry:
    """One retry the client made (``Client.retries`` keeps the last 1000)."""

    method: str
    path: str
    status: int | None
    code: str | None
    wait: float
    at: float = field(default_factory=time.time)


class _Response:
    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise ProtocolError(f"the answer is not JSON: {self.body[:200]!r}", status=self.status) from e


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        # "nan" is no number of seconds: back off as without the header.
        return None if math.isnan(seconds) else max(0.0, seconds)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_from(status: int, headers: Mapping[str, str] | http.client.HTTPMessage, body: bytes, method: str, url: str) -> RollboxError:
    """The typed error for an error answer."""
    code = message = fld = None
    parsed: Any = None
    try:
        parsed = json.loads(body)
        err = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(err, dict):
            code, message, fld = err.get("code"), err.get("message"), err.get("field") or None
    except ValueError:
        pass
    if message is None:
        text = body.decode("utf-8", "replace").strip()
        message = text[:500] or http.client.responses.get(status, "error")
    cls = error_for_status(status)
    return cls(message, status=status, code=code, field=fld, retry_after=parse_retry_after(headers.get("Retry-After")),
               method=method, url=url, body=parsed)


class Transport:
    """Sends requests to one service."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        timeout: float | None,
        retry: RetryPolicy,
        user_agent: str,
        on_retry: Callable[[Retry], None] | None = None,
    ) -> None:
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base_url {base_url!r}: want http://HOST:PORT or https://HOST[:PORT]")
        self.base_url = base_url.rstrip("/")
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port
        self.prefix = u.path.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retry = retry
        self.user_agent = user_agent
        self.on_retry = on_retry
        self._local = threading.local()
        self._conns: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    # connections

    def _new_conn(self, timeout: float | None) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _pooled(self) -> tuple[http.client.HTTPConnection, bool]:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        conn = self._new_conn(self.timeout)
        self._local.conn = conn
        with self._lock:
            self._conns.append(conn)
        return conn, False

    def _drop_pooled(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            with self._lock:
                if conn in self._conns:
                    self._conns.remove(conn)

    def close(self) -> None:
        """Closes every kept-alive connection."""
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            c.close()

    # requests

    def url(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        target = self.prefix + path
        if query:
            q = {k: v for k, v in query.items() if v is not None}
            if q:
                target += "?" + urllib.parse.urlencode(q)
        return target

    def headers(self, body: bytes | None, accept: str = "application/json") -> dict[str, str]:
        h = {"Accept": accept, "User-Agent": self.user_agent}
        if body is not None:
            h["Content-Type"] = "application/json"
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        return h

    def _once(self, method: str, target: str, body: bytes | None) -> _Response:
        """One attempt on the pooled connection; a kept-alive connection the
        server closed meanwhile is replaced once (nothing was processed)."""
        for fresh_try in (False, True):
            conn, reused = self._pooled()
            try:
                conn.request(method, target, body=body, headers=self.headers(body))
                resp = conn.getresponse()
                data = resp.read()
                if resp.will_close:
                    self._drop_pooled()
                return _Response(resp.status, resp.headers, data)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self._drop_pooled()
                if reused and not fresh_try:
                    continue
                raise e
            except BaseException:
                self._drop_pooled()
                raise
        raise AssertionError("unreachable")

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        json_body: Any = None,
        retry: bool = True,
    ) -> _Response:
        """Sends a request and returns a 2xx answer; raises the typed error otherwise.

        429 and 503 are retried (honouring Retry-After) within the retry policy;
        so is a connection that could not be made, and, for GET and DELETE, one
        that broke.
        """
        target = self.url(path, query)
        body = None if json_body is None else json.dumps(json_body, ensure_ascii=False).encode("utf-8")
        return self._with_retries(method, path, target, retry, lambda: self._once(method, target, body))

    def _with_retries(self, method: str, path: str, target: str, retry: bool, attempt: Callable[[], _Response]) -> _Response:
        policy = self.retry
        waited = 0.0
        tries = 0
        while True:
            err: RollboxError
            try:
                resp = attempt()
            except (ConnectionRefusedError, socket.gaierror) as e:
                err = TransportError(f"cannot connect to {self.base_url}: {e}", method=method, url=target)
            except (OSError, http.client.HTTPException) as e:
                err = TransportError(f"the connection to {self.base_url} failed: {e!r}", method=method, url=target)
                if method not in ("GET", "DELETE", "HEAD"):
                    # The service may have acted on it: never repeat a POST blindly.
                    raise err from e
            else:
                if resp.status < 400:
                    return resp
                err = error_from(resp.status, resp.headers, resp.body, method, target)
                if resp.status not in policy.statuses:
                    raise err
            if not retry or tries >= policy.max_retries:
                raise err
            wait = err.retry_after
            if wait is None:
                wait = min(policy.max_backoff, policy.backoff * (2 ** tries)) * (0.5 + random.random() / 2)
            if waited + wait > policy.max_wait:
                raise err
            tries += 1
            waited += wait
            if self.on_retry is not None:
                self.on_retry(Retry(method=method, path=path, status=err.status, code=err.code, wait=wait))
            time.sleep(wait)

    def json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        """Sends a request and returns its JSON object answer."""
        resp = self.request(method, path, **kw)
        v = resp.json()
        if not isinstance(v, dict):
            raise ProtocolError(f"{method} {path}: the answer is not a JSON object: {resp.body[:200]!r}", status=resp.status)
        return v

    # streams and downloads

    def open_stream(self, path: str, query: Mapping[str, Any] | None, timeout: float | None, accept: str) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Opens a GET whose body is read incrementally, on its own connection.

        The caller reads the response and closes the connection. Error answers
        are raised (429 and 503 retried as for :meth:`request`).
        """
        target = self.url(path, query)
        opened: list[tuple[http.client.HTTPConnection, http.client.HTTPResponse]] = []

        def attempt() -> _Response:
            conn = self._new_conn(timeout)
            try:
                conn.request("GET", target, headers=self.headers(None, accept))
                resp = conn.getresponse()
            except BaseException:
                conn.close()
                raise
            if resp.status >= 400:
                data = resp.read()
                conn.close()
                return _Response(resp.status, resp.headers, data)
            opened.append((conn, resp))
            return _Response(resp.status, resp.headers, b"")

        self._with_retries("GET", path, target, True, attempt)
        return opened[-1]

    def download(self, path: str, query: Mapping[str, Any] | None, out: BinaryIO, timeout: float | None) -> int:
        """Copies a GET's body into out; returns the bytes written."""
        conn, resp = self.open_stream(path, query, timeout, "*/*")
        n = 0
        try:
            while True:
                chunk = resp.read(1 << 16)
                if not chunk:
                    break
                out.write(chunk)
                n += len(chunk)
        except (OSError, http.client.HTTPException) as e:
            raise TransportError(f"the download of {path} broke after {n} bytes: {e!r}", method="GET", url=self.url(path, query)) from e
        finally:
            conn.close()
        return n

    def lines(self, path: str, query: Mapping[str, Any] | None, timeout: float | None) -> Iterator[bytes]:
        """Yields the lines of a GET's NDJSON body (without their newline).

        A line cut short by a broken connection is not yielded: the
        connection error is raised instead.
        """
        conn, resp = self.open_stream(path, query, timeout, "application/x-ndjson")
        try:
            while True:
                try:
                    line = resp.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise TransportError(f"the stream {path} broke: {e!r}", method="GET", url=self.url(path, query)) from e
                if not line:
                    return
                if not line.endswith(b"\n"):
                    raise TransportError(f"the stream {path} ended in the middle of a line", method="GET", url=self.url(path, query))
                line = line.rstrip(b"\r\n")
                if line:
                    yield line
        finally:
            conn.close()
