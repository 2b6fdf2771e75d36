"""piper-tts called in-process, behind the thinnest loopback HTTP the standard library offers.

Run by the Piper peer venv's interpreter (`bench.fair` starts it): `python piper_server.py MODEL
PORT`. `POST /synthesize {"text"}` answers the int16 samples of `PiperVoice.synthesize(text)`,
which yields one chunk per sentence, with `X-Seconds` (the whole call) and `X-First-Seconds`
(its first chunk), both taken inside this process, so the loopback hop is not counted against
it. Each request runs in its own thread on the one shared voice, as an application embedding
piper-tts would call it.
"""

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from piper import PiperVoice

MODEL, PORT = sys.argv[1], int(sys.argv[2])
VOICE = PiperVoice.load(MODEL)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        started = time.perf_counter()
        first = 0.0
        chunks = []
        for chunk in VOICE.synthesize(body["text"]):
            chunks.append(chunk.audio_int16_bytes)
            first = first or time.perf_counter() - started
        seconds = time.perf_counter() - started
        data = b"".join(chunks)
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Seconds", f"{seconds:.6f}")
        self.send_header("X-First-Seconds", f"{first:.6f}")
        self.send_header("X-Sample-Rate", str(VOICE.config.sample_rate))
        self.end_headers()
        self.wfile.write(data)


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
