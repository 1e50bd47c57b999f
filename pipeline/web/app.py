"""The studio's HTTP API (JSON, PNG and JPEG; the page uses nothing else) and its page.

Every action is one endpoint; `GET /api/schema` is the OpenAPI description, read from the
docstrings below. A refused request gets a 4xx with {"error": "<one line>"}, and changes
nothing. No path parameter reaches the file system: frames and masks are numbers, the page's
files are served from the package."""

from __future__ import annotations

import asyncio
import errno
import hmac
import json
import time
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.schemas import SchemaGenerator
from starlette.staticfiles import StaticFiles

from segpipe.errors import (
    BadInput,
    DamagedStore,
    NotEnoughSpace,
    SegpipeError,
    StoreLocked,
    StoreMismatch,
    StoreNotReady,
    os_error_line,
)
from segpipe.limits import MAX_JSON_BYTES, TooLarge, human, read_json
from segpipe.web.session import Studio

STATIC = Path(__file__).parent / "static"
STATUS = {  # the first class an error is an instance of
    TooLarge: 413,
    BadInput: 400,
    StoreNotReady: 409,
    StoreLocked: 409,
    StoreMismatch: 409,
    NotEnoughSpace: 507,
    DamagedStore: 500,
}
TOKEN_COOKIE = "segpipe_token"


