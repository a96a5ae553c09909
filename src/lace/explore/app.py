"""The explorer's web app: `create_app(session)` gives a FastAPI app over an in-memory `ExploreSession`.

Safety, by construction:
- the only files served are the page's own assets, read once from the package at start, by name
  from a fixed list; dataset images are rendered from the dataset by integer id;
- every body is a pydantic model with bounds; bad input of any kind answers a JSON
  `{"error": message}` (400 for a value the data rules out, 413 for a body over the limit, 422 for
  malformed JSON or a field out of bounds), never a stack trace;
- request bodies over `max_body_bytes` are refused before they are read whole.
"""

from __future__ import annotations

import io
import logging
from functools import lru_cache
from importlib import resources

from fastapi import FastAPI, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from lace.edits.records import EDIT_KINDS
from lace.errors import LaceInputError
from lace.explore.atoms import atom_payload
from lace.explore.editing import edit_payload
from lace.explore.geometry import compare_payload, map_payload, neighbour_csv, point_payload
from lace.explore.inspection import inspect_payload, resolve_query
from lace.explore.schemas import MAX_CAPTION_CHARS, EditBody, QueryBody
from lace.explore.state import ExploreSession

MAX_BODY_BYTES = 16 * 1024
SEARCH_LIMIT = 200
ASSETS = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}

log = logging.getLogger("lace.explore")


def read_assets() -> dict[str, bytes]:
    """The page's files, read from the package (no CDN, nothing from the client)."""
    folder = resources.files("lace.explore") / "static"
    return {name: (folder / name).read_bytes() for name in ASSETS}


class BodyLimit:
    """ASGI middleware refusing request bodies over `limit` bytes with 413, by header or as they stream."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            response = JSONResponse({"error": f"request body over {self.limit} bytes"}, status_code=413)
            return await response(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise HTTPException(413, f"request body over {self.limit} bytes")
            return message

        return await self.app(scope, limited_receive, send)


def _validation_message(error: RequestValidationError) -> str:
    """One line per problem: 'malformed JSON ...' or 'field <name>: <what pydantic says>'."""
    lines = []
    for problem in error.errors():
        if problem.get("type") == "json_invalid":
            lines.append(f"malformed JSON body: {problem.get('ctx', {}).get('error', 'cannot parse')}")
            continue
        loc = list(problem.get("loc", ()))
        where = ".".join(str(part) for part in (loc[1:] if loc and loc[0] in ("body", "query", "path") else loc))
        lines.append(f"field '{where or 'body'}': {problem.get('msg', 'invalid')}")
    return "; ".join(lines) or "invalid request"


# long: one app factory with its routes side by side, each a few lines over the session
def create_app(session: ExploreSession, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The explorer over `session`; see the module docstring for what it refuses and how."""
    app = FastAPI(title="lace explore", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    assets = read_assets()

    @app.exception_handler(LaceInputError)
    async def bad_input(_, error: LaceInputError):
        return JSONResponse({"error": str(error)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def invalid(_, error: RequestValidationError):
        return JSONResponse({"error": _validation_message(error)}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(_, error: HTTPException):
        return JSONResponse({"error": str(error.detail)}, status_code=error.status_code)

    @app.exception_handler(Exception)
    async def unexpected(_, error: Exception):
        log.exception("explore: unexpected error")
        return JSONResponse({"error": f"internal error ({type(error).__name__}); see the server log"},
                            status_code=500)

    @app.get("/")
    def page():
        return Response(assets["index.html"], media_type=ASSETS["index.html"])

    @app.get("/static/{name}")
    def asset(name: str):
        if name not in assets:
            raise HTTPException(404, f"no asset '{name}'")
        return Response(assets[name], media_type=ASSETS[name])

    @lru_cache(maxsize=2048)
    def png(image: int) -> bytes:
        buffer = io.BytesIO()
        session.dataset.load_image(image).save(buffer, format="PNG")
        return buffer.getvalue()

    @app.get("/api/image/{image}")
    def image_file(image: int):
        return Response(png(session.check_image(image)), media_type="image/png",
                        headers={"Cache-Control": "max-age=3600"})

    @app.get("/api/info")
    def info():
        return {"models": [{"name": view.name, "has_dictionary": view.labelled is not None, "k": view.k,
                            "map": view.map_method,
                            "atoms": 0 if view.labelled is None else int(view.labelled.dictionary.atoms_.shape[0])}
                           for view in session.models],
                "n_images": session.n_images, "n_captions": len(session.captions), "edit_kinds": list(EDIT_KINDS),
                "max_caption_chars": MAX_CAPTION_CHARS, "max_body_bytes": max_body_bytes}

    @app.get("/api/images")
    def search(q: str = Query("", max_length=MAX_CAPTION_CHARS), offset: int = Query(0, ge=0),
               limit: int = Query(60, ge=1, le=SEARCH_LIMIT)):
        return search_images(session, q, offset, limit)

    @app.post("/api/inspect")
    def inspect(body: QueryBody):
        view = session.model(body.model)
        return inspect_payload(session, view, resolve_query(session, view, body.image, body.caption_id, body.caption))

    @app.post("/api/edit")
    def edit(body: EditBody):
        view = session.model(body.model)
        query = resolve_query(session, view, body.image, body.caption_id, body.caption)
        return edit_payload(session, view, query, body.edit_text(), body.strength, body.seed, body.k)

    @app.get("/api/atom/{atom}")
    def atom(atom: int, model: int = Query(0, ge=0, le=1)):
        return atom_payload(session, session.model(model), atom)

    @app.get("/api/map")
    def geometry_map(model: int = Query(0, ge=0, le=1)):
        return map_payload(session.model(model))

    @app.get("/api/point")
    def point(modality: str = Query(pattern="^(image|text)$"), id: int = Query(), model: int = Query(0, ge=0, le=1)):
        return point_payload(session, session.model(model), modality, id)

    @app.get("/api/neighbours.csv")
    def neighbours_csv(modality: str = Query("image", pattern="^(image|text)$"), model: int = Query(0, ge=0, le=1)):
        view = session.model(model)
        return StreamingResponse(neighbour_csv(session, view, modality), media_type="text/csv", headers={
            "Content-Disposition": f'attachment; filename="neighbours-{modality}-model{model}.csv"'})

    @app.get("/api/compare/{image}")
    def compare(image: int):
        return compare_payload(session, image)

    return app


def search_images(session: ExploreSession, query: str, offset: int, limit: int) -> dict:
    """Images whose id is `query`, or whose captions contain it (case-insensitive); all when empty."""
    text = query.strip().lower()
    if not text:
        rows = range(session.n_images)
    elif text.isdigit():
        rows = [int(text)] if int(text) < session.n_images else []
    else:
        rows = [row for row, record in enumerate(session.dataset.records)
                if any(text in caption.lower() for caption in record.captions)]
    page = list(rows[offset: offset + limit])
    return {"total": len(rows), "offset": offset,
            "items": [{"id": row, "caption": session.dataset.records[row].captions[0]} for row in page]}
