"""`keras-transformer serve`: LibreTranslate's API over real HTTP on
127.0.0.1, batching across requests, and the errors it answers with."""

import concurrent.futures
import json
import signal
import threading
import time
import urllib.error
import urllib.request

import keras
import libretranslatepy  # the test extra's: LibreTranslate's own client
import pytest
import uvicorn
from conftest import in_one_pass
from process_runs import free_port
from process_runs import serving
from translation_fixtures import model  # noqa: F401 (a fixture)
from translation_fixtures import served_dir  # noqa: F401 (a fixture)
from translation_fixtures import tokenizer  # noqa: F401 (a fixture)

from keras_transformer.decoding import Translator
from keras_transformer.serving import Limits
from keras_transformer.serving import Metrics
from keras_transformer.serving import Service
from keras_transformer.serving import create_app
from keras_transformer.serving import load_translators


TEXTS = ["the old man sees the dog .", "a woman helps the small child .", "the cat ."]




class Server:
    """A served app in a thread of this process, on a free port."""

    def __init__(self, model_dirs, limits=Limits(), **batching):
        translators = load_translators(model_dirs)
        self.translators = translators
        self.service = Service(translators, Metrics(), **batching)
        self.port = free_port()
        config = uvicorn.Config(create_app(self.service, limits, backend=keras.backend.backend()),
                                host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/"

    def post(self, path, body, content_type="application/json"):
        """`(status, JSON answer, headers)` of a POST of `body` (bytes)."""
        request = urllib.request.Request(self.url + path.lstrip("/"), data=body, headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read()), response.headers
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read()), error.headers


def translate_json(**fields):
    return json.dumps(fields).encode()


def test_libretranslate_s_client_gets_what_translate_gives(served_dir):
    """LibreTranslate's own Python client, unchanged, against the server:
    each text as `Translator.translate` gives it, and the pair listed."""
    with Server([served_dir]) as server:
        # The served translator, loaded from served_dir: its own calls reuse what the server compiled.
        translator, directory = server.translators[("en", "de")]
        assert directory == served_dir
        client = libretranslatepy.LibreTranslateAPI(server.url)
        for text in TEXTS:
            assert client.translate(text, "en", "de") == translator.translate([text])[0]
        assert client.languages() == [
            {"code": "de", "name": "German", "targets": []},
            {"code": "en", "name": "English", "targets": ["de"]},
        ]
        status, answer, _ = server.post("/translate", translate_json(q=TEXTS, source="en", target="de"))
        assert (status, answer) == (200, {"translatedText": translator.translate(TEXTS)})


@in_one_pass("torch", "the server's host code around Translator.search_ids, which every pass tests")
def test_concurrent_requests_are_decoded_together(served_dir):
    """Sentences of requests that arrive together share batches, and each
    request gets its own sentences' translations."""
    translator = Translator.load(served_dir)
    expected = translator.translate(TEXTS)
    with Server([served_dir], max_wait=0.2) as server:
        with concurrent.futures.ThreadPoolExecutor(len(TEXTS) * 2) as pool:
            answers = list(pool.map(
                lambda text: server.post("/translate", translate_json(q=text, source="en", target="de")),
                TEXTS * 2,
            ))
        assert [answer["translatedText"] for _, answer, _ in answers] == expected * 2
        batches = server.service.metrics.batches["en-de"]
        assert sum(batches.counts) < len(TEXTS) * 2  # fewer batches than requests
        text = urllib.request.urlopen(server.url + "metrics", timeout=10).read().decode()
        assert 'translate_requests_total{route="/translate",status="200"} 6' in text


@in_one_pass("torch", "the server's host code around Translator.search_ids, which every pass tests")
def test_sentences_lines_and_paragraphs_are_kept_and_a_long_sentence_is_split_with_a_warning(served_dir):
    translator = Translator.load(served_dir)
    long_sentence = " and ".join(text.rstrip(" .") for text in TEXTS * 4) + " ."  # past max_source_length=32
    text = f"{TEXTS[0]}  {TEXTS[1]}\n{TEXTS[2]}\n\n{long_sentence}\n"
    with Server([served_dir]) as server:
        status, answer, _ = server.post("/translate", translate_json(q=text, source="en", target="de"))
    assert status == 200
    first, second, third = translator.translate(TEXTS)
    lines = answer["translatedText"].split("\n")
    assert lines[:3] == [f"{first}  {second}", third, ""] and lines[4] == ""
    tokens = len(translator.tokenizer.tokenize([long_sentence])[0])
    with pytest.warns(UserWarning, match="translated in"):  # in pieces, joined, as Translator does it
        assert lines[3] == translator.translate([long_sentence], split_sentences=True)[0]
    assert answer["warnings"] == [
        f"texts[0] has a sentence of {tokens} tokens, more than the model's 31; it was translated in "
        f"{-(-tokens // 31)} pieces"
    ]


