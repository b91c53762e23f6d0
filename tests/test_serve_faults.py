"""`keras-transformer serve` under bad requests and long documents: each
fault gets a JSON error, the server keeps serving, and its memory does not
grow; a long document comes back with its structure."""

import http.client
import json
import os
import socket
import urllib.parse

import pytest
from conftest import in_one_pass
from process_runs import serving
from translation_fixtures import served_dir  # noqa: F401 (a fixture)

from keras_transformer.data.sentences import split_text
from keras_transformer.decoding import Translator

GOOD = {"q": ["the old man sees the dog .", "the cat ."], "source": "en", "target": "de"}




def post(url, body, content_type="application/json"):
    """`(status, JSON answer, headers)`; the connection is closed after."""
    address = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    try:
        connection.request("POST", "/translate", body=body, headers={"Content-Type": content_type})
        response = connection.getresponse()
        return response.status, json.loads(response.read()), {k.lower(): v for k, v in response.getheaders()}
    finally:
        connection.close()


def disconnect_mid_request(url):
    """Sends a whole request and goes away without reading the answer."""
    address = urllib.parse.urlsplit(url)
    body = json.dumps(GOOD | {"q": ["the old man sees the dog ."] * 20}).encode()
    with socket.create_connection((address.hostname, address.port), timeout=10) as connection:
        connection.sendall(
            b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )


def resident_bytes(process):
    with open(f"/proc/{process.pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


FAULTS = [
    (b'{"q": "the cat .", "source": "en"', 400, "not valid JSON"),
    (json.dumps(GOOD | {"q": "x" * 10_000_000}).encode(), 413, "at most 1,000,000"),
    (json.dumps(GOOD | {"q": ["a ."] * 10_000}).encode(), 400, "10,000 texts"),
    (b'{"q": "\xc3\x28 \xff", "source": "en", "target": "de"}', 400, "not valid UTF-8"),
    (json.dumps(GOOD | {"target": "fr"}).encode(), 400, "Pairs served: en-de"),
    (json.dumps(GOOD | {"q": ["the cat ."] * 100}).encode(), 429, "Too many sentences waiting"),
]


@in_one_pass("torch", "the server's host code around Translator.search_ids, which every pass tests")
def test_a_thousand_faults_get_json_errors_and_leave_the_server_as_it_was(served_dir):
    with serving("--model-dir", served_dir, "--no-warm-up", "--max-queue", 64, "--max-texts", 200) as (process, url):
        expected = post(url, json.dumps(GOOD).encode())
        assert expected[0] == 200
        for _ in range(20):  # the allocator's pools, filled by ordinary work first
            post(url, json.dumps(GOOD).encode())
        before = resident_bytes(process)
        for i in range(1_000):
            if i % (len(FAULTS) + 1) == len(FAULTS):
                disconnect_mid_request(url)
                continue
            body, status, message = FAULTS[i % (len(FAULTS) + 1)]
            got, answer, headers = post(url, body)
            assert (got, list(answer)) == (status, ["error"]) and message in answer["error"], (i, got, answer)
            if status == 429:
                assert headers["retry-after"] == "1"
        assert post(url, json.dumps(GOOD).encode())[:2] == expected[:2]
        after = resident_bytes(process)
        assert after <= 1.1 * before, (before, after)
        assert process.poll() is None


@in_one_pass("torch", "the server's host code around Translator.search_ids, which every pass tests")
def test_a_5000_word_document_keeps_its_paragraphs_and_lines_and_every_sentence(served_dir, tmp_path):
    """A document of paragraphs of sentences (some with line breaks inside)
    comes back with the same paragraphs and lines, and a translation for
    each of its sentences: nothing dropped, nothing merged."""
    sentences = ["the old man sees the dog .", "a woman helps the small child .", "the cat sleeps ."]
    paragraphs, words = [], 0
    while words < 5_000:
        lines = [" ".join(sentences[(len(paragraphs) + k) % 3] for k in range(3)) for _ in range(2)]
        paragraphs.append("\n".join(lines))
        words += sum(len(line.split()) for line in lines)
    document = "\n\n".join(paragraphs)
    translator = Translator.load(served_dir)
    translation = dict(zip(sentences, translator.translate(sentences)))
    with serving("--model-dir", served_dir, "--no-warm-up", "--threads", 1) as (process, url):
        status, answer, _ = post(url, json.dumps({"q": document, "source": "en", "target": "de"}).encode())
        assert len(os.sched_getaffinity(process.pid)) == 1  # --threads 1: one core computes
    assert status == 200 and "warnings" not in answer
    got = answer["translatedText"]
    layout = split_text(document, "en")
    assert len(layout.sentences) == 3 * 2 * len(paragraphs) and len(document.split()) >= 5_000
    assert got == layout.join([translation[sentence] for sentence in layout.sentences])
    assert [len(p.split("\n")) for p in got.split("\n\n")] == [2] * len(paragraphs)
