"""``/api/v1/incidents``: the records, read off the loop; each route needs the token
(a record holds the engine's stacks, command lines and output)."""

from __future__ import annotations

from aiohttp import web

from kcops.agent.atomicfile import Writer
from kcops.agent.incidents.book import ID, Book, UnknownIncident
from kcops.agent.jsonapi import json_dumps
from kcops.auth import TokenCheck


def build_routes(book: Book, writer: Writer, auth: TokenCheck) -> list[web.RouteDef]:
    def id_of(request: web.Request) -> str:
        id_ = request.match_info["id"]
        if not ID.match(id_):
            raise web.HTTPBadRequest(
                text=json_dumps(
                    {
                        "error": f"not an incident id: {id_[:40]!r} "
                        "(YYYYMMDDTHHMMSSZ-xxxx, see GET /api/v1/incidents)"
                    }
                ),
                content_type="application/json",
            )
        return id_

    def unknown(id_: str) -> web.Response:
        return web.json_response(
            {
                "error": f"no incident {id_} (dropped past the caps, or never recorded)",
                "known": book.ids()[:20],
            },
            status=404,
        )

    async def listing(_: web.Request) -> web.Response:
        found = await writer.run(book.manifests)
        return web.json_response({"incidents": found}, dumps=json_dumps)

    async def one(request: web.Request) -> web.Response:
        """The record as JSON, or (``/export``) its folder as a tar.gz."""
        id_, archive = id_of(request), request.path.endswith("/export")
        try:
            got = await writer.run(lambda: book.export(id_) if archive else book.read(id_))
        except UnknownIncident:
            return unknown(id_)
        if not isinstance(got, bytes):
            return web.json_response(got, dumps=json_dumps)
        disposition = f'attachment; filename="kcops-incident-{id_}.tar.gz"'
        return web.Response(body=got, content_type="application/gzip",
                            headers={"Content-Disposition": disposition})  # fmt: skip

    return [
        web.get("/api/v1/incidents", auth.require(listing)),
        web.get("/api/v1/incidents/{id}", auth.require(one)),
        web.get("/api/v1/incidents/{id}/export", auth.require(one)),
    ]