@in_one_pass("torch", "the server's host code around Translator.search_ids, which every pass tests")
def test_v1_gives_each_sentence_s_n_best_with_scores_and_takes_a_served_beam_size(served_dir):
    translator = Translator.load(served_dir)  # beam 2
    greedy = translator.with_search(beam_size=1)
    with Server([served_dir], beam_sizes=[1]) as server:
        status, answer, _ = server.post("/v1/translate", translate_json(
            q=[f"{TEXTS[0]} {TEXTS[1]}", TEXTS[2]], source="en", target="de", n_best=2))
        assert status == 200 and answer["warnings"] == []
        first, second = answer["translations"]
        assert [s["source"] for s in first["sentences"]] == TEXTS[:2]
        for sentence, expected in zip(first["sentences"] + second["sentences"], translator.n_best(TEXTS)):
            assert [(h["text"], pytest.approx(h["score"], abs=1e-4)) for h in sentence["hypotheses"]] == expected
        assert first["text"] == " ".join(translator.translate(TEXTS[:2]))
        status, answer, _ = server.post("/v1/translate", translate_json(q=TEXTS[2], source="en", target="de", beam_size=1))
        (hypothesis,) = answer["translations"][0]["sentences"][0]["hypotheses"]
        assert (hypothesis["text"], pytest.approx(hypothesis["score"], abs=1e-4)) == greedy.n_best([TEXTS[2]])[0][0]
        # Other search settings: a batcher of their own, made when first asked for.
        for fields, searching in (({"min_length": 6, "no_repeat_ngram_size": 2}, translator), ({"sampling": "topk:1"}, greedy)):
            status, answer, _ = server.post("/v1/translate", translate_json(q=TEXTS[2], source="en", target="de", **fields))
            (hypothesis,) = answer["translations"][0]["sentences"][0]["hypotheses"]
            expected = searching.with_search(**fields).n_best([TEXTS[2]], count=1)[0][0]
            assert (hypothesis["text"], pytest.approx(hypothesis["score"], abs=1e-4)) == expected, fields
        assert len(server.service.models["en", "de"].batchers) == 4
        # LibreTranslate's alternatives: the n-best list's others.
        status, answer, _ = server.post("/translate", translate_json(q=TEXTS[2], source="en", target="de", alternatives=1))
        assert [answer["translatedText"], *answer["alternatives"]] == [text for text, _ in translator.n_best([TEXTS[2]])[0]]
        for fields, message in (
            ({"beam_size": 3}, "beam sizes [1, 2]"), ({"n_best": 3}, "from 1 to the beam size, 2"),
            ({"n_best": True}, "n_best must be an integer"), ({"split_sentences": "no"}, "true or false"),
            ({"sampling": "topk:5", "temperature": 0}, "temperature must be a finite number above 0. Received: temperature=0"),
            ({"min_length": "5"}, "min_length must be an integer >= 0. Received: min_length='5'"),
        ):
            status, answer, _ = server.post("/v1/translate", translate_json(q="a .", source="en", target="de", **fields))
            assert status == 400 and message in answer["error"], answer
        status, answer, _ = server.post("/v1/translate", b"q=a", "application/x-www-form-urlencoded")
        assert status == 400 and "send JSON (application/json)." in answer["error"]


@in_one_pass("torch", "the server's host code around Translator.search_ids, which every pass tests")
def test_batching_off_decodes_each_request_alone(served_dir):
    translator = Translator.load(served_dir)
    with Server([served_dir], max_wait=0.2, across_requests=False) as server:
        with concurrent.futures.ThreadPoolExecutor(len(TEXTS)) as pool:
            answers = list(pool.map(
                lambda text: server.post("/translate", translate_json(q=[text, text], source="en", target="de")), TEXTS
            ))
        assert [answer["translatedText"] for _, answer, _ in answers] == [[t, t] for t in translator.translate(TEXTS)]
        batches = server.service.metrics.batches["en-de"]
        assert sum(batches.counts) == len(TEXTS) and batches.sum == 2 * len(TEXTS)  # a batch a request


