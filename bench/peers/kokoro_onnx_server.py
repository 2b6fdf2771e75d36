"""kokoro-onnx called in-process, behind the thinnest loopback HTTP the standard library offers.

Run by the peer venv's interpreter (`bench.kokoro` starts it): `python kokoro_onnx_server.py
MODEL VOICES PORT`. `POST /synthesize {"text", "voice"}` answers the raw float32 samples of
`Kokoro.create(text, voice)`, with `X-Seconds`: the time `create` took inside this process, the
figure the benchmark uses (the loopback hop is left out). Each request runs in its own thread
on the one shared session, as an application embedding kokoro-onnx would call it.
"""

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kokoro_onnx import Kokoro

MODEL, VOICES, PORT = sys.argv[1], sys.argv[2], int(sys.argv[3])
KOKORO = Kokoro(MODEL, VOICES)


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
        samples, rate = KOKORO.create(body["text"], voice=body["voice"], lang="en-us")
        seconds = time.perf_counter() - started
        data = samples.astype("float32").tobytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Seconds", f"{seconds:.6f}")
        self.send_header("X-Sample-Rate", str(rate))
        self.end_headers()
        self.wfile.write(data)


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
