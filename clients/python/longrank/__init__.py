"""A client of the longrank server's HTTP API: `/search`, `/rerank`, `/documents` and `/pipelines`.

PyTerrier transformers over it are in `longrank.pyterrier` (install the `pyterrier` extra).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import requests

__all__ = ["Client", "LongrankError"]


class LongrankError(Exception):
    """An error answer of the server: its HTTP status, stable code (README's table) and message."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


class Client:
    """The server at `url`; `key` is sent as `Authorization: Bearer KEY` when the server has keys."""

    def __init__(self, url: str = "http://127.0.0.1:8080", key: str | None = None, timeout: float = 600.0):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        if key:
            self.session.headers["Authorization"] = f"Bearer {key}"

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._answer(self.session.post(self.url + path, json=body, timeout=self.timeout))

    @staticmethod
    def _answer(reply: requests.Response) -> Any:
        if reply.status_code >= 400:
            try:
                error = reply.json()["error"]
            except (ValueError, KeyError, TypeError):
                error = {"code": "unknown", "message": reply.text}
            raise LongrankError(reply.status_code, error["code"], error["message"])
        return reply.json()

    def search(self, query: str, **params: Any) -> dict[str, Any]:
        """`POST /search`: `params` are the ranking parameters (pipeline, collection, k, depth, bm25, rm3, ...)."""
        return self._post("/search", {"query": query, **_present(params)})

    def rerank(
        self,
        query: str,
        *,
        docids: list[str] | None = None,
        documents: list[dict[str, str]] | None = None,
        **params: Any,
    ) -> dict[str, Any]:
        """`POST /rerank`: stored documents by docid, or `documents` as `{"id", "text", "title"}` objects."""
        body = {"query": query, "docids": docids, "documents": documents, **params}
        return self._post("/rerank", _present(body))

    def document(self, docid: str, collection: str | None = None) -> dict[str, Any]:
        """`GET /documents/{docid}`: the stored document's title and text."""
        params = _present({"collection": collection})
        reply = self.session.get(f"{self.url}/documents/{quote(docid, safe='')}", params=params, timeout=self.timeout)
        return self._answer(reply)

    def pipelines(self) -> Any:
        """`GET /pipelines`: the pipelines and models, and whether each is available."""
        return self._answer(self.session.get(self.url + "/pipelines", timeout=self.timeout))


def _present(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters that are set: the server's defaults fill the rest."""
    return {name: value for name, value in params.items() if value is not None}