@in_one_pass("torch", "the server's host code around Translator.search_ids, which every pass tests")
def test_bad_requests_get_a_json_error_and_the_server_keeps_serving(served_dir):
    translator = Translator.load(served_dir)
    limits = Limits(request_bytes=20_000, texts=50, characters=5_000)
    with Server([served_dir], limits, max_queue=40) as server:
        cases = [
            (b"{not json", "application/json", 400, "not valid JSON"),
            (b'{"q": "\xff\xfe", "source": "en", "target": "de"}', "application/json", 400, "not valid UTF-8"),
            (translate_json(q="x" * 30_000, source="en", target="de"), "application/json", 413, "at most 20,000"),
            (translate_json(q=["a ."] * 60, source="en", target="de"), "application/json", 400, "at most 50 a request"),
            (translate_json(q="the cat .", source="en", target="fr"), "application/json", 400, "Pairs served: en-de"),
            (translate_json(q=["the cat ."] * 45, source="en", target="de"), "application/json", 429, "Too many"),
            (translate_json(source="en", target="de"), "application/json", 400, "has no q"),
            (translate_json(q="a", source="en", target="de", format="html"), "application/json", 400, "format"),
            (b"q=a", "text/csv", 400, "Content-Type"),
        ]
        for body, content_type, status, message in cases:
            got, answer, headers = server.post("/translate", body, content_type)
            assert (got, list(answer)) == (status, ["error"]), (message, got, answer)
            assert message in answer["error"]
            if status == 429:
                assert headers["Retry-After"] == "1"
        status, answer, _ = server.post("/translate", b"q=the+cat+.&source=en&target=de",
                                        "application/x-www-form-urlencoded")
        assert (status, answer) == (200, {"translatedText": translator.translate(["the cat ."])[0]})


def test_the_serve_command_starts_answers_and_ends_on_sigterm(served_dir, tmp_path):
    """The command prints its one line, serves, and on SIGTERM answers
    what it accepted and exits 0 (`--languages` names the pair the
    translator saved: the flag is read, and agrees)."""
    # Batches wait 0.5 s for more sentences: the requests are in flight at SIGTERM.
    with serving("--model-dir", served_dir, "--no-warm-up", "--max-wait-ms", 500, "--languages", "en-de") as (
        process, url
    ):
        line = process.stdout.readline()
        assert line.startswith(f"Serving en-de ({served_dir}) at {url.rstrip('/')} on {keras.backend.backend()}")
        client = libretranslatepy.LibreTranslateAPI(url)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = [pool.submit(client.translate, text, "en", "de") for text in TEXTS]
            time.sleep(0.25)
            process.send_signal(signal.SIGTERM)
            translations = [answer.result(timeout=60) for answer in answers]
        assert translations == Translator.load(served_dir).translate(TEXTS)
        assert process.wait(timeout=60) == 0


@in_one_pass("torch", "the server's host code around Translator.search_ids, which every pass tests")
def test_a_translator_without_a_pair_needs_one_given(model, tokenizer, tmp_path):  # noqa: F811
    directory = tmp_path / "old"
    Translator(model, tokenizer).save(directory)
    with pytest.raises(ValueError, match="names no language pair.*--languages en-de"):
        load_translators([str(directory)])
    translators = load_translators([str(directory)], [("en", "de")])
    assert list(translators) == [("en", "de")]


@in_one_pass("torch", "the server's host code around Translator.search_ids, which every pass tests")
def test_a_cancelled_request_s_sentences_are_not_decoded():
    """A request cancelled (its client gone) before its batch starts takes
    its sentences out: the translator never decodes them."""
    import asyncio

    from keras_transformer.serving.batcher import Batcher

    class Recording:
        def __init__(self):
            self.decoded = []

        def search_ids(self, sources):
            self.decoded.extend(tuple(ids) for ids in sources)
            time.sleep(0.15)
            return [([ids], [0.0]) for ids in sources]

    async def scenario():
        translator = Recording()
        batcher = Batcher(translator, max_wait=0.2)
        batcher.start()
        busy = asyncio.ensure_future(batcher.search([[1, 3]]))  # decoding while the others wait
        await asyncio.sleep(0.02)
        kept = asyncio.ensure_future(batcher.search([[5, 6, 3]]))
        gone = asyncio.ensure_future(batcher.search([[7, 8, 3], [9, 3]]))
        await asyncio.sleep(0.05)
        gone.cancel()
        assert await kept == [([[5, 6, 3]], [0.0])]
        await busy
        await batcher.stop()
        return translator.decoded

    assert asyncio.run(scenario()) == [(1, 3), (5, 6, 3)]