class Endpoints:
    """The studio's endpoints over `studio`, one method each (their docstrings are the
    OpenAPI schema); `stopping()` says the server is shutting down: event streams end
    then."""

    def __init__(self, studio: Studio, stopping):
        self.studio, self.stopping, self.routes = studio, stopping, []

    async def page(self, request: Request):
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    async def info(self, request: Request):
        """
        summary: The video (frames, fps, size), the tracked objects, read-only or not
        """
        return JSONResponse(await run_in_threadpool(self.studio.info))

    async def frame(self, request: Request):
        """
        summary: Frame n as a JPEG at the video's own size.
        """
        data = await run_in_threadpool(self.studio.frame_jpeg, request.path_params["n"])
        return Response(data, media_type="image/jpeg")

    async def masks(self, request: Request):
        """
        summary: Frame n's tracked masks, a PNG at the video's size
        description: 'Header X-Mask-Format: grey (under 255 objects: the grey value) or rgb
          (R + 256 G) = 1 + the object''s slot in tracked_objects, 0 for none.'
        """
        data, kind = await run_in_threadpool(self.studio.masks_png, request.path_params["n"])
        headers = {"Cache-Control": "no-store", "X-Mask-Format": kind}
        return Response(data, media_type="image/png", headers=headers)

    async def scores(self, request: Request):
        """
        summary: Every tracked object's score and mask area per frame (null where untracked)
        description: Also the frames a pass reached and, per object, where it may be lost
          ([frame, kind, reason], kinds as segpipe.flags says), and measuring (true while
          flags from masks are still to come).
        """
        return JSONResponse(await run_in_threadpool(self.studio.scores))

    async def get_prompts(self, request: Request):
        """
        summary: The page's prompts, as a prompts file (what Track tracks).
        """
        return JSONResponse(self.studio.prompts_file())

    async def put_prompts(self, request: Request):
        """
        summary: Replace the page's prompts (saved as the store's draft)
        description: 'Body: a prompts file, {"prompts": [entries]}, masks inline.'
        """
        body = await _json(request)
        if not isinstance(body, dict) or "prompts" not in body:
            raise BadInput('the body must be {"prompts": [...]}')
        await run_in_threadpool(self.studio.set_prompts, body["prompts"])
        return JSONResponse(self.studio.prompts_file())

    async def undo(self, request: Request):
        """
        summary: Undo the last change of the prompts (the history is the store's)
        description: The prompts then, as GET /api/prompts gives them; 400 with nothing to undo.
        """
        await _json(request, empty={})
        await run_in_threadpool(self.studio.undo)
        return JSONResponse(self.studio.prompts_file())

    async def redo(self, request: Request):
        """
        summary: Make again the change the last undo took back
        description: The prompts then, as GET /api/prompts gives them; 400 with nothing to redo.
        """
        await _json(request, empty={})
        await run_in_threadpool(self.studio.redo)
        return JSONResponse(self.studio.prompts_file())

    async def history(self, request: Request):
        """
        summary: How many changes of the prompts can be undone and redone (undo and redo)
        """
        return JSONResponse(await run_in_threadpool(self.studio.history))

    async def get_labels(self, request: Request):
        """
        summary: The objects' names and classes, as a labels file (its objects list).
        """
        return JSONResponse(await run_in_threadpool(self.studio.labels))

    async def put_labels(self, request: Request):
        """
        summary: Replace the objects' names and classes (no tracking is redone)
        description: 'Body {"objects": [{"id": 1, "name": "left mouse", "class": "mouse"}]};
          an id with neither is an object added before its first prompt. 409 while a job
          runs.'
        """
        body = await _json(request)
        if not isinstance(body, dict) or "objects" not in body:
            raise BadInput('the body must be {"objects": [...]}')
        await run_in_threadpool(self.studio.set_labels, body["objects"])
        return JSONResponse(await run_in_threadpool(self.studio.labels))

    async def patch_labels(self, request: Request):
        """
        summary: Name, class or add the objects given; the others keep theirs
        description: 'Body {"objects": [{"id": 2, "name": "right mouse"}], "remove": [3]}
          (either list may be left out): what two tabs naming different objects at once both
          keep (a PUT replaces every name). Answers as GET does, with every object. 409 while a
          job runs.'
        """
        body = await _json(request)
        if not isinstance(body, dict) or not {"objects", "remove"} & body.keys():
            raise BadInput('the body must be {"objects": [...], "remove": [ids]}')
        objects, remove = body.get("objects", []), body.get("remove", [])
        await run_in_threadpool(self.studio.set_labels, objects, remove)
        return JSONResponse(await run_in_threadpool(self.studio.labels))

    async def preview(self, request: Request):
        """
        summary: The preview mask of one object on one frame, from its prompts there
        description: 'Body {"frame": N, "object": ID}; a PNG, 255 = object, and the header
          X-Object-Score; where the object is tracked on that frame, the header X-Change,
          {"iou", "shift", "drastic"}: the overlap with its tracked mask, how far its centre
          moved in body lengths, and whether the correction moves it drastically. 204 where
          the object has no prompt on that frame (an edit may have just taken it away).'
        """
        body = await _json(request)
        if not isinstance(body, dict):
            raise BadInput('the body must be {"frame": N, "object": ID}')
        made = await run_in_threadpool(self.studio.preview, body.get("frame"), body.get("object"))
        if made is None:
            return Response(status_code=204)
        data, score, change = made
        headers = {"X-Object-Score": f"{score:.4f}"}
        if change is not None:  # the object is tracked there: how far the correction moves it
            headers["X-Change"] = json.dumps(change)
        return Response(data, media_type="image/png", headers=headers)

    async def track(self, request: Request):
        """
        summary: Track the page's prompts in the background (as segpipe track --prompts)
        description: 'Body {"direction": "both" | "forward" | "reverse", "frames": [A, B]},
          or empty: the store''s direction, the whole video. "frames" is the tracking window
          of segpipe track --frames A:B (frames A..B-1; B null: to the end). Or {"concepts":
          ["fish"]}: every instance of them instead (segpipe track --concept; a store of
          sam3-video). 202, or 409 while another job runs or another process writes.'
        """
        body = await _json(request, empty={})
        if not isinstance(body, dict):
            raise BadInput('the body must be {"direction": ..., "frames": [A, B]} or empty')
        await run_in_threadpool(
            self.studio.track, body.get("direction"), body.get("frames"), body.get("concepts")
        )
        return JSONResponse(self.studio.progress(), status_code=202)

    async def export(self, request: Request):
        """
        summary: Export the tracked masks into the store's export folder, in the background
        description: 'Body {"format": NAME}, a registered format (as in /api/info formats).'
        """
        body = await _json(request)
        if not isinstance(body, dict):
            raise BadInput('the body must be {"format": ...}')
        await run_in_threadpool(self.studio.export, body.get("format"))
        return JSONResponse(self.studio.progress(), status_code=202)

    async def cancel(self, request: Request):
        """
        summary: Stop the tracking or export as one Ctrl-C does (the chunk in flight finishes)
        """
        await _json(request, empty={})
        self.studio.cancel()
        return JSONResponse(self.studio.progress())

    async def progress(self, request: Request):
        """
        summary: The job (kind, state, frames done and to do, rate, ETA, message).
        """
        return JSONResponse(self.studio.progress())

    async def events(self, request: Request):
        """
        summary: Server-sent events, one `progress` snapshot each time something changes.
        """

        self.studio.warm()  # a page has loaded: the preview's model can be built now

        async def stream():
            last, synced = None, 0.0
            while not self.stopping() and not await request.is_disconnected():
                if time.monotonic() - synced > 1:  # what another process did to the store
                    await run_in_threadpool(self.studio.sync)
                    synced = time.monotonic()
                now = await run_in_threadpool(self.studio.progress)
                if now != last:
                    yield f"data: {json.dumps(now)}\n\n"
                    last = now
                await asyncio.sleep(0.1)

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def schema(self, request: Request):
        return JSONResponse(SCHEMAS.get_schema(routes=self.routes))


async def _segpipe_error(request: Request, e: SegpipeError):
    status = next((code for cls, code in STATUS.items() if isinstance(e, cls)), 400)
    return JSONResponse({"error": e.message}, status_code=status)


