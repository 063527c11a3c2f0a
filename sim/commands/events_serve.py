"""``sim events serve``: a run's KV events published over ZeroMQ as vLLM publishes them.

vLLM 0.33.0's ``ZmqEventPublisher`` (``vllm/distributed/kv_events.py``) sends each
step's ``KVEventBatch`` as a three-frame message on a PUB socket: the topic (UTF-8, ``""``
by default), the batch's sequence number as 8 big-endian bytes (0, 1, 2, ... over the
batches with events), and the batch as msgspec encodes it (``[ts, [events...], rank]``,
each event a map tagged ``"type"``: the payload ``sim/rundir/kv_events.py`` ``pack_batch`` writes,
byte for byte).  An endpoint holding ``*`` or ``::``, or an ``ipc://`` / ``inproc://`` one,
is bound; any other is connected to, as vLLM does.  So a real indexer (llm-d's, Dynamo's)
can be pointed at the simulator: run ``sim run --kv-events``, then serve the run folder.

``--replay-speed X`` paces the batches by their timestamps (the simulated step times), X
times as fast as simulated; 0 (the default) sends them at once.  ``--wait-s`` waits before
the first batch, as a subscriber connecting to a PUB socket misses what was sent before.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from sim.errors import InputError

JSONL = "kv_events.jsonl"


class ServeError(InputError):
    """Bad input to ``sim events serve``: one line."""


@dataclass
class Served:
    batches: int
    events: int
    endpoint: str
    topic: str

    def text(self) -> str:
        return (f"published {self.batches:,} batches ({self.events:,} events) on "
                f"{self.endpoint} topic {self.topic!r}")


def binds(endpoint: str) -> bool:
    """vLLM's rule: bind an endpoint with ``*`` or ``::`` or an ipc/inproc one, else
    connect."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def batches(path: Path):
    """The batches of a ``kv_events.jsonl`` (``seq``, ``ts``, events, rank), in order."""
    from sim.config.loader import open_input

    with open_input(path, ServeError, text=True) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError:
                raise ServeError(f"{path}:{n}: not a JSON line") from None
            if not isinstance(d, dict):
                raise ServeError(f"{path}:{n}: expected a JSON object")
            if "kv_events_header" in d or "kv_events_error" in d:
                continue
            if not isinstance(d.get("events"), list) or not isinstance(d.get("ts"), (int, float)):
                raise ServeError(f"{path}:{n}: not a KV event batch (needs ts and events)")
            yield d["ts"], d["events"], d.get("data_parallel_rank") or 0


def serve(source: Path, endpoint: str, replay_speed: float = 0.0, topic: str | None = None,
          wait_s: float = 0.5, hwm: int = 100_000) -> Served:
    """Publish the KV events of a run folder (its ``kv_events.jsonl``) or of a stream file
    on ``endpoint``."""
    try:
        import msgpack
        import zmq
    except ImportError as e:
        raise ServeError(f"sim events serve needs pyzmq and msgpack ({e.name} is not "
                         f"installed): pip install -e '.[events]'") from None
    from sim.rundir.kv_events import pack_batch

    source = Path(source)
    path = source / JSONL if source.is_dir() else source
    if not path.exists():
        raise ServeError(f"{source}: no {JSONL} (run sim run --kv-events)")
    if replay_speed < 0 or replay_speed != replay_speed:
        raise ServeError(f"--replay-speed: must be >= 0, got {replay_speed}")
    if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise ServeError(f"--endpoint: expected tcp://HOST:PORT (or ipc://, inproc://), got "
                         f"{endpoint!r}")
    if topic is None:
        topic = _header_topic(path)
    items = list(batches(path))
    packer = msgpack.Packer(use_bin_type=True)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.LINGER, 2000)
    try:
        try:
            (sock.bind if binds(endpoint) else sock.connect)(endpoint)
        except zmq.ZMQError as e:
            raise ServeError(f"--endpoint {endpoint}: {e}") from None
        if wait_s > 0:
            time.sleep(wait_s)
        t0 = time.monotonic()
        ts0 = items[0][0] if items else 0.0
        events = 0
        for seq, (ts, recs, rank) in enumerate(items):
            if replay_speed > 0:
                due = t0 + (ts - ts0) / replay_speed
                left = due - time.monotonic()
                if left > 0:
                    time.sleep(left)
            sock.send_multipart([topic.encode("utf-8"), seq.to_bytes(8, "big"),
                                 pack_batch(packer, ts, recs, rank)])
            events += len(recs)
    finally:
        sock.close()
        ctx.term()
    return Served(len(items), events, endpoint, topic)


def _header_topic(path: Path) -> str:
    """The topic the run's stream was written for (its header), else vLLM's ``""``."""
    from sim.config.loader import open_input

    try:
        with open_input(path, ServeError, text=True) as f:
            first = json.loads(f.readline() or "{}")
        return str(first.get("kv_events_header", {}).get("topic", "") or "")
    except (OSError, ValueError, AttributeError, InputError):
        return ""