class SlowTranslator:
    """A translator that takes `seconds` a batch and notes each batch's
    sentences by their first id."""

    def __init__(self, batch_size, seconds):
        self.batch_size, self.seconds, self.batches = batch_size, seconds, []

    def search_ids(self, sources):
        self.batches.append([ids[0] for ids in sources])
        time.sleep(self.seconds)
        return [([ids], [0.0]) for ids in sources]


@in_one_pass("torch", "the batcher's host code, the same under every backend")
def test_a_batch_waits_for_as_many_sentences_as_the_last_from_when_the_decoder_is_free():
    """After a batch of two, a sentence that waited through it waits
    `max_wait` more for a second (its clients, just answered), so they share
    the next batch; after a batch of one, or with a full batch waiting, a
    batch starts at once."""
    import asyncio

    from keras_transformer.serving.batcher import Batcher

    async def timed(work):
        started = time.perf_counter()
        await work
        return time.perf_counter() - started

    async def scenario():
        translator = SlowTranslator(batch_size=3, seconds=0.3)
        batcher = Batcher(translator, max_wait=0.2)
        batcher.start()
        first = asyncio.gather(batcher.search([[1, 3]]), batcher.search([[1, 3]]))  # a batch of two
        await asyncio.sleep(0.1)
        second = asyncio.ensure_future(batcher.search([[2, 3]]))  # waits through the first batch
        await first
        await asyncio.sleep(0.05)  # a client just answered sends its next sentence
        await asyncio.gather(second, batcher.search([[3, 3]]))
        full = await timed(batcher.search([[4, 3], [5, 3], [6, 3]]))  # a full batch: no wait
        alone = await timed(batcher.search([[7, 3]]))  # after a batch of three, waits 0.2 s for more
        again = await timed(batcher.search([[8, 3]]))  # after a batch of one: no wait
        await batcher.stop()
        return translator.batches, full, alone, again

    batches, full, alone, again = asyncio.run(scenario())
    assert batches == [[1, 1], [2, 3], [4, 5, 6], [7], [8]]
    assert full < 0.3 + 0.15 and again < 0.3 + 0.15 < alone


@in_one_pass("torch", "the batcher's host code, the same under every backend")
def test_a_burst_of_clients_shares_one_batch_though_the_last_batch_was_one_sentence():
    """Clients that start together send within milliseconds of each other:
    after a batch of one, the sentences that keep arriving within the gap
    join the first, and one after a pause goes to the next batch."""
    import asyncio

    from keras_transformer.serving.batcher import Batcher

    async def scenario():
        translator = SlowTranslator(batch_size=8, seconds=0.2)
        batcher = Batcher(translator, max_wait=1.0, burst_gap=0.1)
        batcher.start()
        await batcher.search([[1, 3]])  # a batch of one
        burst = []
        for token in (2, 3, 4, 5):
            burst.append(asyncio.ensure_future(batcher.search([[token, 3]])))
            await asyncio.sleep(0.02)  # within the gap of the one before
        await asyncio.sleep(0.3)  # a pause past the gap: the batch has started
        await asyncio.gather(batcher.search([[6, 3]]), *burst)
        await batcher.stop()
        return translator.batches

    assert asyncio.run(scenario()) == [[1], [2, 3, 4, 5], [6]]


@in_one_pass("torch", "the batcher's host code, the same under every backend")
def test_a_burst_s_gap_grows_with_the_last_batch_s_decoding_time():
    """Sentences 2 ms apart, further apart than `burst_gap`, still share a
    batch when the last batch took 0.6 s: each may wait 1% of that (6 ms)
    for the next, rather than miss the batch and wait all of it."""
    import asyncio

    from keras_transformer.serving.batcher import Batcher

    async def scenario():
        translator = SlowTranslator(batch_size=8, seconds=0.6)
        batcher = Batcher(translator, max_wait=1.0, burst_gap=0.0005)
        batcher.start()
        await batcher.search([[1, 3]])  # a batch of one, 0.6 s long
        burst = []
        for token in (2, 3, 4, 5):
            burst.append(asyncio.ensure_future(batcher.search([[token, 3]])))
            await asyncio.sleep(0.002)
        await asyncio.gather(*burst)
        await batcher.stop()
        return translator.batches

    assert asyncio.run(scenario()) == [[1], [2, 3, 4, 5]]
