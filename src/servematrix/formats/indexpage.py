"""An index's page read into memory, never past a bound: a compressed body is inflated as it arrives, at most to
the bound, so a page of 1.5 MB that inflates to 1.5 GB (a gzip bomb) is cut off after MAX_PAGE bytes, not read
whole. The simple API's largest pages (torch's, the nvidia-* wheels') are a few MB."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["MAX_PAGE", "Page", "PageError", "get_page"]

MAX_PAGE = 64 * 2**20


class PageError(Exception):
    """The page is larger than the bound, or comes in an encoding this reader does not inflate. The message
    names no URL (the caller's may carry credentials)."""


@dataclass(frozen=True, kw_only=True)
class Page:
    status_code: int
    headers: httpx.Headers
    content: bytes
    charset: str | None

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode(self.charset or "utf-8", errors="replace")


def _inflater(encoding: str) -> Any:
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj()
    raise PageError(f"the page came back in an encoding this reader does not inflate ({encoding[:40]!r})")


def get_page(client: httpx.Client, url: str, *, headers: dict[str, str], limit: int = MAX_PAGE) -> Page:
    """GET `url` with `client` and read its body, inflated, up to `limit` bytes; PageError past that."""
    asked = {**headers, "Accept-Encoding": "gzip, deflate"}
    with client.stream("GET", url, headers=asked) as response:
        inflater = _inflater(response.headers.get("content-encoding", "").strip().lower())
        body = bytearray()
        for piece in response.iter_raw():
            data = piece
            while data:
                if inflater is None:
                    body += data
                    data = b""
                else:
                    try:
                        body += inflater.decompress(data, limit + 1 - len(body))
                    except zlib.error as exc:
                        raise PageError(f"the page's compressed body is damaged ({exc})") from None
                    data = inflater.unconsumed_tail
                if len(body) > limit:
                    raise PageError(f"the page is larger than {limit:,} bytes once inflated: not read further")
        return Page(
            status_code=response.status_code,
            headers=response.headers,
            content=bytes(body),
            charset=response.charset_encoding,
        )
