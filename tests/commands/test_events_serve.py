"""``sim events serve``: a run's KV events over ZeroMQ, framed as vLLM's ZmqEventPublisher
frames them (topic, 8-byte big-endian sequence number, msgpack batch).

A subscriber receives every batch of ``sim run --kv-events`` in order, each payload decodes
to the batch ``kv_events.jsonl`` holds, and, where vLLM's own package is installed (the
oracle's venv), vLLM's msgspec classes decode every payload too.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

from sim.config.scenario import load_scenario  # noqa: E402
from sim.commands.events_serve import ServeError, binds, serve  # noqa: E402
from sim.oracle.worker import default_oracle_python  # noqa: E402
from sim.commands.run import simulate, write_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "athena-tiny.yaml"

VLLM_DECODE = r"""
import sys, json, msgspec
from vllm.distributed.kv_events import KVEventBatch
frames = json.load(open(sys.argv[1]))
dec = msgspec.msgpack.Decoder(type=KVEventBatch)
out = []
for topic, seq, payload in frames:
    b = dec.decode(bytes.fromhex(payload))
    out.append([type(e).__name__ for e in b.events])
print(json.dumps(out))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def events_run(tmp_path_factory):
    sc = load_scenario(TINY, {"kv_events": {"enable_kv_cache_events": True}})
    return write_run(tmp_path_factory.mktemp("ev") / "run", sc, *simulate(sc, jump=False),
                     report=False)


def _lines(run: Path) -> list[dict]:
    out = []
    for line in (run / "kv_events.jsonl").read_text().splitlines():
        d = json.loads(line)
        if "events" in d:
            out.append(d)
    return out


def test_a_subscriber_gets_every_batch_as_vllm_frames_it(events_run, tmp_path):
    port = _free_port()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 10_000)
    sub.bind(f"tcp://127.0.0.1:{port}")      # (serve connects: no * in the endpoint)
    want = _lines(events_run)
    got: list = []
    done = threading.Event()

    def receive():
        try:
            while len(got) < len(want):
                got.append(sub.recv_multipart())
        finally:
            done.set()

    t = threading.Thread(target=receive, daemon=True)
    t.start()
    served = serve(events_run, f"tcp://127.0.0.1:{port}", wait_s=0.5)
    done.wait(20)
    sub.close()
    ctx.term()
    assert served.batches == len(want) and len(got) == len(want) > 0
    for seq, (frames, line) in enumerate(zip(got, want)):
        topic, seq_bytes, payload = frames
        assert topic == b"" and seq_bytes == seq.to_bytes(8, "big")
        ts, events, rank = msgpack.unpackb(payload, raw=False)
        assert ts == line["ts"] and rank == line["data_parallel_rank"] == 0
        assert events == line["events"]
    frames_file = tmp_path / "frames.json"
    frames_file.write_text(json.dumps([[f[0].hex(), int.from_bytes(f[1], "big"), f[2].hex()]
                                       for f in got]))
    py = default_oracle_python()
    if not py.exists():
        pytest.skip(f"no vLLM here to decode with its own classes ({py})")
    out = subprocess.run([str(py), "-c", VLLM_DECODE, str(frames_file)], capture_output=True,
                         text=True, timeout=120)
    if out.returncode != 0 and "No module named" in out.stderr:
        pytest.skip("vLLM's package does not import here")
    assert out.returncode == 0, out.stderr[-2000:]
    kinds = json.loads(out.stdout)
    assert kinds == [[e["type"] for e in line["events"]] for line in want]


def test_endpoints_bind_or_connect_as_vllm_does():
    assert binds("tcp://*:5557") and binds("tcp://[::]:5557") and binds("ipc:///tmp/x")
    assert not binds("tcp://127.0.0.1:5557")


@pytest.mark.parametrize("args, where", [
    ({"endpoint": "udp://x:1"}, "--endpoint"),
    ({"replay_speed": -1.0}, "--replay-speed"),
])
def test_bad_serve_arguments_are_one_line(events_run, args, where):
    with pytest.raises(ServeError) as e:
        serve(events_run, **{"endpoint": "tcp://127.0.0.1:1", **args})
    assert where in str(e.value)


def test_a_folder_without_events_is_refused(tmp_path):
    with pytest.raises(ServeError, match="kv_events.jsonl"):
        serve(tmp_path, "tcp://127.0.0.1:1")
