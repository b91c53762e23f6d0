"""The HTTP API: LibreTranslate's `POST /translate` and `GET /languages`,
the native `POST /v1/translate` (beam size, n-best lists and scores), and
`GET /health` and `GET /metrics`, as a Starlette application.

Starlette (with uvicorn as its server) is the ASGI toolkit FastAPI is built
on: routing, requests and responses, and nothing the API does not use.
Every error is LibreTranslate's shape, `{"error": "..."}`: 400 for a
request this server cannot take, 413 for one over its size limit, 429 with
`Retry-After` when the queue is full, 503 for a request that outlasts its
time limit, 500 for a failure of ours.
"""

import asyncio
import contextlib
import dataclasses
import json
import time
import urllib.parse

from keras_transformer.serving.batcher import QueueFull
from keras_transformer.serving.service import REQUEST_SETTINGS
from keras_transformer.serving.service import Refused
from keras_transformer.serving.service import UnknownPair


class RequestError(Exception):
    """A request this server refuses; `status` is the HTTP status."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may hold.

    Attributes:
        request_bytes: the body's size.
        texts: texts in `q`.
        characters: characters of one text.
        sentences: sentences of all its texts.
        timeout: seconds until a request is answered 503 (its sentences
            not yet decoding are dropped).
        retry_after: the seconds a 429 asks a client to wait.
    """

    request_bytes: int = 1_000_000
    texts: int = 128
    characters: int = 100_000
    sentences: int = 2_000
    timeout: int = 120
    retry_after: int = 1

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{field.name} must be an integer >= 1. Received: {field.name}={value!r}")


def create_app(service, limits=Limits(), backend=None):
    """The Starlette application of `service` (a `Service`)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.start()
        yield
        await service.stop()  # uvicorn has answered every request it accepted

    def timed(route, handler):
        async def endpoint(request):
            start = time.perf_counter()
            try:
                response = await handler(request)
            except RequestError as error:
                response = JSONResponse({"error": str(error)}, status_code=error.status)
            except QueueFull as error:
                response = JSONResponse(
                    {"error": f"Too many sentences waiting: {error}. Retry in {limits.retry_after} s."},
                    status_code=429, headers={"Retry-After": str(limits.retry_after)},
                )
            except Exception as error:  # noqa: BLE001 - a failure of ours, said as JSON
                response = JSONResponse({"error": f"{type(error).__name__}: {error}"}, status_code=500)
            service.metrics.request(route, response.status_code, time.perf_counter() - start)
            return response

        return endpoint

    async def answer(request, values, texts, **options):
        """`service.translate`'s answer to `texts`, within the limits."""
        source, target = (_field(values, name) for name in ("source", "target"))
        try:
            service.served(source, target)
            work = service.translate(texts, source, target, max_sentences=limits.sentences, **options)
            return await asyncio.wait_for(_unless_disconnected(request, work), limits.timeout)
        except (UnknownPair, Refused) as error:
            raise RequestError(str(error)) from None
        except TimeoutError:
            raise RequestError(f"The translation took longer than this server's limit of {limits.timeout} s.", 503) from None

    async def translate(request):
        values = await _arguments(request, limits)
        texts, single = _texts(values, limits)
        text_format = values.get("format", "text")
        if text_format != "text":
            raise RequestError(f"format must be 'text'; HTML is not translated here. Received: {text_format!r}")
        count = values.get("alternatives", 0)  # LibreTranslate's: other translations, from the n-best list
        if isinstance(count, str) and count.isdigit():  # a form's value
            count = int(count)
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise RequestError(f"alternatives must be an integer >= 0. Received: {json.dumps(count)[:80]}")
        translations, _, warnings, alternatives = await answer(request, values, texts, n_best=count + 1 if count else None)
        body = {"translatedText": translations[0] if single else translations}
        if count:
            body["alternatives"] = alternatives[0] if single else alternatives
        if warnings:
            body["warnings"] = warnings
        return JSONResponse(body)

    async def translate_v1(request):
        values = await _arguments(request, limits, forms=False)
        texts, _ = _texts(values, limits)
        options = {
            "search": {name: values[name] for name in REQUEST_SETTINGS if name in values},
            "n_best": _integer(values, "n_best") or 1,
            "split_sentences": values.get("split_sentences", True),
        }
        if not isinstance(options["split_sentences"], bool):
            raise RequestError(f"split_sentences must be true or false. Received: {json.dumps(values['split_sentences'])[:80]}")
        translations, details, warnings, _ = await answer(request, values, texts, **options)
        body = {"translations": [
            {"text": text, "sentences": [
                {"source": sentence, "hypotheses": [{"text": found, "score": score} for found, score in hypotheses]}
                for sentence, hypotheses in sentences
            ]}
            for text, sentences in zip(translations, details)
        ], "warnings": warnings}
        return JSONResponse(body)

    async def languages(request):
        return JSONResponse(service.languages())

    async def health(request):
        return JSONResponse({"status": "ok", "backend": backend, "pairs": [f"{s}-{t}" for s, t in service.models]})

    async def metrics(request):
        return PlainTextResponse(service.metrics.text(), media_type="text/plain; version=0.0.4")

    routes = [
        Route("/translate", timed("/translate", translate), methods=["POST"]),
        Route("/v1/translate", timed("/v1/translate", translate_v1), methods=["POST"]),
        Route("/languages", timed("/languages", languages), methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]

    async def not_found(request, exc):
        return JSONResponse({"error": f"{request.method} {request.url.path}: {exc.detail}"}, status_code=exc.status_code)

    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})