async def _os_error(request: Request, e: OSError):
    """A full disk is 507, a read-only file system 409, a path this user may not use
    403, in one line (`errors.os_error_line`); the store is as it was (writes are
    atomic)."""
    status = {errno.ENOSPC: 507, errno.EROFS: 409, errno.EACCES: 403, errno.EPERM: 403}
    if e.errno not in status:
        raise e
    return JSONResponse({"error": os_error_line(e)}, status_code=status[e.errno])


async def _http_error(request: Request, e: HTTPException):
    return JSONResponse({"error": f"{e.detail}: {request.url.path}"}, status_code=e.status_code)


def make_app(studio: Studio, token: str | None = None, stopping=lambda: False) -> Starlette:
    """The studio's web app over `studio`; with `token`, every request must carry it (the
    `token` query parameter, which also sets a cookie, or that cookie). `stopping()` says the
    server is shutting down: event streams end then."""
    e = Endpoints(studio, stopping)
    e.routes[:] = [
        Route("/", e.page),
        Route("/favicon.ico", lambda request: Response(status_code=204), include_in_schema=False),
        Route("/api/info", e.info),
        Route("/api/frames/{n:int}.jpg", e.frame),
        Route("/api/masks/{n:int}.png", e.masks),
        Route("/api/scores", e.scores),
        Route("/api/prompts", e.get_prompts, methods=["GET"]),
        Route("/api/prompts", e.put_prompts, methods=["PUT"]),
        Route("/api/undo", e.undo, methods=["POST"]),
        Route("/api/redo", e.redo, methods=["POST"]),
        Route("/api/history", e.history),
        Route("/api/labels", e.get_labels, methods=["GET"]),
        Route("/api/labels", e.put_labels, methods=["PUT"]),
        Route("/api/labels", e.patch_labels, methods=["PATCH"]),
        Route("/api/preview", e.preview, methods=["POST"]),
        Route("/api/track", e.track, methods=["POST"]),
        Route("/api/export", e.export, methods=["POST"]),
        Route("/api/cancel", e.cancel, methods=["POST"]),
        Route("/api/progress", e.progress),
        Route("/api/events", e.events),
        Route("/api/schema", e.schema, include_in_schema=False),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(
        routes=e.routes,
        exception_handlers={
            SegpipeError: _segpipe_error,
            HTTPException: _http_error,
            OSError: _os_error,
        },
    )
    if token is not None:
        app.add_middleware(_TokenCheck, token=token)
    else:  # loopback: only its own names (a rebound name of another site is refused)
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=LOOPBACK_NAMES)
    return app


LOOPBACK_NAMES = ["127.0.0.1", "localhost", "::1", "[::1]"]
DRAINED = 16 * MAX_JSON_BYTES  # a body past the limit is read (and dropped) up to this


SCHEMAS = SchemaGenerator({"openapi": "3.0.0", "info": {"title": "segpipe studio", "version": "1"}})


async def _json(request: Request, empty=None):
    """The request's JSON body (`limits.read_json`): a body over `MAX_JSON_BYTES` is refused
    with 413, the rest of it read and dropped (up to `DRAINED`, so that a client still
    sending it gets the answer), never held. It must say it is JSON: a page of another site can
    send a form or text/plain to a loopback address, but not application/json without
    asking first (a CORS preflight, which the studio never grants)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise BadInput("the body must be JSON, sent as Content-Type: application/json")
    size = request.headers.get("content-length", "")
    said = f"the request body is {human(int(size))}" if size.isdigit() else None
    body, seen = bytearray(), 0
    async for part in request.stream():
        seen += len(part)
        if seen <= MAX_JSON_BYTES:
            body += part
        elif seen > DRAINED:  # no answer then: the connection is closed
            break
        else:  # read on and dropped, so that the client, still sending, gets the answer
            body = None
    if body is None or (said and int(size) > MAX_JSON_BYTES):
        said = said or f"the request body is over {human(MAX_JSON_BYTES)}"
        raise TooLarge(f"{said}: segpipe reads at most {human(MAX_JSON_BYTES)}")
    if not body.strip() and empty is not None:
        return empty
    return read_json(bytes(body), "the request body")


class _TokenCheck:
    """Every request carries the studio's token (query `token`, or the cookie the page's
    first request set), else 401."""

    def __init__(self, app, token: str):
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        given = request.query_params.get("token") or request.cookies.get(TOKEN_COOKIE) or ""
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            response = JSONResponse(
                {"error": "missing or wrong token: open the URL the studio printed"},
                status_code=401,
            )
            return await response(scope, receive, send)
        if "token" in request.query_params:

            async def with_cookie(message):
                if message["type"] == "http.response.start":
                    cookie = f"{TOKEN_COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                    message["headers"] = [*message["headers"], (b"set-cookie", cookie.encode())]
                await send(message)

            return await self.app(scope, receive, with_cookie)
        return await self.app(scope, receive, send)