async def _unless_disconnected(request, work):
    """`await work`, cancelled (and its sentences not yet decoded with it)
    if the client goes away first."""
    task = asyncio.ensure_future(work)

    async def disconnected():
        while not await request.is_disconnected():
            await asyncio.sleep(0.05)

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the request's time limit
        task.cancel()
        raise
    finally:
        watch.cancel()
    if not task.done():
        task.cancel()
        raise RequestError("The client disconnected before its translation was ready.", status=499)
    return task.result()


async def _arguments(request, limits, forms=True):
    """The request's fields, from a JSON object or (`forms`) a URL-encoded
    form."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.request_bytes:
        raise RequestError(f"The request has {int(declared):,} bytes; this server takes at most {limits.request_bytes:,}.", 413)
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limits.request_bytes:
            raise RequestError(f"The request has more than {limits.request_bytes:,} bytes; this server takes at most that.", 413)
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(f"The request body is not valid UTF-8 ({error.reason} at byte {error.start}).") from None
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise RequestError(f"The request body is not valid JSON: {error}.") from None
        if not isinstance(values, dict):
            raise RequestError(f"The request body must be a JSON object; it holds a {type(values).__name__}.")
        return values
    if forms and content_type in ("application/x-www-form-urlencoded", ""):
        fields = urllib.parse.parse_qs(text, keep_blank_values=True)
        return {name: found[0] if len(found) == 1 else found for name, found in fields.items()}
    raise RequestError(
        f"Content-Type {content_type!r} is not read here; send JSON (application/json)"
        + (" or a URL-encoded form (application/x-www-form-urlencoded)." if forms else ".")
    )


def _texts(values, limits):
    """`q` as a list of strings, and whether it was one string."""
    if "q" not in values:
        raise RequestError("The request has no q: the text, or a list of texts, to translate.")
    q = values["q"]
    single = isinstance(q, str)
    texts = [q] if single else q
    if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
        raise RequestError(f"q must be a string or a list of strings. Received: {json.dumps(q)[:80]}")
    if len(texts) > limits.texts:
        raise RequestError(f"q holds {len(texts):,} texts; this server takes at most {limits.texts:,} a request.")
    for i, text in enumerate(texts):
        if len(text) > limits.characters:
            raise RequestError(
                f"q[{i}] has {len(text):,} characters; this server takes at most {limits.characters:,} a text."
            )
    return texts, single


def _integer(values, name):
    """An optional integer >= 1 of a JSON body, or None."""
    value = values.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise RequestError(f"{name} must be an integer >= 1. Received: {json.dumps(value)[:80]}")
    return value


def _field(values, name):
    value = values.get(name)
    if not isinstance(value, str) or not value:
        raise RequestError(f"The request has no {name}: a language code such as 'en'. Received: {value!r}")
    if value == "auto":
        raise RequestError(f"{name} 'auto' is not served: language detection is not done here; name the language.")
    return value
